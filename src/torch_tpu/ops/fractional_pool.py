"""Fractional max pooling (`nn.FractionalMaxPool2d/3d`), forward and backward, as CPU's
kernels compute them. The randomness is the caller's: PyTorch draws `random_samples`
(one number in [0, 1) per batch entry, channel and pooled axis) and passes them in, so
the op itself is deterministic and tpu reproduces CPU's windows, maxima and indices
exactly. Both ran on the CPU fallback, copying the input both ways every call.

Along each axis, window k starts at `int((k + u) * alpha) - int(u * alpha)` (alpha =
(input - pool) / (output - 1), in the input's float type; the last window ends at the
input's end). The window's element kept is CPU's: the last NaN if any, else the first
largest; its index counts within the plane (h * W + w, or (t * H + h) * W + w).
"""

from __future__ import annotations

import math

import jax.numpy as jnp

from .registry import lower


def _check_2d(values: list) -> bool:
    """CPU's words for a window too large (PyTorch's meta kernel words it otherwise)."""
    self, kernel_size, output_size = values[0], values[1], values[2]
    for name, axis in (("height", -2), ("width", -1)):
        pool, size = kernel_size[axis], self.shape[axis]
        if output_size[axis] + pool - 1 > size:
            raise RuntimeError(
                f"fractional_max_pool2d(): pool {name} {pool} too large relative to input "
                f"{name} {size}"
            )
    return False


def _starts(sample, size: int, out: int, pool: int):
    """[..., out] window starts along one axis for samples [...] (CPU's intervals)."""
    last = jnp.full(sample.shape + (1,), size - pool, jnp.int64)
    if out == 1:
        return last
    dtype = sample.dtype.type
    alpha = dtype(size - pool) / dtype(out - 1)
    k = jnp.arange(out - 1, dtype=sample.dtype)
    moved = ((k + sample[..., None]) * alpha).astype(jnp.int64)
    return jnp.concatenate([moved - (sample * alpha).astype(jnp.int64)[..., None], last], -1)


def _pool(x, kernel_size, output_size, samples, order):
    """(values, indices) for x [N, C, *spatial], samples [N, C, axes] whose column
    order[a] is spatial axis a's."""
    spatial = x.shape[2:]
    n, c = x.shape[:2]
    flat = jnp.zeros((n, c) + (1,) * (2 * len(spatial)), jnp.int64)
    for a, (size, out, pool) in enumerate(zip(spatial, output_size, kernel_size)):
        starts = _starts(samples[..., order[a]], size, out, pool)  # [N, C, out]
        positions = starts[..., :, None] + jnp.arange(pool)  # [N, C, out, pool]
        # axis a's (out, pool) pair sits at 2 + 2a, 3 + 2a of [N, C, o1, p1, o2, p2, ...]
        shape = [n, c] + [1] * (2 * len(spatial))
        shape[2 + 2 * a], shape[3 + 2 * a] = out, pool
        stride = math.prod(spatial[a + 1 :])
        flat = flat + (positions * stride).reshape(shape)
    d = len(spatial)
    order_axes = [0, 1] + [2 + 2 * a for a in range(d)] + [3 + 2 * a for a in range(d)]
    flat = flat.transpose(order_axes).reshape((n, c) + tuple(output_size) + (-1,))
    taps = flat.shape[-1]
    values = jnp.take_along_axis(x.reshape((n, c) + (1,) * d + (-1,)), flat, axis=-1)
    nan = jnp.isnan(values)
    last_nan = taps - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
    first_max = jnp.argmax(values, axis=-1)
    chosen = jnp.where(nan.any(-1), last_nan, first_max)[..., None]
    return (
        jnp.take_along_axis(values, chosen, -1)[..., 0],
        jnp.take_along_axis(flat, chosen, -1)[..., 0],
    )


def _forward(self, kernel_size, output_size, random_samples, order):
    """`_pool` of a batched [N, C, *spatial] or unbatched [C, *spatial] input (whose
    samples still have a batch of one: [1, C, axes])."""
    kernel_size, output_size = tuple(kernel_size), tuple(output_size)
    if self.ndim == len(order) + 1:
        values, indices = _pool(self[None], kernel_size, output_size, random_samples, order)
        return values[0], indices[0]
    return _pool(self, kernel_size, output_size, random_samples, order)


@lower("fractional_max_pool2d.default", check=_check_2d)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    # (CPU's 2-D samples hold the width's first, then the height's)
    return _forward(self, kernel_size, output_size, random_samples, (1, 0))


@lower("fractional_max_pool3d.default")
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    return _forward(self, kernel_size, output_size, random_samples, (0, 1, 2))


def _backward(grad_output, self, indices, spatial_dims: int):
    """Each output's gradient added into the input element it took (windows overlap)."""
    batched = self.ndim == spatial_dims + 2
    x_shape = self.shape if batched else (1,) + self.shape
    n, c = x_shape[:2]
    grad = grad_output.reshape(n, c, -1)
    index = indices.reshape(n, c, -1)
    total = jnp.zeros((n, c, math.prod(x_shape[2:])), grad.dtype)
    rows = jnp.arange(n)[:, None, None]
    channels = jnp.arange(c)[None, :, None]
    return total.at[rows, channels, index].add(grad).reshape(self.shape)


@lower("fractional_max_pool2d_backward.default")
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _backward(grad_output, self, indices, 2)


@lower("fractional_max_pool3d_backward.default")
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _backward(grad_output, self, indices, 3)
