"""Lowerings: GradScaler's two kernels (unscale with an inf/NaN check, scale update).

Both mutate their arguments: the in-place overloads name the mutated tensors in
`writes`; their functional twins (what torch.compile's functionalization
emits) return the same values as fresh outputs. The arithmetic follows
PyTorch's CPU kernels: gradients are unscaled in float32 (float64 stays
float64) and rounded back, `found_inf` becomes 1.0 only when some element is
inf or NaN, and the scale update multiplies in double before rounding to
float32, growing only when the grown scale is finite.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..dtypes import opmath_float
from .registry import lower


def _check(condition: bool, message: str) -> None:
    """The checks of PyTorch's CPU kernels, with their messages (shapes and dtypes
    are static, so they fail while the program is built, before anything runs)."""
    if not condition:
        raise RuntimeError(message)


def _check_scalar(x, name: str, dtype, kind: str) -> None:
    _check(x.size == 1, f"{name} must be a 1-element tensor.")
    _check(x.dtype == dtype, f"{name} must be {kind} tensor.")


def _unscale(grads, found_inf, inv_scale):
    _check_scalar(found_inf, "found_inf", jnp.float32, "a float")
    _check_scalar(inv_scale, "inv_scale", jnp.float32, "a float")
    nonfinite = jnp.zeros((), bool)
    unscaled = []
    for g in grads:
        nonfinite = nonfinite | ~jnp.all(jnp.isfinite(g))
        compute = opmath_float(g.dtype)
        unscaled.append((g.astype(compute) * inv_scale.reshape(()).astype(compute)).astype(g.dtype))
    return unscaled, jnp.where(nonfinite, jnp.ones_like(found_inf), found_inf)


lower("_amp_foreach_non_finite_check_and_unscale.default")(_unscale)
lower("_amp_foreach_non_finite_check_and_unscale_.default", writes=("self", "found_inf"))(
    _unscale
)


def _update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor, interval):
    _check_scalar(scale, "current_scale", jnp.float32, "a float")
    _check_scalar(growth_tracker, "growth_tracker", jnp.int32, "an int")
    _check_scalar(found_inf, "found_inf", jnp.float32, "a float")
    wide = scale.astype(jnp.float64)
    backed_off = (wide * backoff_factor).astype(jnp.float32)
    grown = (wide * growth_factor).astype(jnp.float32)
    successful = growth_tracker + 1
    grow_now = successful == interval
    overflow = found_inf != 0
    new_scale = jnp.where(
        overflow, backed_off, jnp.where(grow_now & jnp.isfinite(grown), grown, scale)
    )
    new_tracker = jnp.where(overflow | grow_now, jnp.zeros_like(growth_tracker), successful)
    return new_scale, new_tracker


lower("_amp_update_scale.default")(_update_scale)
lower("_amp_update_scale_.default", writes=("growth_tracker",))(_update_scale)
