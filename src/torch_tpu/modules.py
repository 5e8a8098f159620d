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
the wrapper only compares each module's parameter dict before and after.
"""

from __future__ import annotations

import threading

import torch
from torch.nn import Module, Parameter

_original_apply = Module._apply
_state = threading.local()  # the conversion in progress: depth and old -> new Parameter


def _apply(self: Module, fn, recurse: bool = True) -> Module:
    if not isinstance(self._parameters, dict):  # a ScriptModule's view of C++ parameters
        return _original_apply(self, fn, recurse)
    before = dict(self._parameters)
    depth = getattr(_state, "depth", 0)
    if depth == 0:
        _state.replaced = {}
    _state.depth = depth + 1
    try:
        result = _original_apply(self, fn, recurse)
        replaced = [(k, old) for k, old in before.items() if self._parameters.get(k) is not old]
        if replaced:
            _restore(self, replaced, _state.replaced)
    finally:
        _state.depth = depth
        if depth == 0:
            _state.replaced = None
    return result


def _restore(module: Module, replaced, memo: dict) -> None:
    """Put back, in each replaced slot, the Parameter that was there (or what it became)."""
    for key, old in replaced:
        new = module._parameters.get(key)
        if old is None or new is None:
            continue
        entry = memo.get(id(old))
        if entry is None:
            if not _crosses_to_or_from_tpu(old, new):
                continue
            entry = memo[id(old)] = (old, old if _adopt(old, new) else new)
        module._parameters[key] = entry[1]


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


def _adopt(old: Parameter, new: Parameter) -> bool:
    """Make `old` hold `new`'s tensor (data, grad, requires_grad) keeping its identity.

    Something in C++ may still hold old's tensor: a graph built before the
    move (saved tensors, the gradient accumulator). That graph keeps the old
    tensor, as its values were when it ran; its accumulator is made to raise
    on backward rather than put a gradient where no one would see it. Refused
    (False) only for a non-leaf, which a module's Parameter never is.
    """
    if not old.is_leaf:
        return False
    count = old._use_count()
    if count > 1:
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
    return True


def _stale_graph(grad_outputs):
    raise RuntimeError(
        "backward() reached a parameter through a graph built before its module was "
        "moved between cpu and tpu (.to()/.cpu()/.tpu()); run forward again after moving it"
    )


def install() -> None:
    """Wrap Module._apply (once); cheap: imports nothing."""
    if Module._apply is not _apply:
        Module._apply = _apply
