"""`torch.set_float32_matmul_precision`, honoured by matmul and convolution lowerings,
and `torch.set_default_dtype`, which decides the float dtype integer operands promote to.

PyTorch's setting says how exactly float32 matrix products must be computed:
"highest" (the default: full float32), "high" (TensorFloat-32 on a GPU) or
"medium" (bfloat16). XLA's equivalents are the dot and convolution precisions
HIGHEST (six bfloat16 passes on a TPU), HIGH (three) and DEFAULT (one). XLA:CPU
computes float32 products exactly whatever the precision, so the setting changes
speed and rounding only on a TPU (or a GPU).

Lowerings read the precision when they are traced, so it is part of every program's
text, hence of its cache key; the in-memory tables that map an op or a graph to an
executable are forgotten when the setting changes (`sync`, called before every op
and compiled-graph call), so no program traced under one setting runs under another.
The default dtype is followed the same way: an op's output dtype (PyTorch's meta
kernel, `int_tensor / int_tensor` is the default dtype) is worked out at its first
call, and its compute dtype when it is traced.
"""

from __future__ import annotations

import torch
from jax import lax

from . import cache

_PRECISIONS = {
    "highest": lax.Precision.HIGHEST,
    "high": lax.Precision.HIGH,
    "medium": lax.Precision.DEFAULT,
}
_NEW_API = {"ieee": "highest", "tf32": "high", "bf16": "medium"}  # fp32_precision values
_current = "highest"
_default_dtype = torch.get_default_dtype()


def _setting() -> str:
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        # Set through both the legacy API and the new `fp32_precision` one (say
        # set_float32_matmul_precision("high"), then allow_tf32 = False), PyTorch
        # refuses to answer; the new API's value then decides.
        for value in (torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision):
            if value in _NEW_API:
                return _NEW_API[value]
        return "highest"


def sync() -> None:
    """Follow a change of PyTorch's float32 matmul precision or default dtype."""
    global _current, _default_dtype
    setting = _setting()
    default_dtype = torch.get_default_dtype()
    if setting != _current or default_dtype is not _default_dtype:
        _current, _default_dtype = setting, default_dtype
        cache.forget_lookups()


def matmul() -> lax.Precision:
    """The XLA precision of matrix products and convolutions traced now."""
    return _PRECISIONS.get(_current, lax.Precision.HIGHEST)
