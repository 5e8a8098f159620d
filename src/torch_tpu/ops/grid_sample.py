"""3-D grid sampling (`F.grid_sample` of a 5-D input: spatial transformers on volumes,
image registration).

PyTorch decomposes the 2-D sampler into ops we lower, but not the 3-D one, so it ran
on the CPU at every call. Forward and backward are lowered here from one forward
function (the backward is its vector-Jacobian product), in the input's dtype as CPU's
kernel computes (half types too), with CPU's coordinate rules:
unnormalisation by align_corners, border and reflection padding (a NaN coordinate
clamps to the last index, as CPU's min/max do), zeros padding dropping taps outside
the volume, nearest rounding half to even.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .pointwise import scalar_type_name
from .registry import lower

_BILINEAR, _NEAREST = 0, 1
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


def _source_index(coord, size: int, padding_mode: int, align_corners: bool):
    """A grid coordinate in [-1, 1] as a (fractional) index along a dim of `size`."""
    if align_corners:
        coord = (coord + 1) / 2 * (size - 1)
    else:
        coord = ((coord + 1) * size - 1) / 2
    if padding_mode == _BORDER:
        return _clip(coord, size)
    if padding_mode == _REFLECTION:
        if align_corners:
            return _clip(_reflect(coord, 0, 2 * (size - 1)), size)
        return _clip(_reflect(coord, -1, 2 * size - 1), size)
    return coord


def _taps(volume, indices: tuple, sizes: tuple):
    """volume (N, C, D, H, W) read at integer float indices (z, y, x), each (N, Do, Ho,
    Wo): (N, C, Do, Ho, Wo), and whether each tap lies inside the volume."""
    inside = jnp.ones(indices[0].shape, bool)
    clipped = []
    for index, size in zip(indices, sizes):
        inside &= (index >= 0) & (index <= size - 1)  # (False for NaN)
        clipped.append(jnp.clip(jnp.nan_to_num(index), 0, size - 1).astype(jnp.int32))
    batch = jnp.arange(volume.shape[0]).reshape(-1, 1, 1, 1)
    values = volume[batch, :, clipped[0], clipped[1], clipped[2]]  # (N, Do, Ho, Wo, C)
    return jnp.moveaxis(values, -1, 1), inside[:, None]


def _forward(volume, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    sizes = volume.shape[2:]  # (D, H, W); the grid's last axis is (x, y, z)
    coords = [
        _source_index(grid[..., 2 - axis], size, padding_mode, align_corners)
        for axis, size in enumerate(sizes)
    ]
    if interpolation_mode == _NEAREST:
        values, inside = _taps(volume, tuple(jnp.round(c) for c in coords), sizes)
        return jnp.where(inside, values, 0).astype(volume.dtype)
    lows = [jnp.floor(c) for c in coords]
    out = jnp.zeros((volume.shape[0], volume.shape[1], *grid.shape[1:4]), volume.dtype)
    for corner in range(8):
        offsets = [(corner >> (2 - axis)) & 1 for axis in range(3)]
        indices = tuple(low + offset for low, offset in zip(lows, offsets))
        weight = 1
        for coord, index, offset in zip(coords, indices, offsets):
            weight = weight * (coord - (index - 1) if offset else index + 1 - coord)
        values, inside = _taps(volume, indices, sizes)
        out = out + jnp.where(inside, values * weight[:, None], 0).astype(volume.dtype)
    return out


def _check_mode(interpolation_mode: int) -> None:
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
    _check_mode(interpolation_mode)
    return _forward(input, grid, interpolation_mode, padding_mode, align_corners)


@lower("grid_sampler_3d_backward.default")
def grid_sampler_3d_backward(
    grad_output, input, grid, interpolation_mode, padding_mode, align_corners, output_mask
):
    _check_mode(interpolation_mode)
    _, pull = jax.vjp(
        lambda v, g: _forward(v, g, interpolation_mode, padding_mode, align_corners), input, grid
    )
    grad_input, grad_grid = pull(grad_output.astype(input.dtype))
    return (grad_input if output_mask[0] else None), grad_grid
