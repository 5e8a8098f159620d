"""Lowerings: reduction family (sums, statistics, extrema, scans, sorting, norms).

Torch conventions kept here: `dim=None` and (mostly) `dim=[]` reduce every axis, a
0-d tensor accepts dim 0/-1, integers and bool accumulate in int64, half
floats accumulate in float32, NaN is the largest value (it propagates
through min/max and sorts last ascending), and ties pick the first index.
"""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import torch
from jax import lax
from torch._prims_common import canonicalize_dim

from .. import dtypes, platform
from .pointwise import scalar_type_name
from .registry import lower

# ------------------------------------------------------------------ checks
# CPU's refusals that PyTorch's meta kernels let through (tpu returned a result):
# found by PyTorch's test_reductions run against tpu. Each returns False: the verdict
# depends on dtypes and shapes only, which are part of the cache key.


def _check_floating(values: list) -> bool:
    if not (values[0].dtype.is_floating_point or values[0].dtype.is_complex):
        raise RuntimeError("std and var only support floating point and complex dtypes")
    return False


def _check_dims(values: list) -> bool:
    if values[0].dim() > 64:
        raise RuntimeError("only tensors with up to 64 dims are supported")
    return False


def _check_not_bool(name: str):
    def check(values: list) -> bool:
        if values[0].dtype == torch.bool:
            raise RuntimeError(f"{name}(): does not support bool input")
        return False

    return check


def _check_reduced_dim(name: str, at: int = 1):
    """CPU's IndexError for a reduction over an empty dim (values[at]); the meta kernels
    of max/min/median/kthvalue/mode return an empty-looking result (or another error)."""

    def check(values: list) -> bool:
        self = values[0]
        dim = canonicalize_dim(self.dim(), values[at])  # (CPU's error for a dim out of range)
        if self.dim() and self.shape[dim] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {dim} to have non-zero size.")
        return False

    return check


def _check_empty_extremes(name: str, all_dims_error: type = RuntimeError):
    """CPU's errors for amax/amin/argmax/argmin with nothing to reduce (the meta kernels
    raise RuntimeError, or argmin's words "argmax", where CPU raises these)."""
    arg = name.startswith("arg")
    not_bool = _check_not_bool(name) if arg else None

    def check(values: list) -> bool:
        self, dim = values[0], values[1]
        _check_dims(values)  # (argmax's and argmin's meta kernels take more than 64)
        if not_bool is not None:
            not_bool(values)
        if self.numel():
            return False
        dims = [] if dim is None else [dim] if isinstance(dim, int) else list(dim)
        if not dims:
            raise all_dims_error(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0."
                + ("" if arg else " Specify the reduction dim with the 'dim' argument.")
            )
        for d in dims:
            d = canonicalize_dim(self.dim(), d)
            if self.dim() and self.shape[d] == 0:
                raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")
        return False

    return check


def _check_dim(at: int):
    """CPU's IndexError for a dim (values[at]) out of range, where the meta kernel wraps
    it (sort)."""

    def check(values: list) -> bool:
        canonicalize_dim(values[0].dim(), values[at])
        return False

    return check


def _check_topk(values: list) -> bool:
    """CPU's message for k out of range (the meta kernel words it otherwise)."""
    self, k, dim = values[0], values[1], values[2]
    dim = canonicalize_dim(self.dim(), dim)
    if not 0 <= k <= (self.shape[dim] if self.dim() else 1):
        raise RuntimeError("selected index k out of range")
    return False


def _check_logic_out(name: str, arity: int):
    """all/any's out= must be bool (uint8 for a uint8 input), as CPU demands; the
    out= variants share the functional lowering, whose arity tells out apart."""

    def check(values: list) -> bool:
        out = values[-1] if len(values) > arity else None
        if isinstance(out, torch.Tensor) and out.dtype != torch.bool:
            if not (out.dtype == torch.uint8 and values[0].dtype == torch.uint8):
                raise RuntimeError(
                    f"{name} only supports bool tensor for result, got: "
                    f"{scalar_type_name(out.dtype)}"
                )
        return False

    return check

_HALF = dtypes.HALF_FLOATS


# ------------------------------------------------------------------ helpers


def _axes(x, dim, empty_is_all: bool = True) -> tuple[int, ...]:
    """Normalised reduction axes: None means all of them, and so does [] except
    for the ops (all.dims, any.dims, as on CPU) where it means none; negatives wrap."""
    if isinstance(dim, int):
        dim = (dim,)
    if dim is None or (len(dim) == 0 and empty_is_all):
        return tuple(range(x.ndim))
    if x.ndim == 0:
        return ()
    return tuple(sorted({d % x.ndim for d in dim}))


def _axis(x, dim: int) -> int:
    """One axis; a 0-d tensor's callers make it 1-d first (see _as_1d)."""
    return dim % max(x.ndim, 1)


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _acc(x, dtype=None):
    """x in the type torch accumulates sums and products in."""
    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    elif not _is_float(x):
        x = x.astype(jnp.int64)
    return x.astype(jnp.float32) if x.dtype in _HALF else x


def _float(x, dtype=None):
    """x in the float type torch computes means, variances and norms in."""
    import torch

    if dtype is not None:
        x = x.astype(dtypes.to_jax(dtype))
    if x.dtype in _HALF:
        return x.astype(jnp.float32)
    if not _is_float(x):
        return x.astype(dtypes.to_jax(torch.get_default_dtype()))
    return x


def _count(x, axes) -> int:
    return math.prod(x.shape[a] for a in axes)


def _squeeze(x, axes, keepdim: bool):
    return x if keepdim else jnp.squeeze(x, axes)


def _as_1d(x):
    """Scans and selections along an axis treat a 0-d tensor as one element."""
    return x.reshape(1) if x.ndim == 0 else x


def _like_input(out, x):
    """Undo _as_1d: outputs of a 0-d input are 0-d."""
    return out.reshape(()) if x.ndim == 0 else out


# --------------------------------------------------------------------- sums

# XLA:CPU adds the elements of a reduced dim longer than this in a tree, those of
# shorter dims one after another: summing (5, 5, 10) equal values of 0.2 gives
# 50.000118, the same 250 as one dim 49.999985 (PyTorch: 50.000004).
_TREE_REDUCED_DIM = 32


def _whole(x, axes: tuple[int, ...]):
    """x ready for a float sum over all of `axes`: a full reduction of an array whose
    dims are all short reduces it flattened on XLA:CPU, as one long, tree-reduced dim.
    (The barrier keeps XLA from folding the reshape back into the reduction; on a TPU,
    which reduces in a tree anyway, the reshape would be a relayout: left alone.)"""
    if (
        len(axes) < 2
        or len(axes) != x.ndim
        or not _is_float(x)
        or max(x.shape) > _TREE_REDUCED_DIM
        or x.size <= _TREE_REDUCED_DIM
        or platform.platform() != "cpu"
    ):
        return x, axes
    return lax.optimization_barrier(x.reshape(-1)), (0,)


def _total(reduce, x, axes: tuple[int, ...], keepdim: bool):
    """reduce (jnp.sum, jnp.mean) over axes, of x flattened where `_whole` says so."""
    flat, reduced = _whole(x, axes)
    out = reduce(flat, axis=reduced, keepdims=keepdim and reduced == axes)
    return out.reshape((1,) * x.ndim) if keepdim and reduced != axes else out


@lower("sum.default")
def sum_all(self, dtype=None):
    return _total(jnp.sum, _acc(self, dtype), tuple(range(self.ndim)), False)


@lower("sum.dim_IntList")
def sum_dim(self, dim, keepdim=False, dtype=None):
    return _total(jnp.sum, _acc(self, dtype), _axes(self, dim), keepdim)


def _check_nansum(values: list) -> bool:
    """dim=[]: CPU's kernel sums every dim (as sum's does), PyTorch's meta kernel, which
    gives tpu its result shape, none: tpu returned the input unreduced (and nanmean,
    nansum / count, wrong numbers). Refused rather than answered differently."""
    if values[1] is not None and len(values[1]) == 0 and values[0].dim() > 0:
        raise RuntimeError(
            "tpu: nansum/nanmean with dim=[] is ambiguous in PyTorch 2.13 (CPU reduces every "
            "dim, its meta kernel none); pass dim=None to reduce every dim"
        )
    return _check_dims(values)


@lower("nansum.default", check=_check_nansum)
def nansum(self, dim=None, keepdim=False, dtype=None):
    return jnp.nansum(_acc(self, dtype), axis=_axes(self, dim), keepdims=keepdim)


@lower("mean.default")
def mean_all(self, dtype=None):
    return _total(jnp.mean, _float(self, dtype), tuple(range(self.ndim)), False)


@lower("mean.dim")
def mean_dim(self, dim, keepdim=False, dtype=None):
    return _total(jnp.mean, _float(self, dtype), _axes(self, dim), keepdim)


@lower("prod.default")
def prod_all(self, dtype=None):
    return jnp.prod(_acc(self, dtype))


@lower("prod.dim_int")
def prod_dim(self, dim, keepdim=False, dtype=None):
    return jnp.prod(_acc(self, dtype), axis=_axes(self, dim), keepdims=keepdim)


@lower("count_nonzero.dim_IntList", "count_nonzero.default")
def count_nonzero(self, dim=None):
    return jnp.sum(self != 0, axis=_axes(self, dim), dtype=jnp.int64)


@lower("logsumexp.default")
def logsumexp(self, dim, keepdim=False):
    return jax.nn.logsumexp(_float(self), axis=_axes(self, dim), keepdims=keepdim)


# ------------------------------------------------------------------ moments


def _var_mean(x, dim, correction, keepdim):
    """Two-pass variance (stable for large means) and the mean, in float."""
    x = _float(x)
    axes = _axes(x, dim)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    deviation = jnp.abs(x - mean)
    correction = 1 if correction is None else correction
    dof = jnp.maximum(_count(x, axes) - correction, 0)
    var = jnp.sum(deviation * deviation, axis=axes, keepdims=keepdim) / dof
    return var, _squeeze(mean, axes, keepdim)


def _check_moments(name: str, floating: bool = True):
    """CPU's dtype refusal (var, std) and its warning for no degrees of freedom, which
    CPU's kernel gives at every call (complex inputs reach it through PyTorch's
    decomposition already)."""

    def check(values: list) -> bool:
        if floating:
            _check_floating(values)
        self, dim, correction = values[0], values[1], values[2]
        if self.is_complex():
            return False
        dims = range(self.dim()) if dim is None or dim == [] else dim
        shape = self.shape if self.dim() else (1,)  # a 0-d tensor reduces over dim 0 / -1
        factor = math.prod(shape[canonicalize_dim(self.dim(), d)] for d in dims)
        if factor - (1 if correction is None else correction) > 0:
            return False
        warnings.warn(
            f"{name}(): degrees of freedom is <= 0. Correction should be strictly less than "
            "the reduction factor (input numel divided by output numel).",
            UserWarning,
            stacklevel=2,
        )
        return True  # (warn again at every call, as CPU)

    return check


@lower("var.correction", check=_check_moments("var"))
def var(self, dim=None, correction=None, keepdim=False):
    return _var_mean(self, dim, correction, keepdim)[0]


@lower("std.correction", check=_check_moments("std"))
def std(self, dim=None, correction=None, keepdim=False):
    return jnp.sqrt(_var_mean(self, dim, correction, keepdim)[0])


@lower("var_mean.correction", check=_check_moments("var_mean", floating=False))
def var_mean(self, dim=None, correction=None, keepdim=False):
    return _var_mean(self, dim, correction, keepdim)


@lower("std_mean.correction", check=_check_moments("std_mean", floating=False))
def std_mean(self, dim=None, correction=None, keepdim=False):
    var_, mean = _var_mean(self, dim, correction, keepdim)
    return jnp.sqrt(var_), mean


# ---------------------------------------------------------------- extrema


@lower("max.default")
def max_all(self):
    return jnp.max(self)


@lower("min.default")
def min_all(self):
    return jnp.min(self)


@lower("amax.default", check=_check_empty_extremes("amax"))
def amax(self, dim=(), keepdim=False):
    return jnp.max(self, axis=_axes(self, dim), keepdims=keepdim)


@lower("amin.default", check=_check_empty_extremes("amin"))
def amin(self, dim=(), keepdim=False):
    return jnp.min(self, axis=_axes(self, dim), keepdims=keepdim)


@lower("aminmax.default")
def aminmax(self, dim=None, keepdim=False):
    return amin(self, dim, keepdim), amax(self, dim, keepdim)


@lower("_aminmax.default")
def _aminmax_all(self):
    return jnp.min(self), jnp.max(self)


@lower("_aminmax.dim")
def _aminmax_dim(self, dim, keepdim=False):
    return aminmax(self, dim, keepdim)


def _arg(select, x, dim, keepdim):
    """Index of the first extreme (NaN counts as extreme) along dim, or of the flat tensor."""
    if dim is None:
        index = select(x.reshape(-1))
        return index.reshape((1,) * x.ndim) if keepdim else index
    x1 = _as_1d(x)
    index = select(x1, axis=_axis(x, dim), keepdims=keepdim)
    return _like_input(index, x)


@lower("argmax.default", check=_check_empty_extremes("argmax", IndexError))
def argmax(self, dim=None, keepdim=False):
    return _arg(jnp.argmax, self, dim, keepdim)


@lower("argmin.default", check=_check_empty_extremes("argmin", IndexError))
def argmin(self, dim=None, keepdim=False):
    return _arg(jnp.argmin, self, dim, keepdim)


def _value_index(select, x, dim, keepdim):
    """(values, indices) of min/max along dim, values read at the chosen indices."""
    x1 = _as_1d(x)
    axis = _axis(x, dim)
    index = select(x1, axis=axis, keepdims=True)
    values = jnp.take_along_axis(x1, index, axis=axis)
    if not keepdim:
        values, index = values.squeeze(axis), index.squeeze(axis)
    return _like_input(values, x), _like_input(index, x)


@lower("max.dim", check=_check_reduced_dim("max"))
def max_dim(self, dim, keepdim=False):
    return _value_index(jnp.argmax, self, dim, keepdim)


@lower("min.dim", check=_check_reduced_dim("min"))
def min_dim(self, dim, keepdim=False):
    return _value_index(jnp.argmin, self, dim, keepdim)


# ------------------------------------------------------------------- logic


@lower("all.default", check=_check_logic_out("all", 1))
def all_all(self):
    return jnp.all(self)


@lower("all.dim", check=_check_logic_out("all", 3))
def all_dim(self, dim, keepdim=False):
    return jnp.all(self, axis=_axes(self, dim), keepdims=keepdim)


@lower("all.dims", check=_check_logic_out("all", 3))
def all_dims(self, dim=None, keepdim=False):
    return jnp.all(self, axis=_axes(self, dim, False), keepdims=keepdim)


@lower("any.default", check=_check_logic_out("any", 1))
def any_all(self):
    return jnp.any(self)


@lower("any.dim", check=_check_logic_out("any", 3))
def any_dim(self, dim, keepdim=False):
    return jnp.any(self, axis=_axes(self, dim), keepdims=keepdim)


@lower("any.dims", check=_check_logic_out("any", 3))
def any_dims(self, dim=None, keepdim=False):
    return jnp.any(self, axis=_axes(self, dim, False), keepdims=keepdim)


def _check_one_value(values: list) -> bool:
    """_assert_async's refusals that the shape decides, as CPU's is_nonzero raises them."""
    count = values[0].numel()
    if count != 1:
        amount = "no values" if count == 0 else "more than one value"
        raise RuntimeError(f"Boolean value of Tensor with {amount} is ambiguous")
    return False  # (the shape is part of the key: repeat calls keep the fast path)


def _zero_device_check(self, assert_msg=None) -> list:
    """A zero raises CPU's message at the next read, as CUDA's device-side assert does
    at the next synchronization (engine/device_asserts.py)."""
    if assert_msg is None:
        message = "Expected Tensor with single nonzero value, but got zero"
    else:
        message = assert_msg or "Assertion is failed"
    return [(self.reshape(()) == 0, RuntimeError, message)]


@lower("_assert_async.default", "_assert_async.msg", check=_check_one_value,
       device_check=_zero_device_check)  # fmt: skip
def assert_async(self, assert_msg=None):
    """Nothing to compute but the device check. One_hot's decomposition asserts its
    classes with it: without a lowering, a compiled graph holding one ran op by op, and
    each call copied the value to the host."""
    return None


# ------------------------------------------------------------------- scans


@lower("cumsum.default")
def cumsum(self, dim, dtype=None):
    x = _acc(self, dtype)
    return _like_input(jnp.cumsum(_as_1d(x), axis=_axis(self, dim)), self)


@lower("cumprod.default")
def cumprod(self, dim, dtype=None):
    x = _acc(self, dtype)
    return _like_input(jnp.cumprod(_as_1d(x), axis=_axis(self, dim)), self)


@lower("logcumsumexp.default", "_logcumsumexp.default")
def logcumsumexp(self, dim):
    x = _float(self)
    return _like_input(lax.cumlogsumexp(_as_1d(x), axis=_axis(self, dim)), self)


def _cumulative_extreme(x, dim, better):
    """Running extreme with its index: a later element wins when it is NaN, or
    when it is at least as good as a non-NaN running value (torch's rule)."""
    x1 = _as_1d(x)
    axis = _axis(x, dim)
    index = lax.broadcasted_iota(jnp.int64, x1.shape, axis)

    def combine(earlier, later):
        (v0, i0), (v1, i1) = earlier, later
        take = jnp.isnan(v1) | (~jnp.isnan(v0) & better(v1, v0))
        return jnp.where(take, v1, v0), jnp.where(take, i1, i0)

    values, indices = lax.associative_scan(combine, (x1, index), axis=axis)
    return _like_input(values, x), _like_input(indices, x)


@lower("cummax.default")
def cummax(self, dim):
    return _cumulative_extreme(self, dim, jnp.greater_equal)


@lower("cummin.default")
def cummin(self, dim):
    return _cumulative_extreme(self, dim, jnp.less_equal)


# ----------------------------------------------------------------- sorting


def _sort_keys(x, descending: bool) -> tuple:
    """Keys whose stable ascending order is torch's order: NaN last (first when
    descending), -0.0 equal to 0.0. `~` reverses ints and bools without overflow."""
    if _is_float(x):
        nan = jnp.isnan(x)
        value = jnp.where(nan | (x == 0), jnp.zeros_like(x), x)
        return (~nan, -value) if descending else (nan, value)
    return (~x,) if descending else (x,)


def _sorted(x, axis: int, descending: bool):
    """Stable sort of a (≥1-d) array along axis: (values, int64 indices)."""
    keys = _sort_keys(x, descending)
    iota = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    *_, index = lax.sort((*keys, iota), dimension=axis, is_stable=True, num_keys=len(keys))
    return jnp.take_along_axis(x, index, axis=axis), index


def _sort(x, dim, descending):
    values, index = _sorted(_as_1d(x), _axis(x, dim), descending)
    return _like_input(values, x), _like_input(index, x)


@lower("sort.default", check=_check_dim(1))
def sort(self, dim=-1, descending=False):
    return _sort(self, dim, descending)


@lower("sort.stable", check=_check_dim(2))
def sort_stable(self, stable=None, dim=-1, descending=False):
    return _sort(self, dim, descending)


@lower("topk.default", check=_check_topk)
def topk(self, k, dim=-1, largest=True, sorted=True):
    if self.ndim == 0:  # (k is 0 or 1: CPU returns the element either way)
        return self, jnp.zeros((), jnp.int64)
    axis = _axis(self, dim)
    values, index = _sorted(self, axis, largest)
    values = lax.slice_in_dim(values, 0, k, axis=axis)
    index = lax.slice_in_dim(index, 0, k, axis=axis)
    return values, index


def _pick(values, index, position, axis: int, keepdim: bool):
    """Entries at `position` (an array broadcast over the other axes) along axis."""
    position = jnp.expand_dims(position, axis)
    picked_values = jnp.take_along_axis(values, position, axis=axis)
    picked_index = jnp.take_along_axis(index, position, axis=axis)
    if not keepdim:
        picked_values, picked_index = picked_values.squeeze(axis), picked_index.squeeze(axis)
    return picked_values, picked_index


def _rank_select(x, dim, keepdim, position_of):
    """Sort ascending along dim and pick, per row, position_of(non-NaN count, length)."""
    x1 = _as_1d(x)
    axis = _axis(x, dim)
    values, index = _sorted(x1, axis, False)
    n = x1.shape[axis]
    if _is_float(x1):
        valid = jnp.sum(~jnp.isnan(x1), axis=axis)
    else:
        valid = jnp.full(x1.shape[:axis] + x1.shape[axis + 1 :], n)
    v, i = _pick(values, index, position_of(valid, n), axis, keepdim)
    return _like_input(v, x), _like_input(i, x)


@lower("kthvalue.default", check=_check_reduced_dim("kthvalue", at=2))
def kthvalue(self, k, dim=-1, keepdim=False):
    return _rank_select(self, dim, keepdim, lambda valid, n: jnp.full_like(valid, k - 1))


def _median_position(valid, n):
    """The lower median, or the first NaN (sorted right after the valid values)."""
    return jnp.where(valid < n, valid, (n - 1) // 2)


def _nanmedian_position(valid, n):
    """The lower median of the non-NaN values; all-NaN rows give a NaN."""
    return jnp.where(valid == 0, (n - 1) // 2, (valid - 1) // 2)


@lower("median.dim", check=_check_reduced_dim("median"))
def median_dim(self, dim, keepdim=False):
    return _rank_select(self, dim, keepdim, _median_position)


@lower("nanmedian.dim", check=_check_reduced_dim("median"))
def nanmedian_dim(self, dim, keepdim=False):
    return _rank_select(self, dim, keepdim, _nanmedian_position)


def _median_all(x, position_of):
    if x.size == 0:
        return jnp.full((), jnp.nan, x.dtype)
    return _rank_select(x.reshape(-1), 0, False, position_of)[0]


@lower("median.default")
def median_all(self):
    return _median_all(self, _median_position)


@lower("nanmedian.default")
def nanmedian_all(self):
    return _median_all(self, _nanmedian_position)


@lower("mode.default", check=_check_reduced_dim("mode"))
def mode(self, dim=-1, keepdim=False):
    """Most frequent value (the smallest on ties) and its last index: the end
    of the longest run in the stably sorted row."""
    x1 = _as_1d(self)
    axis = _axis(self, dim)
    values, index = _sorted(x1, axis, False)
    position = lax.broadcasted_iota(jnp.int64, x1.shape, axis)
    previous = jnp.roll(values, 1, axis=axis)
    starts = (position == 0) | (values != previous)
    run_start = lax.cummax(jnp.where(starts, position, 0), axis=axis)
    best = jnp.argmax(position - run_start, axis=axis)
    v, i = _pick(values, index, best, axis, keepdim)
    return _like_input(v, self), _like_input(i, self)


# ------------------------------------------------------------------- norms


def _vector_norm(x, ord, dim, keepdim, dtype=None):
    """torch.linalg.vector_norm for a compile-time ord."""
    x = _float(jnp.abs(_float(x, dtype)))
    axes = _axes(x, dim)
    if ord == math.inf:
        return jnp.max(x, axis=axes, keepdims=keepdim)
    if ord == -math.inf:
        return jnp.min(x, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(x != 0, axis=axes, keepdims=keepdim).astype(x.dtype)
    if ord == 1:
        return jnp.sum(x, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(x * x, axis=axes, keepdims=keepdim))
    return jnp.sum(x**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


def _check_vector_norm_order(values: list) -> bool:
    """CPU's refusal of a complex order (PyTorch's meta kernel raises a TypeError)."""
    if len(values) > 1 and isinstance(values[1], complex):
        raise RuntimeError(
            "linalg.vector_norm: Expected a non-complex scalar as the order of norm."
        )
    return False


@lower("linalg_vector_norm.default", static_scalars=True, check=_check_vector_norm_order)
def linalg_vector_norm(self, ord=2, dim=None, keepdim=False, dtype=None):
    return _vector_norm(self, ord, dim, keepdim, dtype)


@lower("norm.Scalar", static_scalars=True)
def norm(self, p=2):
    return _vector_norm(self, p, None, False)


@lower("norm.ScalarOpt_dtype", static_scalars=True)
def norm_dtype(self, p, dtype):
    return _vector_norm(self, 2 if p is None else p, None, False, dtype)


@lower("norm.ScalarOpt_dim", static_scalars=True)
def norm_dim(self, p, dim, keepdim=False):
    return _vector_norm(self, 2 if p is None else p, dim, keepdim)


@lower("norm.ScalarOpt_dim_dtype", static_scalars=True)
def norm_dim_dtype(self, p, dim, keepdim, dtype):
    return _vector_norm(self, 2 if p is None else p, dim, keepdim, dtype)


@lower("_foreach_norm.Scalar", static_scalars=True)
def foreach_norm(self, ord=2, dtype=None):
    return [_vector_norm(t, ord, None, False, dtype) for t in self]
