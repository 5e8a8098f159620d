"""Reading and writing a strided view of a storage array, in pure JAX.

A tpu storage holds one array; a tensor is (shape, strides, offset) into its
elements in row-major order, exactly as on CPU. A storage made for a contiguous
tensor keeps that tensor's shape (`layout_shape`), so that reading or writing
the tensor whole is the array itself: on a TPU a flat array has another memory
layout than a 2-D one, and every reshape between them is a copy (XLA:CPU, for
its part, then stops updating donated buffers in place). Any other view works
on the elements flattened. These functions run inside jitted executables, so the
common layouts (contiguous, permuted, broadcast) cost a reshape or transpose,
regular strided ones (a slice of the last dim, a column, one of `unbind`'s or
`chunk`'s parts) a reshape and a static slice, overlapping windows (`unfold`) a
few such slices concatenated, and only the rest (and writes through overlapping
or broadcast dims) pay for a gather or scatter.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax


class View(NamedTuple):
    """The static geometry of one tensor over its storage; hashable, part of cache keys."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    dtype: object  # jnp dtype of the tensor
    storage_numel: int
    storage_dtype: object  # jnp dtype of the storage array
    # the storage array's shape (a tensor's own View, part of program keys); None in
    # views made inside programs, which read and write whatever array they are given
    storage_shape: tuple[int, ...] | None = None
    # PyTorch's lazy conjugate and negative bits (x.conj(), x.conj().imag): the tensor
    # is a view whose value is the conjugate / negation of what its storage holds
    conj: bool = False
    neg: bool = False


class Offset(NamedTuple):
    """A view's storage offset given at run time, in place of View.offset: the index of
    its value among the executable's run-time scalars. One program then serves a view at
    every offset (`x[i]` in a loop over i compiled a program per i)."""

    index: int


def offset_may_vary(view: View) -> bool:
    """Whether a view's offset can be a run-time value (`Offset`): it is not 0 (the
    storage array itself stays a static read), it reads the storage's own dtype (a
    reinterpreting view counts offsets in the storage's units), and its geometry allows
    it (`geometry_may_move`)."""
    return (
        view.offset != 0
        and view.dtype == view.storage_dtype
        and geometry_may_move(view.shape, view.strides)
    )


# Storage elements a strided view may span and still take a run-time offset. A
# dynamic slice of the span comes first; on a TPU v5e one of 4M elements cost about
# 10 us a call over a static read, one of 16M about 290 us (a column or a chunk of a
# 4096 x 4096 matrix): those keep static offsets (a program per offset).
_MOVABLE_SPAN = 1 << 22


def geometry_may_move(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether a view of this geometry may be read at a run-time offset: it has elements,
    and it is a block (as many storage elements spanned as it has: `x[i]`, `x[i:j]`, one
    element: the dynamic slice reads exactly its elements) or spans at most
    `_MOVABLE_SPAN` elements."""
    numel = math.prod(shape)
    if numel == 0:
        return False
    span = storage_span(shape, strides, 0)
    return span == numel or span <= _MOVABLE_SPAN


def read_with(flat, view: View, run_time):
    """`read`, at the run-time offset among `run_time` (the program's run-time values)
    where the view's offset is an `Offset`."""
    if type(view.offset) is Offset:
        return read_at(flat, view, run_time[view.offset.index])
    return read(flat, view)


def write_with(flat, view: View, value, run_time):
    """`write`, at the run-time offset among `run_time` where the view has one."""
    if type(view.offset) is Offset:
        return write_at(flat, view, run_time[view.offset.index], value)
    return write(flat, view, value)


def read_at(flat, view: View, offset):
    """`read` of a view whose offset is the run-time value `offset`."""
    region, at_zero = _region_at(flat, view, offset)
    return read(region, at_zero)


def write_at(flat, view: View, offset, value):
    """`write` through a view whose offset is the run-time value `offset`."""
    region, at_zero = _region_at(flat, view, offset)
    shape = flat.shape
    flat = flat.reshape(-1)
    region = write(region, at_zero, value)
    return lax.dynamic_update_slice(flat, region, (offset,)).reshape(shape)


def _region_at(flat, view: View, offset):
    """The elements the view spans, from `offset` on, and the view over them at 0."""
    span = storage_span(view.shape, view.strides, 0)
    region = lax.dynamic_slice(flat.reshape(-1), (offset,), (span,))
    return region, view._replace(offset=0, storage_numel=span, storage_shape=(span,))


def layout_shape(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> tuple[int, ...]:
    """The shape of a new storage's array for a tensor of this geometry at offset 0:
    the tensor's own shape when it is contiguous (strides None), else flat."""
    shape = tuple(shape)
    if strides is None or tuple(strides) == contiguous_strides(shape):
        return shape
    return (storage_span(shape, tuple(strides), 0),)


def _is_the_array(array, view: View) -> bool:
    """True when the view is the storage array itself: its shape, row-major, at 0."""
    return (
        array.shape == view.shape
        and view.offset == 0
        and view.dtype == view.storage_dtype
        and is_contiguous(view.shape, view.strides)
    )


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def storage_span(shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> int:
    """Elements a storage needs to back this geometry."""
    if any(s == 0 for s in shape):
        return offset
    return offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def _reinterpret(flat, src, dst):
    """The flat storage seen as another dtype (view(dtype), view_as_real). XLA has no
    bitcast for bool: its bytes are read as uint8 (0 or 1), and bytes seen as bool are
    `!= 0` (so a bool storage keeps 0/1 only, where PyTorch's would keep any byte)."""
    if src == dst:
        return flat
    if src == jnp.bool_:
        return _reinterpret(flat.astype(jnp.uint8), jnp.dtype(jnp.uint8), dst)
    if dst == jnp.bool_:
        return _reinterpret(flat, src, jnp.dtype(jnp.uint8)) != 0
    if jnp.issubdtype(src, jnp.complexfloating) and not jnp.issubdtype(dst, jnp.complexfloating):
        parts = jnp.stack([flat.real, flat.imag], axis=-1).reshape(-1)
        return _reinterpret(parts, parts.dtype, dst)
    if jnp.issubdtype(dst, jnp.complexfloating):
        part = jnp.dtype(jnp.float32 if dst == jnp.complex64 else jnp.float64)
        pairs = _reinterpret(flat, src, part).reshape(-1, 2)
        return lax.complex(pairs[:, 0], pairs[:, 1])
    if src.itemsize == dst.itemsize:
        return lax.bitcast_convert_type(flat, dst)
    if src.itemsize > dst.itemsize:
        return lax.bitcast_convert_type(flat, dst).reshape(-1)
    ratio = dst.itemsize // src.itemsize
    return lax.bitcast_convert_type(flat.reshape(-1, ratio), dst)


def is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """torch.Tensor.is_contiguous: row-major, ignoring the strides of size-1 dims."""
    expected = contiguous_strides(shape)
    return all(n == 1 or s == e for n, s, e in zip(shape, strides, expected))


def _by_stride(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int]:
    """The dims that are neither size 1 nor broadcast (stride 0), largest stride first."""
    dims = [d for d, n in enumerate(shape) if n != 1 and strides[d] != 0]
    return sorted(dims, key=lambda d: -strides[d])


def _in_order(value, order: list[int]):
    """value with its dims in `order` (largest stride first), its size-1 dims dropped."""
    kept = sorted(order)
    value = value.reshape([value.shape[d] for d in kept])
    return jnp.transpose(value, [kept.index(d) for d in order])


def _dense_order(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int] | None:
    """`_by_stride`'s dims when they lay out one dense block; None when they do not."""
    order = _by_stride(shape, strides)
    step = 1
    for d in reversed(order):
        if strides[d] != step:
            return None
        step *= shape[d]
    return order


def is_dense(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True when the strides lay the elements out as a permutation of a dense block."""
    if any(n == 0 for n in shape):
        return False
    order = _dense_order(shape, strides)
    return order is not None and len(order) == sum(1 for n in shape if n != 1)


class _Grid(NamedTuple):
    """A strided view as a static slice of a storage region reshaped to a grid.

    With the view's non-size-1, non-broadcast dims ordered by stride s_0 > ... > s_k
    (sizes n_0..n_k), each stride a multiple of the next and each dim fitting inside
    the next larger stride, the n_0 * s_0 elements from `start` reshaped to
    (n_0, s_0 / s_1, ..., s_(k-1) / s_k, s_k) hold element (i_0, ..., i_k) at
    corner + (i_0, ..., i_k, 0). The region starts at the view's offset, or earlier
    when that keeps it inside the storage (`x[..., 8:]`: the offset then becomes the
    corner); else it runs past the end, padded with zeros."""

    order: list[int]  # the view's dims, largest stride first
    shape: tuple[int, ...]  # the region's grid
    limits: tuple[int, ...]  # the view's extent in the grid: (n_0, ..., n_k, 1)
    start: int  # where the region starts in the storage
    end: int  # where it ends, at most the storage's end
    padding: int  # zeros after the storage's end
    corner: tuple[int, ...]  # the view's first element in the grid


def _grid(view: View, numel: int) -> _Grid | None:
    """The grid for view over a storage of numel elements (of the view's dtype), or None
    when its strides do not nest (overlapping windows, irregular as_strided) or the
    region would need more padding than the view has elements."""
    order = _by_stride(view.shape, view.strides)
    if not order:
        return None
    strides = [view.strides[d] for d in order]
    sizes = [view.shape[d] for d in order]
    for k in range(1, len(order)):
        if strides[k - 1] % strides[k] or sizes[k] * strides[k] > strides[k - 1]:
            return None
    shape = (sizes[0], *(strides[k - 1] // strides[k] for k in range(1, len(order))), strides[-1])
    limits = (*sizes, 1)
    length = sizes[0] * strides[0]
    start = max(0, min(view.offset, numel - length))
    corner, rest = [], view.offset - start
    for place in (*strides, 1):
        corner.append(rest // place)
        rest %= place
    if any(c + n > size for c, n, size in zip(corner, limits, shape)):
        start, corner = view.offset, [0] * len(shape)
    end = min(start + length, numel)
    padding = start + length - end
    if padding > math.prod(sizes):  # a few elements far apart: gathering them is cheaper
        return None
    return _Grid(order, shape, limits, start, end, padding, tuple(corner))


def _region(typed, grid: _Grid):
    region = lax.slice(typed, (grid.start,), (grid.end,))
    if grid.padding:
        region = jnp.pad(region, (0, grid.padding))
    return region.reshape(grid.shape)


def _indices(view: View):
    idx = jnp.full(view.shape, view.offset, dtype=jnp.int64)
    for d, (n, s) in enumerate(zip(view.shape, view.strides)):
        if n != 1 and s != 0:
            idx = idx + lax.broadcasted_iota(jnp.int64, view.shape, d) * s
    return idx


def read(flat, view: View):
    """The tensor's value: an array of view.shape and view.dtype."""
    return _apply_bits(_read_stored(flat, view), view)


def _apply_bits(value, view: View):
    """The value a conjugate / negative view shows of what its storage holds (each bit is
    its own inverse, so writing applies it too)."""
    if view.conj:
        value = jnp.conj(value)
    return -value if view.neg else value


def _read_stored(flat, view: View):
    numel = math.prod(view.shape)
    if numel == 0:
        return jnp.zeros(view.shape, view.dtype)
    if flat.ndim != 1:
        if _is_the_array(flat, view):
            return flat
        flat = flat.reshape(-1)
    flat = _reinterpret(flat, view.storage_dtype, view.dtype)
    value = _sliced(flat, view, _MAX_SLICES)
    return flat[_indices(view)] if value is None else value


# Overlapping windows (`unfold`) are read as a stack of regular slices, one per
# position along a short dim, up to this many slices in all; beyond, one gather.
_MAX_SLICES = 64


def _sliced(flat, view: View, budget: int):
    """The view read from flat (already of view.dtype) by slices and reshapes, or None
    when that would take more than `budget` slices."""
    order = _dense_order(view.shape, view.strides)
    if order is not None:
        dense_numel = math.prod(view.shape[d] for d in order)
        block = flat
        if view.offset != 0 or dense_numel != flat.shape[0]:
            block = lax.slice(flat, (view.offset,), (view.offset + dense_numel,))
        block = block.reshape([view.shape[d] for d in order])
    elif (grid := _grid(view, flat.shape[0])) is not None:
        order = grid.order
        end = tuple(c + n for c, n in zip(grid.corner, grid.limits))
        block = lax.slice(_region(flat, grid), grid.corner, end).reshape(grid.limits[:-1])
    else:
        return _stacked(flat, view, budget)
    # Put the dense dims back in their places, then broadcast the rest.
    kept = sorted(order)
    block = jnp.transpose(block, [order.index(d) for d in kept])
    squeezed = [view.shape[d] if d in kept else 1 for d in range(len(view.shape))]
    return jnp.broadcast_to(block.reshape(squeezed), view.shape)


def _stacked(flat, view: View, budget: int):
    """A view whose strides do not nest, as its pieces along one dim, concatenated:
    the dim is cut into runs short enough to fit inside the next larger stride (every
    other stride that is a multiple of its own), so each piece may nest, and each is
    read by `_sliced` in turn. `x.unfold(-1, 400, 160)`: three pieces of the window,
    160 + 160 + 80 long; a 3x3 patch unfold: nine. On a TPU a gather of the same
    elements is many times slower."""
    dims = _by_stride(view.shape, view.strides)
    runs = {}
    for d in dims:
        larger = [
            view.strides[e] // view.strides[d]
            for e in dims
            if e != d and view.strides[e] >= view.strides[d]
            and view.strides[e] % view.strides[d] == 0
        ]
        run = min(larger, default=1)
        runs[d] = run if run < view.shape[d] else 1  # (else: one piece per element)
    for d in sorted(dims, key=lambda d: -(-view.shape[d] // runs[d])):
        n, run = view.shape[d], runs[d]
        pieces = -(-n // run)
        if pieces > budget:
            return None  # (sorted by pieces: no later dim fits either)
        parts = []
        for start in range(0, n, run):
            shape = list(view.shape)
            shape[d] = min(run, n - start)
            piece = View(
                tuple(shape),
                view.strides,
                view.offset + start * view.strides[d],
                view.dtype,
                flat.shape[0],
                view.dtype,
            )
            parts.append(_sliced(flat, piece, budget // pieces))
        if all(p is not None for p in parts):
            return jnp.concatenate(parts, axis=d)  # (at least two: n > 1, run < n or 1)
    return None


def spans_storage(view: View) -> bool:
    """True when the view holds every element of its storage exactly once, in the
    storage's dtype (a contiguous or permuted tensor over its whole storage): the
    host can then read it from the flat array by itself, no program needed."""
    return (
        view.offset == 0
        and not (view.conj or view.neg)
        and view.dtype == view.storage_dtype
        and math.prod(view.shape) == view.storage_numel
        and (view.storage_numel <= 1 or is_dense(view.shape, view.strides))
    )


# a storage at most this long is read to the host whole for any view of it: one
# transfer of a few bytes costs less than compiling and running a read program
HOST_READ_WHOLE_ELEMENTS = 64


def host_readable(view: View) -> bool:
    """True when the host can read the view from its storage's host copy: the view spans
    the storage (`spans_storage`), or the storage is tiny and the view plain (its dtype,
    no conjugate or negative bit): a compiled step's loss, packed with the device-check
    flag (`device_asserts.carried`), or an element of a small tensor."""
    return spans_storage(view) or (
        view.storage_numel <= HOST_READ_WHOLE_ELEMENTS
        and not (view.conj or view.neg)
        and view.dtype == view.storage_dtype
    )


def host_read(flat: np.ndarray, view: View) -> np.ndarray:
    """A view for which `host_readable` holds, read from its storage's host copy (any
    shape): a new C-contiguous array of view.shape (it never aliases the device buffer)."""
    flat = flat.reshape(-1)
    n = math.prod(view.shape)
    if n <= 1 or view.strides == contiguous_strides(view.shape):
        # (the common case, a copy; striding raw bytes cost a scalar's .item() 50 us)
        return np.array(flat[view.offset : view.offset + n].reshape(view.shape), copy=True)
    itemsize = flat.dtype.itemsize
    strides = tuple(s * itemsize for s in view.strides)
    # stride raw bytes: numpy's as_strided cannot rebuild ml_dtypes' types (float8_*,
    # bfloat16) from their array interface
    raw = flat.view(np.dtype((np.void, itemsize)))[view.offset :]
    seen = np.lib.stride_tricks.as_strided(raw, view.shape, strides, writeable=False)
    return np.array(seen, order="C", copy=True).view(flat.dtype)


def write(flat, view: View, value):
    """The storage array (same shape) after writing value (broadcast to view.shape)
    through the view."""
    if math.prod(view.shape) == 0:
        return flat
    value = _apply_bits(value.astype(view.dtype), view)
    return _write_stored(flat, view, jnp.broadcast_to(value, view.shape))


def _write_stored(flat, view: View, value):
    if flat.ndim != 1:
        if _is_the_array(flat, view):
            return value
        return _write_stored(flat.reshape(-1), view, value).reshape(flat.shape)
    typed = _reinterpret(flat, view.storage_dtype, view.dtype)
    order = _dense_order(view.shape, view.strides)
    broadcast = any(n != 1 and s == 0 for n, s in zip(view.shape, view.strides))
    if order is not None and not broadcast:
        dense = _in_order(value, order).reshape(-1)
        if dense.shape[0] == typed.shape[0]:
            typed = dense
        else:
            typed = lax.dynamic_update_slice(typed, dense, (view.offset,))
    elif not broadcast and (grid := _grid(view, typed.shape[0])) is not None:
        # (a broadcast dim would write one element many times: the scatter below)
        dense = _in_order(value, grid.order).reshape(grid.limits)
        region = lax.dynamic_update_slice(_region(typed, grid), dense, grid.corner)
        region = lax.slice(region.reshape(-1), (0,), (grid.end - grid.start,))
        typed = lax.dynamic_update_slice(typed, region, (grid.start,))
    else:
        typed = typed.at[_indices(view).reshape(-1)].set(value.reshape(-1))
    return _reinterpret(typed, view.dtype, view.storage_dtype)


def fresh_storage(value, strides: tuple[int, ...] | None):
    """value as the array of a new storage that holds it at the given strides (None:
    contiguous), offset 0: how a fresh output tensor keeps PyTorch's layout. A
    contiguous one is value itself (`layout_shape`)."""
    shape = tuple(value.shape)
    if layout_shape(shape, strides) == shape:
        return value
    span = storage_span(shape, strides, 0)
    view = View(shape, strides, 0, value.dtype, span, value.dtype)
    return write(jnp.zeros((span,), value.dtype), view, value)
