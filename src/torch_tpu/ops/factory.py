"""Factories: tensors made from sizes and scalars."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .. import dtypes
from .pointwise import check_fill_value
from .registry import lower


def _jdtype(dtype, default="float32"):
    import torch

    return dtypes.to_jax(dtype if dtype is not None else torch.get_default_dtype())


def _check_full(values: list) -> bool:
    dtype = values[2]
    if dtype is None and type(values[1]) is int:  # (an int fill makes an int64 tensor)
        dtype = torch.int64
    return dtype is not None and check_fill_value(values[1], dtype)


@lower("full.default", check=_check_full)
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value)


@lower("fill_.Scalar", check=lambda values: check_fill_value(values[1], values[0].dtype))
def fill_scalar(self, value):
    return jnp.full(self.shape, value, self.dtype)


@lower("fill_.Tensor")
def fill_tensor(self, value):
    from .pointwise import convert

    return jnp.broadcast_to(convert(value, self.dtype), self.shape)


@lower("_efficientzerotensor.default")
def efficient_zero_tensor(size, dtype=None, layout=None, device=None, pin_memory=None):
    """torch.func's zero tangents and cotangents (jvp, jacrev): materialized zeros, the
    values CPU's storage-less ZeroTensor stands for."""
    return jnp.zeros(tuple(size), _jdtype(dtype))


@lower("zero_.default")
def zero_(self):
    return jnp.zeros_like(self)


def _is_integral(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer) or dtype == jnp.bool_


@lower("arange.start_out", static_scalars=True)
def arange(start, end, step=1, out=None):
    """start + i * step, in int64 for integer results (bounds truncated, as PyTorch
    does) and in float64 otherwise, then cast."""
    n = out.size
    if _is_integral(out.dtype):
        ramp = int(start) + int(step) * jnp.arange(n, dtype=jnp.int64)
    else:
        ramp = start + step * jnp.arange(n, dtype=jnp.float64)
    return ramp.reshape(out.shape)  # (an out= of the right count keeps its shape)


def _divide_exactly(numerator, divisor, dtype):
    """numerator / divisor as CPU divides: XLA turns a division by a constant into a
    product with its reciprocal (linspace(0, 999999, 10**6) of int64 gave i - 1 for
    half the values); the barrier keeps the divisor opaque."""
    return numerator / lax.optimization_barrier(jnp.asarray(divisor, dtype))


def _symmetric_ramp(start, end, steps: int, dtype):
    """PyTorch's linspace: the first half counts up from start, the second half
    down from end, so both endpoints are exact."""
    if _is_integral(dtype):
        start, end, dtype = jnp.trunc(start), jnp.trunc(end), jnp.float64
    start, end = jnp.asarray(start, dtype), jnp.asarray(end, dtype)
    if steps == 1:
        return jnp.reshape(start, (1,))
    step = _divide_exactly(end - start, steps - 1, dtype)
    i = jnp.arange(steps)
    return jnp.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))


@lower("linspace.out")
def linspace(start, end, steps, out=None):
    return _symmetric_ramp(start, end, steps, out.dtype).reshape(out.shape)


def _integral_exponents(start, end, steps: int, dtype) -> np.ndarray:
    """PyTorch's exponents for an integer logspace, in IEEE double on the host: XLA
    fuses `end - step * k` into one FMA, and 10 ** -4e-17 truncates to 0, not 1.
    One step uses start as it is; more first convert the bounds to the result's dtype
    as CPU does (truncated, and wrapped: -2 is 254 for uint8)."""
    if steps == 1:
        return np.array([float(start)])
    start, end = (float(np.array(math.trunc(v)).astype(dtype)) for v in (start, end))
    step = (end - start) / (steps - 1)
    i = np.arange(steps)
    return np.where(i < steps // 2, start + step * i, end - step * (steps - 1 - i))


@lower("logspace.out", static_scalars=True)
def logspace(start, end, steps, base=10.0, out=None):
    """Bounds are compile-time constants: the exponents of integer results are
    computed on the host (see _integral_exponents)."""
    if _is_integral(out.dtype):
        exponents = _integral_exponents(start, end, steps, out.dtype)
        return jnp.asarray(np.power(float(base), exponents)).reshape(out.shape)
    exponent_dtype = jnp.complex128 if jnp.iscomplexobj(out) else jnp.float64
    return jnp.power(base, _symmetric_ramp(start, end, steps, exponent_dtype)).reshape(out.shape)


@lower("eye.out")
def eye(n, out=None):
    return jnp.eye(n, dtype=out.dtype)


@lower("eye.m_out")
def eye_m(n, m, out=None):
    return jnp.eye(n, m, dtype=out.dtype)


def _triangle_indices(row, col, offset, lower_triangle):
    keep = np.tri(row, col, offset, dtype=bool)
    rows, cols = np.nonzero(keep if lower_triangle else ~np.tri(row, col, offset - 1, dtype=bool))
    return jnp.asarray(np.stack([rows, cols]))


@lower("kaiser_window.beta", static_scalars=True)
def kaiser_window(
    window_length, periodic=True, beta=12.0, dtype=None, layout=None, device=None, pin_memory=None
):
    """PyTorch's formula (its per-device kernel had no tpu entry: an internal assert),
    computed in the result's dtype (half floats in float32), as CPU does."""
    dtype = dtype or torch.get_default_dtype()
    compute = jnp.float32 if dtype in (torch.float16, torch.bfloat16) else dtypes.to_jax(dtype)
    if window_length == 1:
        return jnp.ones((1,), compute)
    n = window_length + 1 if periodic else window_length
    alpha = (n - 1) / 2.0
    ratio = _divide_exactly(jnp.arange(n, dtype=compute) - alpha, alpha, compute)
    beta = jnp.asarray(beta, compute)
    window = jax.scipy.special.i0(beta * jnp.sqrt(1 - ratio * ratio)) / jax.scipy.special.i0(beta)
    return window[: window_length] if periodic else window


@lower("kaiser_window.default")
def kaiser_window_default(window_length, dtype=None, layout=None, device=None, pin_memory=None):
    return kaiser_window(window_length, dtype=dtype)


@lower("kaiser_window.periodic")
def kaiser_window_periodic(
    window_length, periodic, dtype=None, layout=None, device=None, pin_memory=None
):
    return kaiser_window(window_length, periodic, dtype=dtype)


@lower("tril_indices.default")
def tril_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, offset, True)


@lower("triu_indices.default")
def triu_indices(row, col, offset=0, dtype=None, layout=None, device=None, pin_memory=None):
    return _triangle_indices(row, col, offset, False)

