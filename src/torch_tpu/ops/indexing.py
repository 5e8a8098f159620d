"""Lowerings: indexing family (advanced indexing, gather/scatter, masks, unique, bins).

Advanced indexing follows numpy's rules, as torch does, so an index list maps
onto a JAX index tuple once bool masks are turned into integer indices. Ops
whose result shape depends on values (index with a mask, nonzero, unique,
bincount) are dynamic-shape lowerings: they read the one number that sets the
shape (a host sync), then run a cached executable of that shape. Ops that only
write through a mask (index_put, masked_scatter) stay fully jitted by padding
the mask's positions to the mask's size and dropping the padding.
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import torch
from jax import lax
from torch._prims_common import canonicalize_dim

from .. import dtypes
from .pointwise import check_fill_value, scalar_type_name
from .registry import lower, result_prefix

_MASK_DTYPES = (jnp.bool_, jnp.uint8)


def _is_mask(ix) -> bool:
    return ix is not None and ix.dtype in _MASK_DTYPES


def _dim(dim: int, ndim: int) -> int:
    return dim % ndim if ndim else 0


def _index_tuple(indices) -> tuple:
    return tuple(slice(None) if ix is None else ix for ix in indices)


def _wrap_negative(ix, size: int):
    return jnp.where(ix < 0, ix + size, ix)


# ------------------------------------------------------------ index / index_put


@jax.jit
def _gather_indexed(self, indices):
    return self[_index_tuple(indices)]


@functools.partial(jax.jit, static_argnums=1)
def _count_nonzero(x, shape):
    return jnp.count_nonzero(jnp.broadcast_to(x, shape))


def _true_count(mask, shape=None) -> int:
    """How many elements are set: the one number a data-dependent shape needs.
    Reading it is the host sync such ops cost."""
    return int(_count_nonzero(mask, mask.shape if shape is None else shape))


@functools.partial(jax.jit, static_argnums=1)
def _argwhere(x, size):
    """The first `size` True positions, padded with zeros (valid positions)."""
    return jnp.argwhere(x, size=size, fill_value=0).astype(jnp.int64)


def _bucket(count: int) -> int:
    """A power of two >= count: results of data-dependent length are computed at this
    length and viewed at theirs (registry.result_prefix), so a new True count compiles
    nothing until it leaves its bucket."""
    return max(16, 1 << max(count - 1, 0).bit_length())


def _concrete_indices(indices) -> list:
    """Bool masks replaced by the integer indices of their True entries."""
    out = []
    for ix in indices:
        if _is_mask(ix):
            positions = _argwhere(ix, _true_count(ix))
            out.extend(positions[:, d] for d in range(ix.ndim))
        else:
            out.append(ix)
    return out


def _leading_mask(indices) -> bool:
    """A bool mask is the only index and indexes the leading dims (`x[mask]`): the result
    is the selected rows in order, contiguous, along axis 0. (With no elements there is
    no valid position to pad with.)"""
    given = [ix for ix in indices if ix is not None]
    mask = given[0] if len(given) == 1 else None
    return indices[0] is mask and _is_mask(mask) and mask.size > 0 and mask.ndim > 0


# ------------------------------------------------------------ argument checks


def _index_bounds(ix: torch.Tensor, dim: int, size: int) -> None:
    lo, hi = (int(v) for v in torch.aminmax(ix))
    for bad in (lo, hi):
        if not -size <= bad < size:
            raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")


def _check_indices(self: torch.Tensor, indices: list) -> None:
    """CPU's IndexErrors for an index list, before anything runs: masks that do not
    match the indexed shape, too many indices, indices into an empty dimension, and
    out-of-range values where they are on the host (free to read) or in debug mode
    (device values cost a sync: strict and fused modes leave them to XLA's clamping,
    see docs/differences.md)."""
    from ..engine import modes

    checked_values = modes.current is modes.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    shape, dim = tuple(self.shape), 0
    for ix in indices:
        if ix is None:
            dim += 1
            continue
        if ix.dtype not in _INDEX_DTYPES:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        if ix.dtype == torch.uint8:
            warnings.warn(  # (CPU's own warning, at each call)
                "indexing with dtype torch.uint8 is now deprecated, please use a dtype "
                "torch.bool instead.",
                UserWarning,
                stacklevel=2,
            )
        if ix.dtype in (torch.bool, torch.uint8):
            for k, size in enumerate(ix.shape):
                if dim + k < len(shape) and size != shape[dim + k]:
                    raise IndexError(
                        f"The shape of the mask {list(ix.shape)} at index {k} does not match "
                        f"the shape of the indexed tensor {list(shape)} at index {dim + k}"
                    )
            dim += ix.dim()
            continue
        if dim < len(shape) and ix.numel():
            if shape[dim] == 0:
                raise IndexError("index is out of bounds for dimension with size 0")
            if ix.is_cpu or checked_values:
                _index_bounds(ix, dim, shape[dim])
        dim += 1
    if dim > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)} (got {dim})")


_INDEX_DTYPES = (torch.int64, torch.int32, torch.uint8, torch.bool)


def _check_index(values: list) -> bool:
    _check_indices(values[0], values[1])
    return True  # depends on the index values: checked on every call


def _check_index_put(values: list) -> bool:
    """index_put's checks, and CPU's shape-mismatch error for values that do not
    broadcast to as many positions as a mask selects (one count read: CPU and CUDA
    read it too, to turn the mask into indices)."""
    self, indices, source = values[0], values[1], values[2]
    _check_indices(self, indices)
    if source.numel() == 1:
        accumulate = len(values) > 3 and bool(values[3])
        _check_single_byte_mask(indices, accumulate)
        if not accumulate and source.is_cpu and _lone_mask(indices):
            # CPU writes a value on the host through a lone mask with masked_fill_(mask,
            # value.item()): any dtype that converts, as CPU's masked_fill_ judges it
            host = torch.zeros((), dtype=self.dtype, device="cpu")
            host.masked_fill_(torch.tensor(True, device="cpu"), source.item())
        else:
            _check_same_dtype(self, source)
        return True
    shapes = []  # per index, the shape of the integer index it amounts to
    for ix in indices:
        if ix is None:
            shapes.append(None)
        elif ix.dtype in (torch.bool, torch.uint8):
            count = int(torch.count_nonzero(ix))
            shapes.extend((count,) for _ in ix.shape)
        else:
            shapes.append(tuple(ix.shape))
    _check_broadcast(tuple(source.shape), _indexed_meta_shape(tuple(self.shape), tuple(shapes)))
    _check_same_dtype(self, source)  # (after the shapes, as CPU: its message comes first)
    return True


def _lone_mask(indices: list) -> bool:
    given = [ix for ix in indices if ix is not None]
    return len(given) == 1 and given[0].dtype == torch.bool


def _check_single_byte_mask(indices: list, accumulate: bool) -> None:
    """CPU writes one value through a lone mask with masked_fill_, which refuses byte
    masks (`x[m] = 7.0` with a uint8 m raises there; tpu wrote it)."""
    given = [ix for ix in indices if ix is not None]
    if not accumulate and len(given) == 1 and given[0].dtype == torch.uint8:
        raise RuntimeError(
            "masked_fill_ only supports boolean masks, but got mask with dtype unsigned char"
        )


def _check_same_dtype(self, source) -> None:
    """CPU's check (tpu cast the values and wrote them silently)."""
    if source.dtype != self.dtype:
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{scalar_type_name(self.dtype)} for the destination and "
            f"{scalar_type_name(source.dtype)} for the source."
        )


@functools.lru_cache(maxsize=1024)
def _indexed_meta_shape(shape: tuple, index_shapes: tuple) -> tuple:
    """x[indices]'s shape by PyTorch's own rule (its meta kernel), per geometry."""
    meta = [
        None if s is None else torch.empty(s, dtype=torch.long, device="meta")
        for s in index_shapes
    ]
    return tuple(torch.ops.aten.index.Tensor(torch.empty(shape, device="meta"), meta).shape)


def _check_broadcast(source: tuple, target: tuple) -> None:
    shape = list(source)
    while len(shape) > len(target) and shape[0] == 1:  # leading 1s, as `x[i] = v` allows
        shape.pop(0)
    fits = len(shape) <= len(target) and all(
        s in (1, t) for s, t in zip(reversed(shape), reversed(target))
    )
    if not fits:
        raise RuntimeError(
            f"shape mismatch: value tensor of shape {list(source)} cannot be broadcast to "
            f"indexing result of shape {list(target)}"
        )


def _along_check(
    error: type, message: str | None = None, wraps: bool = False, prefix: str = ""
):
    """A check for ops indexing along one dim (gather, scatter, index_select...): CPU's
    error for an index into an empty dim, and, in debug mode, for out-of-range values;
    negative ones are out of range unless the op `wraps` them (index_fill), as on CPU.
    prefix: the op's name before CPU's words ("index_copy_(): ")."""
    lowest = -1 if wraps else 0

    def check(values: list) -> bool:
        from ..engine import modes

        self, dim, index = values[0], values[1], values[2]
        if self.dim() == 0 or index.numel() == 0:
            return False
        dim %= self.dim()
        size = self.shape[dim]
        if size == 0 or modes.current is modes.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING:
            lo, hi = (int(v) for v in torch.aminmax(index)) if size else (int(index.min()),) * 2
            for bad in (lo, hi):
                if not lowest * size <= bad < size:
                    raise error(
                        message
                        or f"{prefix}index {bad} is out of bounds for dimension {dim} with "
                        f"size {size}"
                    )
        return False

    return check


_check_gather = _along_check(RuntimeError)
_check_wrapping = _along_check(IndexError, wraps=True)  # (index_fill: CPU says IndexError)
_check_index_select = _along_check(IndexError, "index out of range in self")
_check_index_copy = _along_check(IndexError, prefix="index_copy_(): ")


def outside(index, lowest: int, size: int):
    """Traced: whether any value of index lies outside [lowest, size)."""
    return jnp.any((index < lowest) | (index >= size))


def _along_device_check(error: type, message: str | None = None, wraps: bool = False):
    """The device-side half of `_along_check` (engine/device_asserts.py): the same
    range, judged in the program (strict and fused modes, compiled graphs)."""

    def device_check(self, dim, index, *rest) -> list:
        dim %= max(self.ndim, 1)
        size = self.shape[dim] if self.ndim else 1
        words = message or f"an index is out of bounds for dimension {dim} with size {size}"
        return [(outside(index, -size if wraps else 0, size), error, words)]

    return device_check


_gather_device_check = _along_device_check(RuntimeError)
_index_select_device_check = _along_device_check(IndexError, "index out of range in self")
_index_fill_device_check = _along_device_check(IndexError, wraps=True)
_index_copy_device_check = _along_device_check(IndexError)


def _indices_device_check(self, indices, *rest) -> list:
    """x[indices]'s and index_put's integer indices against their dims, as
    `_check_indices` judges them (negatives from -size)."""
    failures, dim = [], 0
    for ix in indices:
        if ix is None:
            dim += 1
        elif ix.dtype == jnp.bool_ or ix.dtype == jnp.uint8:
            dim += ix.ndim
        else:
            size = self.shape[dim] if dim < self.ndim else 1
            words = f"an index is out of bounds for dimension {dim} with size {size}"
            failures.append((outside(ix, -size, size), IndexError, words))
            dim += 1
    return failures


def _has_mask(values) -> bool:
    return any(ix is not None and ix.dtype in (torch.bool, torch.uint8) for ix in values[1])


@lower(
    "index.Tensor",
    dynamic_shape=_has_mask,
    check=_check_index,
    device_check=_indices_device_check,
)
def index(self, indices):
    """Dynamic only when a bool mask's True count sets the shape; integer indices
    run as one cached executable (and fuse in fused mode)."""
    if _leading_mask(indices):
        mask = indices[0]
        count = _true_count(mask)
        positions = _argwhere(mask, _bucket(count))
        rows = _gather_indexed(self, [positions[:, d] for d in range(mask.ndim)])
        return result_prefix(rows, 0, count)
    return _gather_indexed(self, _concrete_indices(indices))


def _indexed_shape(shape, indices) -> tuple[tuple, int]:
    """numpy's result shape for per-dim indices, and the result axis the
    broadcast index shape ends on."""
    indices = list(indices) + [None] * (len(shape) - len(indices))
    adv = [d for d, ix in enumerate(indices) if ix is not None]
    bshape = jnp.broadcast_shapes(*(indices[d].shape for d in adv))
    rest = [shape[d] for d, ix in enumerate(indices) if ix is None]
    start = adv[0] if adv == list(range(adv[0], adv[-1] + 1)) else 0
    return tuple(rest[:start]) + bshape + tuple(rest[start:]), start + len(bshape) - 1


def _pad_axis(x, axis: int, size: int, fill=0):
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=fill)


def _mask_indices(mask, padded: int, first_dim: int, shape, spread: bool) -> list:
    """A mask's True positions, padded to `padded` entries with an out-of-range
    index that the scatter drops. With `spread`, a single True position
    broadcasts against the other index arrays, as PyTorch broadcasts it."""
    count = jnp.sum(mask != 0)
    keep = jnp.arange(padded) < count
    out = []
    for d, pos in enumerate(jnp.nonzero(mask, size=padded)):
        pos = jnp.where(keep, pos, shape[first_dim + d])
        out.append(jnp.where(count == 1, pos[0], pos) if spread else pos)
    return out


def _put_indices(shape, indices, values):
    """Per-dim integer indices for a scatter, and values to match them.

    Masks become padded positions (see _mask_indices); index arrays and
    values that run along the masked positions are padded to match, index
    arrays with out-of-range indices.
    """
    padded = max((ix.size for ix in indices if _is_mask(ix)), default=0)
    spread = any(
        ix is not None and not _is_mask(ix) and ix.ndim and ix.shape[-1] > 1 for ix in indices
    )
    out = []
    for ix in indices:
        if _is_mask(ix):
            out.extend(_mask_indices(ix, padded, len(out), shape, spread))
        elif ix is None:
            out.append(None)
        else:
            ix = _wrap_negative(ix, shape[len(out)])
            if padded and ix.ndim and ix.shape[-1] != 1:
                ix = _pad_axis(ix, ix.ndim - 1, padded, shape[len(out)])
            out.append(ix)
    if padded:
        result, axis = _indexed_shape(shape, out)
        axis -= len(result) - values.ndim
        if axis >= 0 and values.shape[axis] != 1:
            values = _pad_axis(values, axis, padded)
    return out, values


def _index_put(self, indices, values, accumulate):
    values = values.astype(self.dtype)
    if _fills_through_a_mask(self, indices, values, accumulate):
        # `x[mask] = v` with a mask of x's shape and one value (`x[x < 0] = 0`, PyTorch's
        # make_tensor avoiding zeros): a select, not the mask's positions and a scatter;
        # the same elements get the same value, and the program is a cheap one
        return jnp.where(indices[0] != 0, values.reshape(()), self)
    indices, values = _put_indices(self.shape, indices, values)
    target, _ = _indexed_shape(self.shape, indices)
    extra = values.ndim - len(target)
    if extra > 0:  # leading size-1 dims, as `x[i] = v` allows
        values = values.reshape(values.shape[extra:])
    where = _index_tuple(indices)
    if accumulate:
        return _reduce_at(self, where, values, "sum")
    return self.at[where].set(values, mode="drop")


def _fills_through_a_mask(self, indices, values, accumulate) -> bool:
    return (
        not accumulate
        and len(indices) == 1
        and _is_mask(indices[0])
        and indices[0].shape == self.shape
        and values.size == 1
    )


@lower("index_put.default", check=_check_index_put, device_check=_indices_device_check)
def index_put(self, indices, values, accumulate=False):
    return _index_put(self, indices, values, accumulate)


@lower(
    "_index_put_impl_.default", check=_check_index_put, device_check=_indices_device_check
)
def index_put_impl(self, indices, values, accumulate=False, unsafe=False):
    return _index_put(self, indices, values, accumulate)


# ------------------------------------------------------------- gather / scatter


def _dim_indices(index, dim: int) -> tuple:
    """Full per-dim indices addressing self[..., index[i], ...] along dim."""
    return tuple(
        index if d == dim else lax.broadcasted_iota(jnp.int64, index.shape, d)
        for d in range(index.ndim)
    )


def _scalar_safe(fn):
    """Scatters on 0-d tensors act as on one-element vectors; an empty index
    (of any rank, as PyTorch allows) changes nothing."""

    def wrapped(self, dim, index, *rest):
        if index.size == 0:
            return self
        if self.ndim and index.ndim:
            return fn(self, dim % self.ndim, index, *rest)
        rest = [jnp.atleast_1d(r) if getattr(r, "ndim", 1) == 0 else r for r in rest]
        out = fn(jnp.atleast_1d(self), 0, jnp.atleast_1d(index), *rest)
        return out.reshape(self.shape)

    return wrapped


@lower("gather.default", check=_check_gather, device_check=_gather_device_check)
def gather(self, dim, index, sparse_grad=False):
    if self.ndim == 0 or index.ndim == 0 or index.size == 0:
        return jnp.atleast_1d(self)[jnp.atleast_1d(index)].reshape(index.shape)
    return self[_dim_indices(index, dim % self.ndim)]


def _src(src, index, dtype):
    """The part of src the index addresses, in self's dtype (src may be larger)."""
    src = jnp.asarray(src)
    if src.ndim == 0:
        return src.astype(dtype)
    return src[tuple(slice(0, n) for n in index.shape)].astype(dtype)


@lower(
    "scatter.src", "scatter.value", check=_check_gather, device_check=_gather_device_check
)
@_scalar_safe
def scatter(self, dim, index, src):
    return self.at[_dim_indices(index, dim)].set(_src(src, index, self.dtype))


def _extreme(dtype, largest: bool):
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.inf if largest else -jnp.inf
    info = jnp.iinfo(dtype)
    return info.max if largest else info.min


_IDENTITY = {"sum": 0, "mean": 0, "prod": 1}


def _reduce_at(base, where, src, reduce: str, include_self: bool = True, wide: bool = False):
    """base with src combined into base[where] by reduce (sum, prod, mean, amax,
    amin), repeated positions combining too. Bools combine as integers, so a
    sum is an or and a product an and, as in PyTorch.

    wide: a float16/bfloat16 sum, product (and mean's sum) is taken in float32 and
    rounded once, as CPU's scatter kernels do; otherwise every step rounds, as CPU's
    index_add loops do (with many repeated positions the two differ by several units in
    the last place)."""
    if base.dtype == jnp.bool_:
        as_int = _reduce_at(base.astype(jnp.int32), where, src, reduce, include_self)
        return as_int != 0
    if wide and base.dtype in dtypes.HALF_FLOATS and reduce in ("sum", "mean", "prod"):
        step = "prod" if reduce == "prod" else "sum"
        total = _reduce_at(base.astype(jnp.float32), where, src, step, include_self)
        total = total.astype(base.dtype)
        return total if reduce != "mean" else _by_count(total, where, include_self)
    src = jnp.asarray(src).astype(base.dtype)
    if not include_self:
        identity = _IDENTITY.get(reduce, _extreme(base.dtype, reduce == "amin"))
        base = base.at[where].set(jnp.asarray(identity).astype(base.dtype), mode="drop")
    ref = base.at[where]
    combine = {"sum": ref.add, "mean": ref.add, "prod": ref.multiply, "amax": ref.max}
    out = combine.get(reduce, ref.min)(src, mode="drop")
    return out if reduce != "mean" else _by_count(out, where, include_self)


def _by_count(total, where, include_self: bool):
    """A scatter mean from its sums: each position divided by how many values it got."""
    count = jnp.zeros(total.shape, jnp.int64).at[where].add(1, mode="drop") + int(include_self)
    count = jnp.maximum(count, 1).astype(total.dtype)
    return total / count if jnp.issubdtype(total.dtype, jnp.inexact) else total // count


@lower(
    "scatter.reduce",
    "scatter.value_reduce",
    check=_check_gather,
    device_check=_gather_device_check,
)
@_scalar_safe
def scatter_reduce_legacy(self, dim, index, src, reduce):
    reduce = "sum" if reduce == "add" else "prod"
    src = _src(src, index, self.dtype)
    return _reduce_at(self, _dim_indices(index, dim), src, reduce, wide=True)


@lower("scatter_add.default", check=_check_gather, device_check=_gather_device_check)
@_scalar_safe
def scatter_add(self, dim, index, src):
    src = _src(src, index, self.dtype)
    return _reduce_at(self, _dim_indices(index, dim), src, "sum", wide=True)


_REDUCE_ALIASES = {"max": "amax", "min": "amin"}


def _check_scatter_reduce(values: list) -> bool:
    """CPU's kernel takes "max" and "min" for amax and amin; PyTorch's meta kernel refuses
    them, and words the refusal of other names without the name. The meta run follows
    this check on the same bound arguments, so it gets the names it knows."""
    reduce = values[4]
    if reduce in _REDUCE_ALIASES:
        values[4] = _REDUCE_ALIASES[reduce]
    elif reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise RuntimeError(
            f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}"
        )
    return _check_gather(values)


@lower(
    "scatter_reduce.two", check=_check_scatter_reduce, device_check=_gather_device_check
)
@_scalar_safe
def scatter_reduce(self, dim, index, src, reduce, include_self=True):
    reduce = _REDUCE_ALIASES.get(reduce, reduce)
    src = _src(src, index, self.dtype)
    return _reduce_at(self, _dim_indices(index, dim), src, reduce, include_self, wide=True)


# ------------------------------------------------------------- index_* along dim


def _along(fn):
    """fn(self with dim moved first, flat index, args moved alike), dim moved back."""

    def wrapped(self, dim, index, *rest):
        dim, shape = _dim(dim, self.ndim), self.shape

        def first(x):
            return jnp.moveaxis(jnp.atleast_1d(x), dim, 0)

        rest = [first(r) if getattr(r, "ndim", -1) == len(shape) else r for r in rest]
        out = fn(first(self), index.reshape(-1), *rest)
        return jnp.moveaxis(out, 0, dim).reshape(shape)

    return wrapped


@lower(
    "index_select.default",
    check=_check_index_select,
    device_check=_index_select_device_check,
)
def index_select(self, dim, index):
    if self.ndim == 0:
        return self
    return jnp.take(self, index.reshape(-1), axis=dim % self.ndim, mode="clip")


@lower(
    "index_add.default",
    static_scalars=True,  # (alpha == 1 picks CPU's kernel: below)
    check=_check_index_select,
    device_check=_index_select_device_check,
)
def index_add(self, dim, index, source, alpha=1):
    """CPU hands index_add to its scatter_add kernel (half precision summed in float32)
    when self has dims beyond the indexed one, that one is the first or the last, the
    index is int64 and alpha is 1; otherwise its loop rounds after every add."""
    wide = (
        self.ndim > 1
        and _dim(dim, self.ndim) in (0, self.ndim - 1)
        and index.dtype == jnp.int64
        and alpha == 1
    )
    return _index_add(self, dim, index, source, alpha, wide)


@_along
def _index_add(self, index, source, alpha, wide: bool):
    return _reduce_at(self, index, source * alpha, "sum", wide=wide)


@lower(
    "index_reduce.default",
    check=_check_index_select,
    device_check=_index_select_device_check,
)
@_along
def index_reduce(self, index, source, reduce, include_self=True):
    return _reduce_at(self, index, source, reduce, include_self)


@lower("index_copy.default", check=_check_index_copy, device_check=_index_copy_device_check)
@_along
def index_copy(self, index, source):
    return self.at[index].set(source.astype(self.dtype), mode="drop")


def _check_index_fill(values: list) -> bool:
    self, value = values[0], values[3]
    complex_value = value.is_complex() if isinstance(value, torch.Tensor) else (
        isinstance(value, complex)
    )
    if complex_value and not self.is_complex():
        raise RuntimeError(
            "index_fill_(): Converting complex Scalar to non-complex type is not supported"
        )
    return _check_wrapping(values) | check_fill_value(value, self.dtype)


@lower(
    "index_fill.int_Scalar",
    "index_fill.int_Tensor",
    check=_check_index_fill,
    device_check=_index_fill_device_check,
)
@_along
def index_fill(self, index, value):
    return self.at[_wrap_negative(index, self.shape[0])].set(
        jnp.asarray(value).astype(self.dtype), mode="drop"
    )


# ----------------------------------------------------------------------- masks


@lower(
    "masked_fill.Scalar",
    "masked_fill.Tensor",
    check=lambda values: check_fill_value(values[2], values[0].dtype),
)
def masked_fill(self, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(self.dtype), self)


def _mask_positions(mask):
    """Per element of the flat mask: its rank among the True elements."""
    return jnp.cumsum(mask.reshape(-1), dtype=jnp.int64) - 1


def _check_masked_scatter(values: list) -> bool:
    """CPU's error for a source shorter than the mask's count of ones (the lowering would
    reuse the source's last value): one count read per call, as index_put's masks."""
    self, mask, source = values
    ones = int(torch.count_nonzero(mask.expand(torch.broadcast_shapes(self.shape, mask.shape))))
    if ones > source.numel():
        raise RuntimeError("Number of elements of source < number of ones in mask")
    return True


@lower("masked_scatter.default", check=_check_masked_scatter)
def masked_scatter(self, mask, source):
    self, mask = jnp.broadcast_arrays(self, mask)
    if source.size == 0:  # nothing to pick from: the mask is all False (else CPU refuses)
        return self
    picked = source.reshape(-1)[jnp.clip(_mask_positions(mask), 0, source.size - 1)]
    return jnp.where(mask, picked.reshape(self.shape).astype(self.dtype), self)


@lower("masked_scatter_backward.default")
def masked_scatter_backward(grad_output, mask, sizes):
    numel = math.prod(sizes)
    mask = jnp.broadcast_to(mask, grad_output.shape).reshape(-1)
    where = jnp.where(mask, _mask_positions(mask), numel)
    flat = jnp.zeros((numel,), grad_output.dtype).at[where].set(
        grad_output.reshape(-1), mode="drop"
    )
    return flat.reshape(tuple(sizes))


@functools.partial(jax.jit, static_argnums=2)
def _masked_select(self, mask, size):
    self, mask = jnp.broadcast_arrays(self, mask)
    return self.reshape(-1)[jnp.nonzero(mask.reshape(-1), size=size, fill_value=0)[0]]


@lower("masked_select.default", dynamic_shape=True)
def masked_select(self, mask):
    count = _true_count(mask, jnp.broadcast_shapes(self.shape, mask.shape))
    return result_prefix(_masked_select(self, mask, _bucket(count)), 0, count)


# Up to this many elements, nonzero computes its count and every possible position in
# one program (one per shape: no second program per bucket of the count). Its result
# is a view of that buffer, 8 bytes x ndim per input element (32 KiB per dim at most),
# which the result keeps alive however few positions it holds
_ONE_PROGRAM_NONZERO = 1 << 12


@jax.jit
def _count_and_argwhere(x):
    positions = jnp.argwhere(x, size=x.size, fill_value=0).astype(jnp.int64)
    return jnp.count_nonzero(x), positions


@lower("nonzero.default", dynamic_shape=True)
def nonzero(self):
    if 0 < self.size <= _ONE_PROGRAM_NONZERO and self.ndim:
        count, positions = _count_and_argwhere(self)
        return result_prefix(positions, 0, int(count))
    count = _true_count(self)
    return result_prefix(_argwhere(self, _bucket(count)), 0, count)


@lower("nonzero_static.default")
def nonzero_static(self, size, fill_value=-1):
    return jnp.argwhere(self, size=size, fill_value=fill_value).astype(jnp.int64)


# --------------------------------------------------------------------- take/put


def _take_device_check(self, index, *rest) -> list:
    n = self.size
    words = f"out of range: an index on a tensor of {n} elements"
    return [(outside(index, -n, n), IndexError, words)]


@lower("take.default", device_check=_take_device_check)
def take(self, index):
    return self.reshape(-1)[index]


@lower("put.default", device_check=_take_device_check)
def put(self, index, source, accumulate=False):
    flat = self.reshape(-1)
    where = _wrap_negative(index, flat.size).reshape(-1)
    source = source.reshape(-1).astype(self.dtype)
    out = _reduce_at(flat, where, source, "sum") if accumulate else flat.at[where].set(source)
    return out.reshape(self.shape)


# ---------------------------------------------------------------------- unique

def _empty_index() -> jax.Array:
    """An empty int64 result; made per call, as a module constant would start JAX's
    backend at import (before tpu_dist can initialise jax.distributed)."""
    return jnp.zeros((0,), jnp.int64)


@functools.partial(jax.jit, static_argnums=1)
def _runs(rows, sort: bool):
    """Rows grouped into runs of equal rows, after sorting them if asked (stably, with
    -0.0 equal to 0.0): each run's first row, each row's run, each run's length
    (padded to len(rows)), and the number of runs."""
    n = rows.shape[0]
    order = jnp.lexsort(rows.T[::-1]) if sort else jnp.arange(n)
    ordered = rows[order]
    starts = jnp.concatenate([jnp.ones((1,), bool), (ordered[1:] != ordered[:-1]).any(axis=1)])
    run = jnp.cumsum(starts, dtype=jnp.int64) - 1
    inverse = jnp.zeros((n,), jnp.int64).at[order].set(run)
    counts = jnp.zeros((n,), jnp.int64).at[run].add(1)
    # each run's first row, as CPU keeps it (-0.0 of -0.0 == 0.0); a scatter of every
    # row to its run's slot would keep an unspecified one (XLA:CPU: the last)
    firsts = ordered[jnp.nonzero(starts, size=n, fill_value=0)[0]]
    return firsts, inverse, counts, run[-1] + 1


def _unique(self, dim, sort: bool, return_inverse: bool, return_counts: bool):
    """Unique elements (dim None) or slices along dim, with torch's extra outputs;
    outputs not asked for are empty, as PyTorch returns them."""
    moved = self.reshape(-1) if dim is None else jnp.moveaxis(self, dim, 0)
    n = moved.shape[0]
    if n == 0:
        inverse = _empty_index().reshape(self.shape) if dim is None else _empty_index()
        return self.reshape(-1) if dim is None else self, inverse, _empty_index()
    firsts, inverse, counts, runs = _runs(moved.reshape(n, -1), sort)
    k = int(runs)
    values = firsts[:k].reshape((k,) + moved.shape[1:])
    if dim is not None:
        values = jnp.moveaxis(values, 0, dim)
    inverse = inverse.reshape(self.shape) if dim is None else inverse
    return (
        values,
        inverse if return_inverse else _empty_index(),
        counts[:k] if return_counts else _empty_index(),
    )


@lower("_unique2.default", dynamic_shape=True)
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    """Always sorted: a valid order for sorted=False too."""
    return _unique(self, None, True, return_inverse, return_counts)


@lower("_unique.default", dynamic_shape=True)
def unique(self, sorted=True, return_inverse=False):
    return _unique(self, None, True, return_inverse, False)[:2]


def _check_unique_dim(at: int):
    """CPU's refusals of unique along a dim (values[at]; no meta kernel has them): a dim
    out of range (a 0-d tensor has none), and an empty dim other than the one selected."""

    def check(values: list) -> bool:
        self, dim = values[0], values[at]
        if dim is None:
            return False
        dim = canonicalize_dim(self.dim(), dim, wrap_scalar=False)
        empty = list(self.shape).count(0)
        if self.shape[dim] == 0 and empty > 1:
            raise RuntimeError(
                "Number of zero sized dimensions is more than one, so unique cannot be applied "
            )
        if self.shape[dim] != 0 and empty:
            raise RuntimeError(
                "There are 0 sized dimensions, and they aren't selected, so unique cannot be "
                "applied"
            )
        return False

    return check


@lower("unique_dim.default", dynamic_shape=True, check=_check_unique_dim(1))
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    """Inverse and counts are always computed, as PyTorch's kernel does."""
    return _unique(self, _dim(dim, self.ndim), True, True, True)


@lower("unique_consecutive.default", dynamic_shape=True, check=_check_unique_dim(3))
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    dim = None if dim is None else _dim(dim, self.ndim)
    return _unique(self, dim, False, return_inverse, return_counts)


# ---------------------------------------------------------- searching, binning


def _binary_search(sequence, values, right: bool):
    """Per value, the first position whose entry is not below it (above it when right),
    found as CPU finds it: a binary search with plain comparisons, so a NaN in the
    sequence reads as below every value (jnp.searchsorted orders NaN last). sequence is
    (n,) or (rows, n) with values (rows, m); n.bit_length() halvings empty every range."""
    n = sequence.shape[-1]
    start = jnp.zeros(values.shape, jnp.int64)
    end = jnp.full(values.shape, n, jnp.int64)
    if n == 0:
        return start

    def halve(_, bounds):
        start, end = bounds
        mid = start + (end - start) // 2
        at = jnp.minimum(mid, n - 1)  # (a finished search reads a valid entry, unused)
        entry = sequence[at] if sequence.ndim == 1 else jnp.take_along_axis(sequence, at, -1)
        after = ~(entry > values) if right else ~(entry >= values)
        searching = start < end
        start = jnp.where(searching & after, mid + 1, start)
        return start, jnp.where(searching & ~after, mid, end)

    return lax.fori_loop(0, n.bit_length(), halve, (start, end))[0]


def _search(sorted_sequence, values, right, side, sorter, out_int32):
    right = side == "right" if side else right
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    out_dtype = jnp.int32 if out_int32 else jnp.int64
    if sorted_sequence.ndim == 1:
        return _binary_search(sorted_sequence, values, right).astype(out_dtype)
    rows = math.prod(sorted_sequence.shape[:-1])  # (sizes spelt out: -1 fails on empty)
    found = _binary_search(
        sorted_sequence.reshape(rows, sorted_sequence.shape[-1]),
        values.reshape(rows, values.shape[-1]),
        right,
    )
    return found.reshape(values.shape).astype(out_dtype)


def _cpu_stand_in(t: torch.Tensor) -> torch.Tensor:
    """Zeros laid out as t (strides too: CPU's kernel warns about non-contiguous inputs)."""
    if t.numel() == 0:
        return torch.zeros(t.shape, dtype=t.dtype, device="cpu")
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return torch.zeros(span, dtype=t.dtype, device="cpu").as_strided(t.shape, t.stride())


def _cpu_stand_ins(values: list) -> list:
    return [_cpu_stand_in(v) if isinstance(v, torch.Tensor) else v for v in values]


def _check_searchsorted(values: list) -> bool:
    """CPU's argument checks, which PyTorch's meta kernel lacks (side's words, side
    against right, the sorter's dtype and size, the leading dims, a scalar against
    n-d boundaries; tpu computed all of them): CPU's kernel run on zeros of the call's
    shapes at a key's first call. They read no values; the sorter's are checked on
    the device."""
    sequence, value, out_int32, right, side, sorter = _cpu_stand_ins(values[:6])
    # out= (a 7th value): an empty stand-in of its dtype, for CPU's dtype check
    out = {"out": torch.empty(0, dtype=values[6].dtype)} if len(values) > 6 else {}
    torch.searchsorted(
        sequence, value, out_int32=out_int32, right=right, side=side, sorter=sorter, **out
    )
    return False


def _searchsorted_device_check(sorted_sequence, self, out_int32, right, side, sorter) -> list:
    if sorter is None:
        return []
    bad = outside(sorter, 0, sorted_sequence.shape[-1])
    return [(bad, RuntimeError, "torch.searchsorted(): sorter index out of range")]


def _check_bucketize(values: list) -> bool:
    """As `_check_searchsorted`: CPU refuses boundaries of more than one dim."""
    value, boundaries, out_int32, right = _cpu_stand_ins(values)[:4]  # (out= has a 5th)
    torch.bucketize(value, boundaries, out_int32=out_int32, right=right)
    return False


@lower(
    "searchsorted.Tensor",
    "searchsorted.Scalar",
    check=_check_searchsorted,
    device_check=_searchsorted_device_check,
)
def searchsorted(sorted_sequence, self, out_int32=False, right=False, side=None, sorter=None):
    dtype = jnp.result_type(sorted_sequence, self)
    values = jnp.asarray(self).astype(dtype)
    return _search(sorted_sequence.astype(dtype), values, right, side, sorter, out_int32)


@lower("bucketize.Tensor", "bucketize.Scalar", check=_check_bucketize)
def bucketize(self, boundaries, out_int32=False, right=False):
    dtype = jnp.result_type(boundaries, self)
    values = jnp.asarray(self).astype(dtype)
    return _search(boundaries.astype(dtype), values, right, None, None, out_int32)


@functools.partial(jax.jit, static_argnums=2)
def _bincount(self, weights, length: int):
    if weights is None:
        return jnp.zeros((length,), jnp.int64).at[self].add(1)
    dtype = weights.dtype if weights.dtype in (jnp.float32, jnp.float64) else jnp.float64
    return jnp.zeros((length,), dtype).at[self].add(weights.astype(dtype))


def _check_bincount(values: list) -> bool:
    """CPU's refusals (a 2-D input was counted flattened, a negative minlength gave a
    result, a float input failed inside the lowering)."""
    self, weights, minlength = values[0], values[1], values[2]
    if self.is_floating_point() or self.is_complex() or self.dtype == torch.bool:
        raise NotImplementedError(
            f'"bincount_cpu" not implemented for \'{scalar_type_name(self.dtype)}\''
        )
    if self.dim() != 1 or (self.numel() and int(self.min()) < 0):
        # (one more host read: bincount reads the max)
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    return True


@lower("bincount.default", dynamic_shape=True, check=_check_bincount)
def bincount(self, weights=None, minlength=0):
    return _bincount(self, weights, max(int(self.max()) + 1 if self.size else 0, minlength))


def _check_repeat_interleave(values: list) -> bool:
    """CPU's refusals that need no values: the repeats' rank and dtype."""
    repeats = values[0]
    if repeats.dim() != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if repeats.dtype not in (torch.int32, torch.int64):
        raise NotImplementedError(
            f'"repeat_interleave_cpu" not implemented for \'{scalar_type_name(repeats.dtype)}\''
        )
    return False


@jax.jit
def _sum_and_min(repeats):
    return jnp.stack([jnp.sum(repeats, dtype=jnp.int64), jnp.min(repeats).astype(jnp.int64)])


def _repeated_positions(repeats, size: int):
    """Each position of `repeats` repeated its count of times, to `size` elements."""
    positions = jnp.arange(repeats.shape[0], dtype=repeats.dtype)
    return jnp.repeat(positions, repeats, total_repeat_length=size)


_bucketed_positions = jax.jit(_repeated_positions, static_argnums=1)


def _size_unknown(values: list) -> bool:
    """Without output_size the result's length is the repeats' sum, read on the host.
    (Empty repeats give an empty result whatever output_size says, as on CPU.)"""
    repeats, output_size = values
    return output_size is None or repeats.numel() == 0


def _repeat_interleave_device_check(repeats, output_size=None) -> list:
    """With output_size, CPU's two value checks judged on the device, in its order."""
    return [
        (jnp.sum(repeats, dtype=jnp.int64) != output_size, RuntimeError,
         "allocated size does not match required size"),
        (jnp.any(repeats < 0), RuntimeError, "repeats can not be negative"),
    ]  # fmt: skip


@lower(  # (its meta kernel refuses every call without output_size: our check is CPU's)
    "repeat_interleave.Tensor",
    dynamic_shape=_size_unknown,
    skip_meta=True,
    check=_check_repeat_interleave,
    device_check=_repeat_interleave_device_check,
    device_check_applies=lambda values: not _size_unknown(values),
)
def repeat_interleave(repeats, output_size=None):
    """The indices `repeat_interleave(x, repeats)` gathers with. Given output_size (a
    compiled graph's call, or a user's) the length is known and nothing syncs, as on
    CUDA; CPU's checks of it run on the device. Otherwise it is the repeats' sum: one
    host read (sum and minimum together), as CPU's."""
    if output_size is not None and repeats.size:
        return _repeated_positions(repeats, output_size)
    if repeats.size == 0:  # (CPU's checks, output_size's too, need an element)
        return jnp.zeros((0,), repeats.dtype)
    total, smallest = (int(v) for v in _sum_and_min(repeats))
    if smallest < 0:
        raise RuntimeError("repeats can not be negative")
    if total == 0:
        return jnp.zeros((0,), repeats.dtype)
    return result_prefix(_bucketed_positions(repeats, _bucket(total)), 0, total)


def _check_histc(values: list) -> bool:
    """CPU's refusal of a range that is not finite; with the automatic range (min == max)
    that means reading the data's extremes, as CPU does (one host read): a NaN or inf
    in the data gave an all-zero or partial histogram here."""
    self, low, high = values[0], values[2], values[3]
    if low > high:  # (every call: the bounds are not part of the cache key)
        raise RuntimeError("torch.histc: max must be larger than min")
    if low == high and self.numel():
        low, high = (float(v) for v in torch.aminmax(self.detach()))
    if not (math.isfinite(low) and math.isfinite(high)):
        raise RuntimeError(
            f"torch.histc: range of [{_as_cpp(low)}, {_as_cpp(high)}] is not finite"
        )
    return True


def _as_cpp(value: float) -> str:
    """A float as C++'s stream prints it (1, inf, -nan)."""
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return f"{value:g}"


@lower("histc.default", check=_check_histc)
def histc(self, bins=100, min=0, max=0):
    """An integer input (CUDA's kernel; CPU refuses one: engine/refusals.py) bins as CUDA's
    does, in int64 with the bounds truncated: (v - min) * bins // (max - min)."""
    integer = jnp.issubdtype(self.dtype, jnp.integer)
    x = self.reshape(-1).astype(jnp.int64) if integer else self.reshape(-1)
    low = jnp.asarray(min).astype(x.dtype)  # (float to integer truncates, as C++'s cast)
    high = jnp.asarray(max).astype(x.dtype)
    unset = low == high
    top = jnp.iinfo(x.dtype).max if integer else jnp.inf
    low = jnp.where(unset, jnp.min(x, initial=top), low)
    high = jnp.where(unset, jnp.max(x, initial=-top), high)
    flat = low == high
    low, high = jnp.where(flat, low - 1, low), jnp.where(flat, high + 1, high)
    if integer:
        pos = (x - low) * bins // (high - low)
    else:
        pos = jnp.floor((x - low) * bins / (high - low)).astype(jnp.int64)
    pos = jnp.where(x == high, bins - 1, pos)
    pos = jnp.where((x >= low) & (x <= high), pos, bins)
    return jnp.zeros((bins,), self.dtype).at[pos].add(1, mode="drop")
