"""PyTorch's own nn modules (`module_db`, the ModuleInfo database of its test suite) on
tpu against CPU: each module built once on the CPU, copied to tpu, run on the same
inputs in train and eval mode; outputs, input gradients and parameter gradients must
match CPU's. Code we did not write, with inputs we did not choose: it found a NaN
gradient where CPU's is 0 (cross-entropy over a batch whose targets are all ignored).

CI runs float64 in strict mode on each module's first CI_INPUTS inputs per training
mode (float64 keeps rounding out of the comparison, so a tolerance of 1e-7 still fails
any real difference); `-m slow` adds every input, float32, and fused mode
(`python -m pytest tests/test_module_db.py -m slow`).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing._internal.common_modules import module_db
from torch.testing._internal.common_utils import freeze_rng_state

from torch_tpu.engine.arguments import tensors

CI_INPUTS = 3
# Modules whose outputs are random draws (tpu's stream is not CPU's: docs/differences.md)
_RANDOM = ("Dropout", "RReLU", "FractionalMaxPool")
_MODULES = [info for info in module_db if not any(r in info.name for r in _RANDOM)]
_TOLERANCE = {
    torch.float64: {"rtol": 1e-7, "atol": 1e-9},
    torch.float32: {"rtol": 1e-4, "atol": 1e-4},  # (float32 sums over a few terms)
}


def _to(obj, device: str):
    if isinstance(obj, torch.Tensor):
        out = obj.detach().to(device)
        return out.requires_grad_(obj.requires_grad) if out.is_floating_point() else out
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def _check_module_input(info, module_input, dtype, training: bool) -> None:
    with freeze_rng_state():
        args, kwargs = module_input.constructor_input.args, module_input.constructor_input.kwargs
        cpu_module = info.module_cls(*args, **kwargs).to(dtype)
    cpu_module.train(training)
    args, kwargs = module_input.forward_input.args, module_input.forward_input.kwargs
    cpu_args, cpu_kwargs = _to(args, "cpu"), _to(kwargs, "cpu")
    if isinstance(cpu_module, torch.nn.modules.lazy.LazyModuleMixin):  # (random init)
        with torch.no_grad():
            cpu_module.initialize_parameters(*cpu_args, **cpu_kwargs)
    tpu_module = copy.deepcopy(cpu_module).to("tpu")
    tpu_args, tpu_kwargs = _to(args, "tpu"), _to(kwargs, "tpu")
    cpu_out = list(tensors(cpu_module(*cpu_args, **cpu_kwargs)))
    tpu_out = list(tensors(tpu_module(*tpu_args, **tpu_kwargs)))
    tolerance = _TOLERANCE[dtype]
    assert len(tpu_out) == len(cpu_out)
    for c, t in zip(cpu_out, tpu_out):
        assert t.device.type == "tpu"
        torch.testing.assert_close(t.cpu(), c, equal_nan=True, **tolerance)
    pairs = [(c, t) for c, t in zip(cpu_out, tpu_out) if c.requires_grad]
    if not pairs:
        return
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(c.shape, dtype=c.dtype, generator=g) for c, _ in pairs]
    torch.autograd.backward([c for c, _ in pairs], grads)
    torch.autograd.backward([t for _, t in pairs], [x.to("tpu") for x in grads])
    leaves = list(zip(tensors(cpu_args), tensors(tpu_args)))
    leaves += list(zip(cpu_module.parameters(), tpu_module.parameters()))
    for c, t in leaves:
        assert (c.grad is None) == (t.grad is None)
        if c.grad is not None:
            torch.testing.assert_close(t.grad.cpu(), c.grad, equal_nan=True, **tolerance)


# (dtype, eager mode, inputs per module and training mode; None: all), CI's cell first
_CELLS = [(torch.float64, "strict", CI_INPUTS), (torch.float64, "strict", None),
          (torch.float32, "strict", None), (torch.float64, "fused", None)]  # fmt: skip


def _params():
    for info in _MODULES:
        for k, (dtype, mode, limit) in enumerate(_CELLS):
            marks = () if k == 0 else (pytest.mark.slow,)  # reason: the full module run
            name = f"{info.name}|{str(dtype)[6:]}|{mode}|{limit or 'all'}"
            yield pytest.param(info, dtype, mode, limit, id=name, marks=marks)


@pytest.mark.parametrize(("info", "dtype", "mode", "limit"), list(_params()))
def test_module_matches_cpu(info, dtype, mode, limit):
    """The module's inputs in train and eval mode (the first `limit` of each)."""
    with torch.tpu.set_eager_mode(mode):
        for training in (True, False):
            inputs = info.module_inputs_func(
                info, device="cpu", dtype=dtype, requires_grad=True, training=training
            )
            inputs = [i for i in inputs if i.forward_input is not None][:limit]
            for k, module_input in enumerate(inputs):
                try:
                    _check_module_input(info, module_input, dtype, training)
                except AssertionError as e:
                    raise AssertionError(f"input #{k}, training={training}: {e}") from None
