"""The regularized incomplete gamma functions P(a, x) and Q(a, x) (igamma, igammac).

JAX's gammainc/gammaincc sum a series or a continued fraction whose length grows with
sqrt(a), and they drift as it grows: in float32, P(1e5, 1e5) came out 0.458 (CPU:
0.5004) and P(1e7, 1e7) 3521.8; in float64 P(1e8, 0.999e8) was 15% off and
Q(1e10, 1e10) 0.934 (0.49999867), and for a near 1e30 the call never returned. CPU
switches to an asymptotic expansion for large a (ATen's calc_igamma), so here, for
a >= `TEMME_FROM` of the dtype, Temme's uniform expansion in a (DLMF 8.12):

    P = erfc(-eta sqrt(a/2)) / 2 - R,  Q = erfc(eta sqrt(a/2)) / 2 + R,
    R = exp(-a eta^2 / 2) / sqrt(2 pi a) * (c0(eta) + c1(eta) / a),

with eta^2 / 2 = lam - 1 - log(lam), lam = x / a, eta of the sign of lam - 1. The next
term, c2(eta) / a^2, is below float32's rounding from a = 20 and float64's from
a = 1e5 (checked against mpmath in tests/test_incomplete_gamma.py). Below those, JAX's
functions, whose error there is about 1e-10 relative in float64 (1.9e-9 seen at a = 21),
except Q for x <= 1.1 and a up to about x, where CPU sums DLMF 8.7.3's series instead of
taking 1 - P (`_q_small_x`): JAX's 1 - P was 9% off in float32 there.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import jax.scipy.special as jss

from .lgamma import lgamma, lgamma1p
from .series import horner

# Taylor coefficients in eta of c0(eta) = 1/(lam - 1) - 1/eta and of
# c1(eta) = 1/eta^3 - 1/(lam - 1)^3 - 1/(lam - 1)^2 - 1/(12 (lam - 1)), worked out by
# reverting eta(lam)'s power series in exact rational arithmetic (c0's first terms
# are DLMF 8.12.9's -1/3, 1/12, -2/135, 1/864)
_C0 = (
    -0.3333333333333333, 0.08333333333333333, -0.014814814814814815,
    0.0011574074074074073, 0.0003527336860670194, -0.0001787551440329218,
    3.919263178522438e-05, -2.185448510679992e-06, -1.85406221071516e-06,
    8.296711340953087e-07, -1.7665952736826078e-07, 6.707853543401498e-09,
    1.0261809784240309e-08, -4.382036018453353e-09, 9.14769958223679e-10,
    -2.5514193994946248e-11, -5.830772132550426e-11, 2.4361948020667415e-11,
)  # fmt: skip
_C1 = (
    -0.001851851851851852, -0.003472222222222222, 0.0026455026455026454,
    -0.0009902263374485596, 0.00020576131687242798, -4.018775720164609e-07,
    -1.8098550334489977e-05, 7.64916091608111e-06, -1.6120900894563446e-06,
    4.647127802807434e-09, 1.378633446915721e-07, -5.752545603517705e-08,
    1.1951628599778148e-08, -1.7543241719747647e-11, -1.0091543710600413e-09,
    4.162792991842583e-10, -8.56390702649298e-11, 6.067215101604758e-14,
)  # fmt: skip
_SERIES_BELOW = 0.3  # |eta| (and |lam - 1|) under which the power series are used
_H_TERMS = 32  # terms of h(d) = 2 (d - log1p(d)) / d^2 for |d| < 0.3: 0.3^32 ~ 1e-17

# the smallest a, per dtype, from which the expansion replaces JAX's functions
TEMME_FROM = {jnp.dtype(jnp.float64): 1e5}
_TEMME_FROM_DEFAULT = 20.0


def regularized(a, x, upper: bool):
    """P(a, x) (upper=False) or Q(a, x), a and x positive and finite (the caller's
    special cases take the rest); JAX's functions for small a, Temme's expansion
    above. Half-precision inputs are computed in float32."""
    dtype = a.dtype
    if dtype.itemsize < 4:
        a, x = a.astype(jnp.float32), x.astype(jnp.float32)
    large = a >= TEMME_FROM.get(jnp.dtype(a.dtype), _TEMME_FROM_DEFAULT)
    # each branch gets harmless inputs where the other is taken: JAX's iterations run
    # until every element converges, and a huge a made that never
    small = (jss.gammaincc if upper else jss.gammainc)(
        jnp.where(large, 1, a), jnp.where(large, 1, x)
    )
    if upper:  # (Q for small a and x: JAX's 1 - P cancels)
        direct = _q_small_x_region(a, x) & ~large
        small = jnp.where(
            direct, _q_small_x(jnp.where(direct, a, 1), jnp.where(direct, x, 1)), small
        )
    big = _temme(jnp.where(large, a, 1e3), jnp.where(large, x, 1e3), upper)
    return jnp.where(large, big, small).astype(dtype)


def _q_small_x_region(a, x):
    """Where CPU (ATen's calc_igammac) computes Q by the series of DLMF 8.7.3 rather than
    as 1 - P: x <= 1.1 and a no larger than about x (for x <= 0.5: a <= -0.4 / log x)."""
    low = (x <= 0.5) & (a <= -0.4 / jnp.log(jnp.minimum(x, 0.5)))
    middle = (x > 0.5) & (x <= 1.1) & (a <= 1.1 * x)
    return low | middle


_Q_SERIES_TERMS = 25  # (-x)^n / n! for x <= 1.1: 1.1^25 / 25! ~ 1e-24


def _q_small_x(a, x):
    """Q(a, x) = -expm1(a log x - lgamma(1 + a)) - x^a / Gamma(a) * sum_n>=1 (-x)^n /
    (n! (a + n)): for small a, Q ~ 1 - x^a / Gamma(1 + a) with no 1 - P cancellation
    (in float32, Q(0.011, 0.987) was 4.8e-4 relative off: CPU 5e-5)."""
    term = jnp.ones_like(x)
    total = jnp.zeros_like(x)
    for n in range(1, _Q_SERIES_TERMS + 1):
        term = term * -x / n
        total = total + term / (a + n)
    log_x = jnp.log(x)
    head = -jnp.expm1(a * log_x - lgamma1p(a))
    return head - jnp.exp(a * log_x - lgamma(a)) * total


def _temme(a, x, upper: bool):
    d = (x - a) / a  # lam - 1, exact where x and a are close
    near = jnp.abs(d) < _SERIES_BELOW
    d_far = jnp.where(near, 1, d)
    d_near = jnp.where(near, d, 0)
    h = jnp.where(
        near,
        horner([2 * (-1) ** k / (k + 2) for k in range(_H_TERMS)], d_near),
        2 * (d_far - jnp.log1p(d_far)) / (d_far * d_far),
    )
    eta = d * jnp.sqrt(h)
    c0, c1 = _c0_c1(eta, d)
    z = eta * jnp.sqrt(a / 2)
    r = jnp.exp(-a * d * d * h / 2) / jnp.sqrt(2 * math.pi * a) * (c0 + c1 / a)
    if upper:
        return jss.erfc(z) / 2 + r
    return jss.erfc(-z) / 2 - r


def _c0_c1(eta, d):
    """c0(eta), c1(eta): their power series near eta = 0, where the closed forms cancel."""
    near = jnp.abs(eta) < _SERIES_BELOW
    e = jnp.where(near, 1, eta)
    m = jnp.where(near, 1, d)
    c0 = jnp.where(near, horner(_C0, eta), 1 / m - 1 / e)
    c1 = jnp.where(
        near, horner(_C1, eta), 1 / (e * e * e) - 1 / (m * m * m) - 1 / (m * m) - 1 / (12 * m)
    )
    return c0, c1
