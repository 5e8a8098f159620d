"""Polynomials by Horner's rule, for the special functions' series and expansions."""

from __future__ import annotations

import jax.numpy as jnp


def horner(coefficients, t):
    """sum(coefficients[k] * t**k). The coefficients enter as Python floats, which JAX
    rounds to t's dtype (a numpy float64 coefficient would widen a float32 t)."""
    out = jnp.full_like(t, float(coefficients[-1]))
    for c in reversed(coefficients[:-1]):
        out = out * t + float(c)
    return out
