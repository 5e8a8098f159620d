"""Antialiased resizing: `F.interpolate(..., antialias=True)` in bilinear, bicubic and
Lanczos modes, which torchvision's `Resize` applies to image tensors by default.

PyTorch decomposes none of the three, so they used to run on the CPU fallback, copied
both ways at every call (and every backward). CPU's kernel is PIL's: along each axis
that changes size (the width first, then the height), an output pixel is a normalised
weighted sum over a window of inputs that widens with the downscale factor. The taps
are worked out here as CPU works them out (in float32 for a float32 image, float64 for
a float64 one, with its intermediate roundings), and each sum is accumulated tap by tap
in its order, so results match CPU's to the last bit or within a rounding. uint8 images
take CPU's integer path: int16 weights scaled by a power of two, int32 sums, a rounding
shift and saturation per pass. The backward ops are the forward's VJP.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from .. import dtypes
from .nn import _cubic_far, _cubic_near, _source_scale, _vjp
from .registry import lower

_PI32 = np.float32(np.pi)


def _triangle(x):
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0).astype(x.dtype)


def _keys_cubic(x):
    """Keys' cubic with a = -0.5 (PIL's; plain bicubic resizing uses -0.75)."""
    a = x.dtype.type(-0.5)
    x = np.abs(x)
    return np.where(x < 1, _cubic_near(x, a), np.where(x < 2, _cubic_far(x, a), 0)).astype(x.dtype)


def _sinc(x):
    pi = _PI32 if x.dtype == np.float32 else np.pi
    scaled = (x * pi).astype(x.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        sine = np.sin(scaled.astype(np.float64)).astype(x.dtype)  # (sinf: correctly rounded)
        return np.where(x == 0, 1, sine / scaled).astype(x.dtype)


def _lanczos3(x):
    """Lanczos-3: sinc(x) sinc(x / 3), the second factor in float64 whatever the image
    (CPU's kernel passes it x / 3.0, a double), the product rounded to the image's."""
    x = np.abs(x)
    product = _sinc(x).astype(np.float64) * _sinc(x.astype(np.float64) / 3.0)
    return np.where(x < 3, product, 0).astype(x.dtype)


_FILTERS = {"bilinear": (2, _triangle), "bicubic": (4, _keys_cubic), "lanczos": (6, _lanczos3)}


def _taps(mode: str, size: int, out: int, scale, align_corners: bool, dtype):
    """(first input index [out], weights [out, taps], in use [out, taps]) of one axis, in
    `dtype` (the image's float type; float64 for a uint8 image), rounded where CPU's
    kernel rounds: its center, support and filter argument are that type, the steps
    between them double."""
    interp, filter_fn = _FILTERS[mode]
    step = _source_scale(size, out, scale, align_corners, dtype)
    wide = np.float64(step)
    support = dtype(interp * 0.5 * wide) if step >= 1 else dtype(interp * 0.5)
    taps = int(np.ceil(support)) * 2 + 1
    invscale = np.float64(dtype(1.0 / wide)) if step >= 1 else 1.0
    center = (wide * (np.arange(out) + 0.5)).astype(dtype)
    first = np.trunc((center - support).astype(np.float64) + 0.5).astype(np.int64)
    first = np.maximum(first, 0)
    last = np.trunc((center + support).astype(np.float64) + 0.5).astype(np.int64)
    count = np.clip(np.minimum(last, size) - first, 0, taps)
    index = np.arange(taps)[None, :] + first[:, None]
    offset = index.astype(dtype) - center[:, None]
    weights = filter_fn(((offset.astype(np.float64) + 0.5) * invscale).astype(dtype))
    used = np.arange(taps)[None, :] < count[:, None]
    weights = np.where(used, weights, 0).astype(dtype)
    total = np.zeros(out, dtype)
    for k in range(taps):  # (summed tap by tap, as CPU's loop)
        total = (total + weights[:, k]).astype(dtype)
    with np.errstate(invalid="ignore", divide="ignore"):
        normalised = (weights / total[:, None]).astype(dtype)
    weights = np.where(total[:, None] != 0, normalised, weights)
    return first, weights, used


def _int16_weights(weights):
    """CPU's uint8 weights: float64 ones scaled by the largest power of two keeping the
    biggest under 2**15, rounded half away from zero; (int16 weights, that power)."""
    biggest = weights.max(initial=0.0)
    precision = 0
    while precision < 22 and int(0.5 + biggest * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    scaled = weights * (1 << precision)
    rounded = np.where(scaled < 0, np.trunc(scaled - 0.5), np.trunc(scaled + 0.5))
    return rounded.astype(np.int32), precision


def _resize_axis(x, axis: int, first, weights, used, integer_precision=None):
    """One pass along `axis`: per output, the first tap's product, then each further
    tap in use added in turn (an unused tap leaves the sum as it is, even a -0.0)."""
    size = x.shape[axis]
    shape = (-1,) + (1,) * (x.ndim - axis - 1)

    def product(k):
        index = np.minimum(first + k, size - 1)
        return jnp.take(x, index, axis=axis) * jnp.asarray(weights[:, k].reshape(shape), x.dtype)

    if integer_precision is not None:  # unused taps weigh 0: integer sums need no mask
        start = jnp.asarray(1 << (integer_precision - 1), x.dtype)
        total = functools.reduce(jnp.add, (product(k) for k in range(weights.shape[1])), start)
        return jnp.clip(total >> integer_precision, 0, 255)
    total = product(0)
    for k in range(1, weights.shape[1]):
        if used[:, k].all():
            total = total + product(k)
        elif used[:, k].any():
            total = jnp.where(jnp.asarray(used[:, k].reshape(shape)), total + product(k), total)
    return total


def _resize(mode: str, x, output_size, align_corners: bool, scales):
    """The forward: the last axis first, then the one before, each only if its size
    changes (CPU's order; a uint8 image is rounded back to uint8 after each pass). A
    float16/bfloat16 image, which CPU refuses and CUDA resizes in float32, is resized in
    float32 (docs/differences.md: half kernels CPU lacks are computed)."""
    integer = x.dtype == jnp.uint8
    given = x.dtype
    dtype = np.float64 if integer else dtypes.opmath_float(x.dtype).type
    x = x.astype(jnp.int32 if integer else dtype)
    n = len(output_size)
    for axis, out, scale in reversed(list(zip(range(x.ndim - n, x.ndim), output_size, scales))):
        size = x.shape[axis]
        if size == out:
            continue
        first, weights, used = _taps(mode, size, out, scale, align_corners, dtype)
        if integer:
            weights, precision = _int16_weights(weights)
            x = _resize_axis(x, axis, first, weights, used, precision)
        else:
            x = _resize_axis(x, axis, first, weights, used)
    return x.astype(given)


def _register(mode: str) -> None:
    op = f"_upsample_{mode}2d_aa"

    @lower(f"{op}.default")
    def forward(self, output_size, align_corners, scales_h=None, scales_w=None):
        return _resize(mode, self, tuple(output_size), align_corners, (scales_h, scales_w))

    @lower(f"{op}_backward.default")
    def backward(grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None):
        zeros = jnp.zeros(tuple(input_size), grad_output.dtype)
        scales = (scales_h, scales_w)
        return _vjp(
            lambda x: _resize(mode, x, tuple(output_size), align_corners, scales),
            zeros,
            grad_output,
        ).astype(grad_output.dtype)


for _mode in _FILTERS:
    _register(_mode)
