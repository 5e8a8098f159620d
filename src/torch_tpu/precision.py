"""`torch.set_float32_matmul_precision`, honoured by matmul and convolution lowerings.

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
_current = "highest"


def sync() -> None:
    """Follow a change of torch.get_float32_matmul_precision()."""
    global _current
    setting = torch.get_float32_matmul_precision()
    if setting != _current:
        _current = setting
        cache.forget_lookups()


def matmul() -> lax.Precision:
    """The XLA precision of matrix products and convolutions traced now."""
    return _PRECISIONS.get(_current, lax.Precision.HIGHEST)
