"""Functional collectives for compiled graphs, on JAX values.

A collective across processes cannot sit inside one process's jitted
program (each process compiles its own; the cross-process program is the
mesh program in `programs.py`). A compiled graph that contains
`_c10d_functional` ops is therefore run as segments split at those ops; between
segments the graph runtime calls `run_functional` with the concrete JAX arrays
of the op's tensor arguments and gets the results as JAX arrays.
"""

from __future__ import annotations

import jax
import torch

from ..dtypes import to_torch
from ..engine import executor
from . import functional
from .tensors import wrap


def run_functional(name: str, *args):
    """Run `torch.ops._c10d_functional.<name>` (e.g. "all_reduce", "all_gather_into_tensor",
    "reduce_scatter_tensor", "all_to_all_single", "broadcast") on JAX arrays (and its
    non-tensor arguments as given), waiting for it; returns a JAX array or a list."""
    kernel = functional.KERNELS[name]
    result = kernel(*[_tensor(a) for a in args])
    if isinstance(result, (list, tuple)):
        return [_value(t) for t in result]
    return _value(result)


def _tensor(value):
    if isinstance(value, jax.Array):
        return wrap(value.shape, to_torch(value.dtype), value.reshape(-1))
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], jax.Array):
        return [_tensor(v) for v in value]
    return value


def _value(t: torch.Tensor) -> jax.Array:
    functional.wait_tensor(t)
    return executor.device_value(t, "compiled collective")
