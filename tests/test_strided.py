"""strided.read / strided.write against numpy's own strided views, for every kind of
geometry: dense, permuted, broadcast, regular strided (sliced, a column, one part of an
unbind), offset to the storage's end, overlapping and non-nesting strides."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from torch_tpu import strided

GEOMETRIES = [  # (storage numel, shape, strides, offset)
    (24, (2, 3, 4), (12, 4, 1), 0),  # contiguous
    (24, (4, 3, 2), (1, 4, 12), 0),  # permuted
    (64, (4, 8), (16, 1), 0),  # x[..., :8] of (4, 16)
    (64, (4, 8), (16, 1), 8),  # x[..., 8:]: read from the region before the offset
    (58, (4, 8), (16, 1), 2),  # a storage ending at the view's last element: padded
    (64, (4,), (16,), 15),  # a column
    (256, (4, 2, 1, 16), (64, 16, 64, 1), 32),  # unbind(2)[1] of a (4, 2, 2, 16) transpose
    (60, (3, 2, 5), (20, 1, 4), 1),  # strided, permuted, offset
    (48, (2, 3, 2), (24, 6, 2), 3),  # every dim strided
    (16, (2, 3, 4), (8, 0, 1), 0),  # broadcast dim next to a strided one
    (9, (1, 3, 1), (5, 3, 9), 0),  # size-1 dims with odd strides
]
IRREGULAR = [
    (10, (3, 4), (2, 1), 0),  # overlapping windows (unfold)
    (30, (3, 4), (7, 2), 1),  # strides that do not nest
    (64, (2, 3, 3, 2, 2), (32, 8, 2, 4, 1), 0),  # two overlapping dims, as a 2-D unfold
]


F32 = jnp.dtype(jnp.float32)


def _view(numel, shape, strides, offset, dtype=F32):
    return strided.View(shape, strides, offset, dtype, numel, dtype)


def _numpy_view(flat: np.ndarray, shape, strides, offset):
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(
        flat[offset:], shape, tuple(s * item for s in strides), writeable=True
    )


def _ops(fn, *args) -> set[str]:
    return {str(e.primitive) for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns}


def _overlaps(shape, strides) -> bool:
    """Does writing through the view hit some element twice?"""
    seen = _numpy_view(np.arange(10_000), shape, strides, 0).reshape(-1)
    return len(set(seen.tolist())) != seen.size


@pytest.mark.parametrize("numel, shape, strides, offset", GEOMETRIES + IRREGULAR)
def test_read_matches_numpy(numel, shape, strides, offset):
    flat = np.arange(numel, dtype=np.float32) * 1.5 - 3
    view = _view(numel, shape, strides, offset)
    got = np.asarray(jax.jit(lambda f: strided.read(f, view))(flat))
    np.testing.assert_array_equal(got, _numpy_view(flat, shape, strides, offset))


@pytest.mark.parametrize("numel, shape, strides, offset", GEOMETRIES + IRREGULAR)
def test_write_matches_numpy(numel, shape, strides, offset):
    if _overlaps(shape, strides):
        pytest.skip("writing through an overlapping view has no single answer")
    flat = np.arange(numel, dtype=np.float32)
    value = -1 - np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    view = _view(numel, shape, strides, offset)
    got = np.asarray(jax.jit(lambda f, v: strided.write(f, view, v))(flat, value))
    expected = flat.copy()
    _numpy_view(expected, shape, strides, offset)[...] = value
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("numel, shape, strides, offset", GEOMETRIES)
def test_regular_views_need_no_gather_or_scatter(numel, shape, strides, offset):
    """Slices and strided parts are read with a reshape and a static slice, and written
    with a static update: a gather or scatter is many times slower (on a TPU above all)."""
    view = _view(numel, shape, strides, offset)
    flat = jnp.zeros((numel,), jnp.float32)
    assert "gather" not in _ops(lambda f: strided.read(f, view), flat)
    if 0 not in strides:
        value = jnp.zeros(shape, jnp.float32)
        assert "scatter" not in _ops(lambda f, v: strided.write(f, view, v), flat, value)


def test_a_slice_of_the_last_dim_is_read_in_place():
    """x[..., 8:] of a (4, 16) tensor: the region starts before the offset, so nothing
    is padded (a pad copies the whole region)."""
    view = _view(64, (4, 8), (16, 1), 8)
    assert not {"pad", "gather"} & _ops(lambda f: strided.read(f, view), jnp.zeros((64,), F32))
    value = jnp.zeros((4, 8), F32)
    assert not {"pad", "scatter"} & _ops(
        lambda f, v: strided.write(f, view, v), jnp.zeros((64,), F32), value
    )


def test_a_few_elements_far_apart_are_not_padded():
    """x[::500000] of a storage ending just after its first element's row: the grid's
    region would need a pad of almost the whole storage for two elements; they are
    read one slice each instead."""
    view = _view(1_000_004, (2,), (1_000_000,), 3)
    ops = _ops(lambda f: strided.read(f, view), jnp.zeros((1_000_004,), F32))
    assert not {"pad", "gather"} & ops


def test_overlapping_windows_are_read_by_slices():
    """unfold's windows and non-nesting strides: a stack of regular slices along a short
    dim (a gather of the same elements is many times slower on a TPU)."""
    for numel, shape, strides, offset in IRREGULAR + [
        (10 * 32 * 32, (2, 8, 5, 5, 3, 3), (1024, 128, 4, 1, 32, 1), 0),  # 2-D unfold
    ]:
        view = _view(numel, shape, strides, offset)
        ops = _ops(lambda f, v=view: strided.read(f, v), jnp.zeros((numel,), F32))
        assert "gather" not in ops, (shape, strides)


def test_too_many_windows_are_gathered():
    """Past strided._MAX_SLICES slices, one gather."""
    n = strided._MAX_SLICES + 1
    view = _view(3 * n, (2 * n, n), (1, 1), 0)
    assert "gather" in _ops(lambda f: strided.read(f, view), jnp.zeros((3 * n,), F32))


def test_read_through_another_dtype():
    """A strided view of an int32 storage read as float32 (Tensor.view(dtype))."""
    flat = np.arange(64, dtype=np.int32)
    view = strided.View((4, 8), (16, 1), 8, F32, 64, jnp.dtype(jnp.int32))
    got = np.asarray(jax.jit(lambda f: strided.read(f, view))(flat))
    np.testing.assert_array_equal(got, _numpy_view(flat.view(np.float32), (4, 8), (16, 1), 8))


# A storage made for a contiguous tensor holds an array of that tensor's shape.
SHAPED = [  # (storage array shape, view shape, strides, offset)
    ((4, 6), (4, 6), (6, 1), 0),  # the tensor itself
    ((4, 6), (6, 4), (1, 6), 0),  # its transpose
    ((4, 6), (24,), (1,), 0),  # view(-1)
    ((4, 6), (2, 12), (12, 1), 0),  # another shape over the same elements
    ((4, 6), (4, 3), (6, 1), 3),  # x[:, 3:]
    ((4, 6), (4,), (6,), 2),  # a column
    ((2, 3, 4), (3, 4), (4, 1), 12),  # x[1]
    ((), (), (), 0),  # a 0-d tensor
]


@pytest.mark.parametrize("storage_shape, shape, strides, offset", SHAPED)
def test_shaped_storage_read_and_write_match_numpy(storage_shape, shape, strides, offset):
    numel = int(np.prod(storage_shape))
    array = (np.arange(numel, dtype=np.float32) * 1.5 - 3).reshape(storage_shape)
    view = _view(numel, shape, strides, offset)
    got = np.asarray(jax.jit(lambda a: strided.read(a, view))(array))
    np.testing.assert_array_equal(got, _numpy_view(array.reshape(-1), shape, strides, offset))
    value = -1 - np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    written = np.asarray(jax.jit(lambda a, v: strided.write(a, view, v))(array, value))
    expected = array.reshape(-1).copy()
    _numpy_view(expected, shape, strides, offset)[...] = value
    assert written.shape == storage_shape  # a write keeps the storage array's shape
    np.testing.assert_array_equal(written.reshape(-1), expected)


def test_the_whole_tensor_is_the_storage_array():
    """Reading or writing a contiguous tensor over its own shaped storage is the array
    itself: no reshape (a copy on a TPU, where flat and 2-D arrays are laid out apart)."""
    view = _view(24, (4, 6), (6, 1), 0)
    array, value = jnp.zeros((4, 6), F32), jnp.ones((4, 6), F32)
    assert _ops(lambda a: strided.read(a, view), array) == set()
    assert "reshape" not in _ops(lambda a, v: strided.write(a, view, v), array, value)


@pytest.mark.parametrize("shape, strides, layout", [
    ((4, 6), None, (4, 6)),
    ((4, 6), (6, 1), (4, 6)),
    ((4, 6), (1, 4), (24,)),  # a transposed output keeps PyTorch's strides: flat
    ((), None, ()),
])  # fmt: skip
def test_layout_shape(shape, strides, layout):
    assert strided.layout_shape(shape, strides) == layout
