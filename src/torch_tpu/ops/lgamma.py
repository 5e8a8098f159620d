"""lgamma in float32 to a few units in the last place, as CPU's libm gives it.

XLA's float32 lgamma (a Lanczos sum) was up to about 40 ulp off for x in (3, 40], gave
4.8e-7 for lgamma(1) and lgamma(2) (exactly 0: log-likelihoods of counts use
lgamma(k + 1) at k = 0 and 1), and was 1e-6..4e-6 off relative to max(1, |lgamma|)
elsewhere, against CPU's 6e-8. Here each range has its own expansion:

- around 1 and 2, the Taylor series of lgamma(1 + z) and lgamma(2 + z), whose
  coefficients are zeta values: exact zeros at 1 and 2, and the relative accuracy of
  a sum scaled by z near them;
- below 0.75, lgamma(x + 1) - log(x); from 3 to 8, log of the product of the
  recurrence's factors plus the series at 2 + z;
- from 8 up, Stirling's series with four of its correction terms;
- below 0, the reflection lgamma(x) = log(pi / |x sin(pi x)|) - lgamma(-x), with
  sin(pi x) taken of x's distance to the nearest integer (exact in float32).

float16 and bfloat16 are computed in float32 and rounded, as CPU's kernels do; float64
keeps XLA's lgamma (about 1e-15 relative).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax
from scipy.special import zeta

from .. import dtypes
from .series import horner

_EULER = 0.57721566490153286061
# lgamma(1 + z) = -EULER z + sum_k>=2 (-1)^k zeta(k)/k z^k   (|z| < 1; used for |z| <= 1/4)
_AT_ONE = [-_EULER] + [(-1) ** k * zeta(k) / k for k in range(2, 20)]
# lgamma(2 + z) = (1 - EULER) z + sum_k>=2 (-1)^k (zeta(k) - 1)/k z^k   (|z| < 2; used for
# -3/4 <= z <= 1)
_AT_TWO = [1 - _EULER] + [(-1) ** k * (zeta(k) - 1) / k for k in range(2, 34)]
# Stirling: 1/(12 x) - 1/(360 x^3) + 1/(1260 x^5) - 1/(1680 x^7), in powers of 1/x^2
_STIRLING = [1 / 12, -1 / 360, 1 / 1260, -1 / 1680]
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
_STIRLING_FROM = 8.0
# where CPU's float lgamma (glibc's lgammaf) returns inf: from this float up, although
# lgamma stays below float32's largest value up to about 4.08e36
_CPU_OVERFLOW = 4.0371103e36


def lgamma(x):
    if x.dtype == jnp.float64:
        return lax.lgamma(x)
    return _lgamma32(dtypes.widen_half(x)).astype(x.dtype)  # (half types: rounded once)


def _lgamma32(x):
    positive = _positive(jnp.where(x > 0, x, -x))
    r = x - jnp.round(x)  # x's distance to the nearest integer, exact
    sin_pi = jnp.sin(jnp.float32(math.pi) * jnp.abs(r))
    reflected = jnp.float32(math.log(math.pi)) - jnp.log(jnp.abs(x)) - jnp.log(sin_pi) - positive
    value = jnp.where(x > 0, positive, reflected)
    value = jnp.where((x <= 0) & (r == 0), jnp.inf, value)  # the poles: 0, -1, -2, ...
    return jnp.where(jnp.isinf(x), jnp.inf, value)


def _positive(y):
    """lgamma(y) for y > 0 (any value for y <= 0: the caller's `where` drops it)."""
    y = jnp.where(y > 0, y, 1.0)
    small = y < 0.75
    # below 0.75: lgamma(y + 1) - log(y); y + 1 lands in [1, 1.75)
    w = jnp.where(small, y + 1, y)
    near_one = w <= 1.25
    # 3 to 8: lgamma(w) = log((w - 1)(w - 2)...(w - n)) + lgamma(w - n), w - n in [2, 3)
    steps = jnp.where(w >= 3, jnp.floor(w - 2), 0)
    product = jnp.ones_like(w)
    for k in range(1, 6):  # (w < 8: at most 5 factors)
        product = product * jnp.where(steps >= k, w - k, 1)
    z2 = w - steps - 2
    z1 = w - 1
    series = jnp.where(near_one, z1 * horner(_AT_ONE, z1), z2 * horner(_AT_TWO, z2))
    core = series + jnp.log(product)
    core = jnp.where(small, core - jnp.log(y), core)
    large = jnp.where(y >= _CPU_OVERFLOW, jnp.inf, _stirling(y))
    return jnp.where(y >= _STIRLING_FROM, large, core)


def _stirling(y):
    y = jnp.where(y >= _STIRLING_FROM, y, _STIRLING_FROM)
    inverse = 1 / y
    correction = inverse * horner(_STIRLING, inverse * inverse)
    log_y = jnp.log(y)
    # ((y - 0.5) log y - y, grouped so that it is finite up to _CPU_OVERFLOW)
    return y * (log_y - 1) - 0.5 * log_y + jnp.float32(_HALF_LOG_2PI) + correction


def lgamma1p(z):
    """lgamma(1 + z) without the rounding of 1 + z: the series at 1 for |z| <= 0.1 (in
    float64 too: its first dropped term is below 1e-21 there)."""
    near = jnp.abs(z) <= 0.1
    zs = jnp.where(near, z, 0)
    return jnp.where(near, zs * horner(_AT_ONE, zs), lgamma(1 + z))
