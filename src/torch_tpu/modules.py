"""Module conversions between cpu and tpu keep each Parameter object, as on CUDA.

`Module._apply` (behind `.to`, `.cpu`, `.tpu`, `.half`, ...) changes a
parameter in place with `param.data = converted` when PyTorch deems the two
tensors "shallow-copy compatible"; cpu and cuda are, cpu and tpu are not
(PrivateUse1 is outside TensorImpl's dense-backend set, a C++ constant), so
for tpu it builds a new Parameter per module slot. That silently unties tied
weights (an LM head sharing the embedding gets its own copy) and strands
whatever held the old object: an optimizer built before `.to()`, attributes
frameworks set on the Parameter, hooks registered on it.

`install()` wraps `Module._apply`. After each module's own `_apply`, every
slot whose Parameter was replaced on a cpu<->tpu crossing gets its old
Parameter object back, now holding the converted tensor (the two objects'
TensorImpls are swapped, as `torch.utils.swap_tensors` does, but the old
object keeps its class, `__dict__` and hooks). A later slot sharing that
Parameter then finds it already converted and PyTorch's own in-place path
keeps the tie. Other replacements (to/from meta, sparse, the
`overwrite_module_params_on_conversion` flag) are PyTorch's behaviour on
CUDA too and are left alone. For a CPU-only module nothing is replaced, so
the wrapper only compares each module's parameters before and after.
"""

from __future__ import annotations

import torch
from torch.nn import Module, Parameter

_original_apply = Module._apply


def _apply(self: Module, fn, recurse: bool = True) -> Module:
    params = self._parameters
    if not params or not isinstance(params, dict):  # not a dict: a ScriptModule's view
        return _original_apply(self, fn, recurse)
    before = list(params.items())
    result = _original_apply(self, fn, recurse)
    moved = []
    for key, old in before:
        new = params.get(key)
        if new is not old and old is not None and new is not None:
            moved.append((key, old, new))
    if moved:
        _restore(params, moved)
    return result


def _restore(params: dict, moved) -> None:
    """Put back, in each slot replaced by a cpu<->tpu move, the Parameter that was there."""
    adopted = set()  # one Parameter in two slots of this module was converted twice
    for key, old, new in moved:
        if id(old) in adopted or _crosses_to_or_from_tpu(old, new):
            if id(old) not in adopted:
                _adopt(old, new)
                adopted.add(id(old))
            params[key] = old


def _crosses_to_or_from_tpu(old: torch.Tensor, new: torch.Tensor) -> bool:
    """True where CUDA would have converted in place: a dense cpu<->tpu move, flag unset."""
    if torch.__future__.get_overwrite_module_params_on_conversion():
        return False
    if {old.device.type, new.device.type} != {"cpu", "tpu"}:
        return False
    return (
        old.layout == torch.strided
        and new.layout == torch.strided
        and not old.is_quantized
        and type(new) is Parameter
    )


def _adopt(old: Parameter, new: Parameter) -> None:
    """Make `old` hold `new`'s tensor (data, grad, requires_grad) keeping its identity.

    Something in C++ may still hold old's tensor: a graph built before the
    move (saved tensors, the gradient accumulator). That graph keeps the old
    tensor, as its values were when it ran; its accumulator is made to raise
    on backward rather than put a gradient where no one would see it.
    """
    count = old._use_count()
    if count > 1 and old.requires_grad:
        accumulator = torch.autograd.graph.get_gradient_edge(old).node
        if old._use_count() == count:  # it existed: a graph still feeds it
            accumulator.register_prehook(_stale_graph)
    torch._C._swap_tensor_impl(old, new)
    # tensor hooks live on the TensorImpl's autograd metadata; setting the
    # Python-side dicts again registers them on the tensor old now holds
    if old._backward_hooks is not None:
        old._backward_hooks = old._backward_hooks
    if old._post_accumulate_grad_hooks is not None:
        old._post_accumulate_grad_hooks = old._post_accumulate_grad_hooks


def _stale_graph(grad_outputs):
    raise RuntimeError(
        "backward() reached a parameter through a graph built before its module was "
        "moved between cpu and tpu (.to()/.cpu()/.tpu()); run forward again after moving it"
    )


def install() -> None:
    """Wrap Module._apply (once); cheap: imports nothing."""
    if Module._apply is not _apply:
        Module._apply = _apply
