"""torch <-> JAX dtype mapping; the one place both type systems meet."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

TORCH_TO_JAX: dict[torch.dtype, jnp.dtype] = {
    torch.bool: jnp.dtype(jnp.bool_),
    torch.uint8: jnp.dtype(jnp.uint8),
    torch.int8: jnp.dtype(jnp.int8),
    torch.int16: jnp.dtype(jnp.int16),
    torch.int32: jnp.dtype(jnp.int32),
    torch.int64: jnp.dtype(jnp.int64),
    torch.uint16: jnp.dtype(jnp.uint16),
    torch.uint32: jnp.dtype(jnp.uint32),
    torch.uint64: jnp.dtype(jnp.uint64),
    torch.float16: jnp.dtype(jnp.float16),
    torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.float32: jnp.dtype(jnp.float32),
    torch.float64: jnp.dtype(jnp.float64),
    torch.complex64: jnp.dtype(jnp.complex64),
    torch.complex128: jnp.dtype(jnp.complex128),
    torch.float8_e4m3fn: jnp.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: jnp.dtype(ml_dtypes.float8_e5m2),
}
JAX_TO_TORCH: dict[jnp.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX.items()}
# the half-precision floats, which kernels widen to float32 for computing (as CPU's)
HALF_FLOATS = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def opmath_float(dtype) -> jnp.dtype:
    """The floating dtype CPU's kernels compute a floating dtype in: float64 for
    float64, float32 for float32 and the half types."""
    return jnp.dtype(jnp.float64) if jnp.dtype(dtype) == jnp.float64 else jnp.dtype(jnp.float32)


def accumulate_float(dtype) -> jnp.dtype:
    """CPU's accumulation type of a floating dtype (ATen's acc_type on CPU): float64 for
    float32 and float64, float32 for the half types. Kernels such as Cephes' zeta
    compute in it, so their float32 results are float64 ones rounded."""
    return jnp.dtype(jnp.float32) if jnp.dtype(dtype) in HALF_FLOATS else jnp.dtype(jnp.float64)


def widen_half(x):
    """A half-precision array widened to float32 for computing (CPU's opmath type);
    any other array, or None, as it is."""
    return x.astype(jnp.float32) if x is not None and x.dtype in HALF_FLOATS else x


def rounded_to(x, dtype):
    """float32 x rounded to the half type dtype, kept in float32: where CPU's kernel
    rounds between two ops. reduce_precision, since XLA may drop a convert pair's
    rounding (or fuse the ops); float16's subnormals, which it flushes, go to their
    spacing apart."""
    info = jnp.finfo(dtype)
    rounded = jax.lax.reduce_precision(x, info.nexp, info.nmant)
    if dtype != jnp.float16:
        return rounded  # (bfloat16's subnormals are float32's, flushed by XLA anyway)
    step = float(info.smallest_subnormal)
    return jnp.where(jnp.abs(x) < info.smallest_normal, jnp.round(x / step) * step, rounded)


# numpy has no bfloat16/float8: torch.from_numpy cannot take those, so host
# copies travel as same-width integers and are reinterpreted on each side.
_HOST_CARRIER: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16,
    torch.float8_e4m3fn: torch.uint8,
    torch.float8_e5m2: torch.uint8,
}


def to_jax(dtype: torch.dtype) -> jnp.dtype:
    """The JAX dtype for a torch dtype; TypeError names the dtype we cannot hold."""
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"tpu tensors do not support dtype {dtype}") from None


def to_torch(dtype) -> torch.dtype:
    return JAX_TO_TORCH[jnp.dtype(dtype)]


def numpy_from_cpu(t: torch.Tensor) -> np.ndarray:
    """A numpy copy of a CPU tensor's data, C-contiguous, bfloat16 and float8 included.
    Never a view: `.numpy()` marks the storage it views as not resizable (a CPU tensor
    once copied to tpu could no longer be resized), and XLA:CPU may wrap the buffer it
    is given, which a later in-place change of the CPU tensor must not reach."""
    to_jax(t.dtype)  # (a dtype we cannot hold is named, not left to numpy's error)
    t = t.detach().resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)
    carrier = _HOST_CARRIER.get(t.dtype)
    if carrier is None:
        return t.numpy()
    return t.view(carrier).numpy().view(TORCH_TO_JAX[t.dtype])


def cpu_from_numpy(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor holding numpy data of the given torch dtype."""
    carrier = _HOST_CARRIER.get(dtype)
    if not (a.flags.c_contiguous and a.flags.writeable):
        a = np.array(a, order="C", copy=True)  # (np.ascontiguousarray would make 0-d arrays 1-d)
    if carrier is None:
        return torch.from_numpy(a.astype(TORCH_TO_JAX[dtype], copy=False))
    return torch.from_numpy(a.view(TORCH_TO_JAX[carrier])).view(dtype)


def is_integer(dtype: torch.dtype) -> bool:
    """An integer dtype (bool is not one: PyTorch's integer-only kernels refuse it)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def fits_int64(value: int) -> bool:
    """Whether a Python int goes to an executable as an int64 (JAX refuses the rest)."""
    return -(1 << 63) <= value < 1 << 63
