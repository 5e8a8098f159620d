"""Weight normalisation's fused interface (`nn.utils.parametrizations.weight_norm`).

PyTorch decomposes the forward for us, but its backward op has no decomposition,
so it fell back to the CPU (wav2vec2's positional convolution). Both are lowered
here from one forward function; the backward is its vector-Jacobian product.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import dtypes
from .registry import lower

_HALF = dtypes.HALF_FLOATS


def _norm_axes(v, dim: int) -> tuple[int, ...]:
    """Norms are taken over every axis but `dim` (-1: over all, as PyTorch's kernel)."""
    if dim == -1:
        return tuple(range(v.ndim))
    return tuple(i for i in range(v.ndim) if i != dim)


def _forward(v, g, dim: int):
    acc = jnp.float32 if v.dtype in _HALF else v.dtype
    norms = jnp.sqrt(jnp.sum(jnp.square(v.astype(acc)), axis=_norm_axes(v, dim), keepdims=True))
    w = v.astype(acc) * (g.astype(acc) / norms)
    return w, norms.reshape(g.shape)


@lower("_weight_norm_interface.default")
def weight_norm_interface(v, g, dim=0):
    return _forward(v, g, dim)


@lower("_weight_norm_interface_backward.default")
def weight_norm_interface_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    _, pull = jax.vjp(lambda v, g: _forward(v, g, dim)[0], saved_v, saved_g)
    acc = jnp.float32 if saved_v.dtype in _HALF else saved_v.dtype
    return pull(grad_w.astype(acc))
