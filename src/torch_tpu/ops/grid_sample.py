"""Grid sampling (`F.grid_sample`): the 3-D sampler and its backward, and the 2-D
sampler's backward (spatial transformers, image and volume registration).

PyTorch decomposes the 2-D forward into ops we lower, but not its backward op, nor
the 3-D sampler: they ran on the CPU at every call. Each is lowered here from one
forward function (a backward is its vector-Jacobian product), in the input's dtype as
CPU's kernels compute (half types too), with CPU's coordinate rules: unnormalisation
by align_corners, border and reflection padding (a NaN coordinate clamps to the last
index, as CPU's min/max do; bicubic pads each tap's index instead), zeros padding
dropping taps outside, nearest rounding half to even.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .nn import cubic_weights
from .pointwise import scalar_type_name
from .registry import lower

_BILINEAR, _NEAREST, _BICUBIC = 0, 1, 2
_ZEROS, _BORDER, _REFLECTION = 0, 1, 2


def _clip(coord, size: int):
    """Into [0, size - 1]; NaN to size - 1 (CPU's min(size - 1, max(coord, 0))). The
    gradient is 1 strictly inside and 0 at and past either end, as CPU's backward has
    it (jnp.clip's is 0.5 at an end)."""
    inside = (coord > 0) & (coord < size - 1)
    return jnp.where(inside, coord, jnp.where(coord <= 0, 0, size - 1).astype(coord.dtype))


def _reflect(coord, twice_low: int, twice_high: int):
    """coord reflected into [twice_low / 2, twice_high / 2] by its edges, repeatedly."""
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    distance = jnp.abs(coord - low)
    extra = jnp.fmod(distance, span)
    flips = jnp.floor(distance / span)
    return jnp.where(flips % 2 == 0, extra + low, span - extra + low)


def _unnormalized(grid, sizes: tuple, align_corners: bool) -> list:
    """Per spatial dim (slowest first), the grid's coordinate in [-1, 1] as a fractional
    index; the grid's last axis lists them fastest first (x, y, z)."""
    last = len(sizes) - 1
    coords = []
    for axis, size in enumerate(sizes):
        coord = grid[..., last - axis]
        if align_corners:
            coords.append((coord + 1) / 2 * (size - 1))
        else:
            coords.append(((coord + 1) * size - 1) / 2)
    return coords


def _padded(coord, size: int, padding_mode: int, align_corners: bool):
    """An index moved inside by border or reflection padding (zeros padding: as it is)."""
    if padding_mode == _BORDER:
        return _clip(coord, size)
    if padding_mode == _REFLECTION:
        if align_corners:
            return _clip(_reflect(coord, 0, 2 * (size - 1)), size)
        return _clip(_reflect(coord, -1, 2 * size - 1), size)
    return coord


def _taps(volume, indices: tuple, sizes: tuple):
    """volume (N, C, *sizes) read at integer float indices, one per spatial dim, each of
    the grid's shape (N, *out): (N, C, *out), and whether each tap lies inside."""
    inside = jnp.ones(indices[0].shape, bool)
    clipped = []
    for index, size in zip(indices, sizes):
        inside &= (index >= 0) & (index <= size - 1)  # (False for NaN)
        clipped.append(jnp.clip(jnp.nan_to_num(index), 0, size - 1).astype(jnp.int32))
    batch = jnp.arange(volume.shape[0]).reshape((-1,) + (1,) * len(sizes))
    values = volume[(batch, slice(None), *clipped)]  # (N, *out, C)
    return jnp.moveaxis(values, -1, 1), inside[:, None]


def _linear(volume, coords: list, sizes: tuple):
    """Bilinear (trilinear): the 2^dims taps around each point, weighted."""
    lows = [jnp.floor(c) for c in coords]
    dims = len(sizes)
    out = 0
    for corner in range(2**dims):
        offsets = [(corner >> (dims - 1 - axis)) & 1 for axis in range(dims)]
        indices = tuple(low + offset for low, offset in zip(lows, offsets))
        weight = 1
        for coord, index, offset in zip(coords, indices, offsets):
            weight = weight * (coord - (index - 1) if offset else index + 1 - coord)
        values, inside = _taps(volume, indices, sizes)
        out = out + jnp.where(inside, values * weight[:, None], 0).astype(volume.dtype)
    return out


def _bicubic(volume, coords: list, sizes: tuple, padding_mode: int, align_corners: bool):
    """2-D only, as on CPU: the 4 x 4 taps around each point, padding each tap's index."""
    lows = [jnp.floor(c) for c in coords]
    weights = [cubic_weights(c - low) for c, low in zip(coords, lows)]  # (y, x)
    out = 0
    for i in range(4):
        for j in range(4):
            indices = tuple(
                _padded(low + k - 1, size, padding_mode, align_corners)
                for low, k, size in zip(lows, (i, j), sizes)
            )
            values, inside = _taps(volume, indices, sizes)
            out = out + jnp.where(inside, values * (weights[0][i] * weights[1][j])[:, None], 0)
    return out.astype(volume.dtype)


def _forward(volume, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    sizes = volume.shape[2:]
    coords = _unnormalized(grid, sizes, align_corners)
    if interpolation_mode == _BICUBIC:
        return _bicubic(volume, coords, sizes, padding_mode, align_corners)
    coords = [_padded(c, size, padding_mode, align_corners) for c, size in zip(coords, sizes)]
    if interpolation_mode == _NEAREST:
        values, inside = _taps(volume, tuple(jnp.round(c) for c in coords), sizes)
        return jnp.where(inside, values, 0).astype(volume.dtype)
    return _linear(volume, coords, sizes)


def _vjp(grad_output, input, grid, interpolation_mode, padding_mode, align_corners, mask):
    """(the input's gradient, or None where output_mask says so; the grid's)."""
    _, pull = jax.vjp(
        lambda v, g: _forward(v, g, interpolation_mode, padding_mode, align_corners), input, grid
    )
    grad_input, grad_grid = pull(grad_output.astype(input.dtype))
    return (grad_input if mask[0] else None), grad_grid


def _check_3d_mode(interpolation_mode: int) -> None:
    if interpolation_mode not in (_BILINEAR, _NEAREST):
        raise NotImplementedError(
            "grid_sampler_3d: tpu lowers bilinear and nearest sampling (CPU's 3-D sampler "
            f"refuses bicubic), got interpolation_mode={interpolation_mode}"
        )


def _check_dtypes(values: list) -> bool:
    """CPU's kernel takes floating types only, the grid in the input's (the meta kernel,
    and tpu's refusals on the shrunk stand-ins of a large call, let the others through)."""
    dtype = values[0].dtype
    if not dtype.is_floating_point:
        raise NotImplementedError(
            f'"grid_sampler3d_cpu" not implemented for \'{scalar_type_name(dtype)}\''
        )
    if values[1].dtype != dtype:
        raise RuntimeError(
            f"expected scalar type {scalar_type_name(dtype)} but found "
            f"{scalar_type_name(values[1].dtype)}"
        )
    return False  # (dtypes are part of the key)


@lower("grid_sampler_3d.default", check=_check_dtypes)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    _check_3d_mode(interpolation_mode)
    return _forward(input, grid, interpolation_mode, padding_mode, align_corners)


@lower("grid_sampler_3d_backward.default")
def grid_sampler_3d_backward(
    grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask
):
    _check_3d_mode(interpolation_mode)
    return _vjp(
        grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask
    )


@lower("grid_sampler_2d_backward.default")
def grid_sampler_2d_backward(
    grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask
):
    return _vjp(
        grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask
    )
