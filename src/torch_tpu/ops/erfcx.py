"""The error-function family where XLA's falls short of CPU's: erf near +-1, erfcx,
log_ndtr.

erf: XLA's float32 erf is 2.7-5.3 ulp off for |x| in [0.5, 4) (CPU's libm: 1). From
|x| = 1 up, sign(x) (1 - erfc(|x|)) is within 1.3 ulp, correctly rounded from 2 on; it
costs an erfc besides the erf (3x on XLA:CPU), so gelu keeps XLA's erf (ops/nn.py).

erfcx(x) = exp(x^2) erfc(x), without jax's float32 hole at 9.19 <= x <= 9.42:

jax's erfcx multiplies exp(x^2) by erfc(x) up to where exp(x^2) overflows (x = 9.42
in float32, 26.6 in float64), but erfc(x) leaves the normal range before that (x = 9.19
in float32): XLA:CPU and TPUs flush it to zero, so erfcx returned exactly 0 for x in
[9.196, 9.4186] (about 0.06 is right), and up to 1.0 relative error just below.

Here x >= 5 (float32; 12 in float64) takes the asymptotic series, truncated after nine
terms (below 2e-8 relative from 5 on, 3e-15 from 12 on); below that, the product as
before, where erfc(x) stays a normal float.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from .. import dtypes
from .series import horner

_ASYMPTOTIC_FROM = {jnp.float32: 5.0, jnp.float64: 12.0}
# erfcx(x) ~ 1/(x sqrt(pi)) * sum_k (-1)^k (2k - 1)!! / (2 x^2)^k
_SERIES = [(-1) ** k * math.prod(range(1, 2 * k, 2)) / 2**k for k in range(9)]


def erf(x):
    """erf, through erfc for |x| >= 1 (real x; complex to XLA's)."""
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize < 4:
        return lax.erf(x)
    far = jnp.abs(x) >= 1
    tail = jnp.sign(x) * (1 - lax.erfc(jnp.where(far, jnp.abs(x), 1)))
    return jnp.where(far, tail, lax.erf(x))


def erfcx(x):
    dtype, x = x.dtype, dtypes.widen_half(x)  # (half types: in float32, as CPU)
    start = _ASYMPTOTIC_FROM[x.dtype.type]
    large = x >= start
    safe_small = jnp.where(large, 0, x)
    # (XLA's erfc(x) is exp(-x^2) times a fraction there: the roundings of x^2 cancel)
    direct = jnp.exp(safe_small * safe_small) * lax.erfc(safe_small)
    safe_large = jnp.where(large, x, start)
    t = 1 / (safe_large * safe_large)
    asymptotic = horner(_SERIES, t) / (safe_large * math.sqrt(math.pi))
    return jnp.where(large, asymptotic, direct).astype(dtype)


def log_ndtr(x):
    """log of the standard normal CDF. jax's takes log(ndtr(x)) for x up to 5 (float32),
    which near 1 keeps only ndtr's absolute rounding: 3e-5 relative at x = 3.2 (CPU
    1e-6). Here: log1p(-erfc(x / sqrt 2) / 2) from x = -1 up; below, the tail through
    erfcx, log(erfcx(-x / sqrt 2) / 2) - x^2 / 2, which neither underflows nor cancels."""
    dtype, x = x.dtype, dtypes.widen_half(x)
    root_half = math.sqrt(0.5)
    upper = jnp.log1p(-0.5 * lax.erfc(jnp.maximum(x, -1) * root_half))
    tail_x = jnp.minimum(x, -1)
    tail = jnp.log(0.5 * erfcx(-tail_x * root_half)) - 0.5 * tail_x * tail_x
    return jnp.where(x < -1, tail, upper).astype(dtype)
