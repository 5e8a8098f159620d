"""Lowerings: shape family (joining, flipping, padding, triangles, view backwards).

View ops themselves (split, unbind, select, slice, diagonal...) stay views and
are not lowered; what is lowered here makes new tensors: concatenations,
copies, pads, and the backward/scatter ops that write a gradient or source
into a zero or given base through a view's geometry.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch._prims_common import canonicalize_dim, suggest_memory_format

from .pointwise import scalar_type_name
from .registry import in_memory_format, lower


def _dim(dim: int, ndim: int) -> int:
    return dim % ndim if ndim else 0


# --------------------------------------------------------------------- joining


def _refuses_out(tensors: list, out) -> bool:
    """Whether CPU's cat (stack and the *stack functions join by it) refuses out= for a
    dtype its inputs' promoted dtype cannot be cast to (`_out_dtype_error`)."""
    if not isinstance(out, torch.Tensor) or not tensors:
        return False
    joined = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    return not torch.can_cast(joined, out.dtype)


def _out_dtype_error(out: torch.Tensor) -> TypeError:
    """CPU's refusal, a TypeError in its words: the executor's check of out= variants
    says RuntimeError ("result type Float can't be cast..."), as other ops' kernels do."""
    return TypeError(
        f"torch.cat(): input types can't be cast to the desired output type "
        f"{scalar_type_name(out.dtype)}"
    )


def _check_cat(values: list) -> bool:
    """CPU's checks before the out= dtype's, in its words (the sizes come after): a
    non-empty list, no 0-dim input (the meta kernel failed indexing it), and the dim,
    wrapped by the first input that is not a legacy empty one."""
    tensors, dim = values[0], values[1]
    if not tensors:
        raise ValueError("torch.cat(): expected a non-empty list of Tensors")
    for position, t in enumerate(tensors):
        if t.ndim == 0:
            raise RuntimeError(
                f"zero-dimensional tensor (at position {position}) cannot be concatenated"
            )
    wrapping = next((t for t in tensors if t.shape != (0,)), None)
    if wrapping is not None:
        canonicalize_dim(wrapping.ndim, dim)
    out = values[2] if len(values) > 2 else None
    if _refuses_out(tensors, out):
        raise _out_dtype_error(out)
    return False


def _check_stack(values: list) -> bool:
    """The out= dtype CPU refuses; its checks of the inputs' sizes and dim come first
    (the meta kernel's, on stand-ins)."""
    tensors, out = values[0], values[2] if len(values) > 2 else None
    if _refuses_out(tensors, out):
        stand_ins = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in tensors]
        torch.stack(stand_ins, values[1])
        raise _out_dtype_error(out)
    return False


@lower("cat.default", check=_check_cat)
def cat(tensors, dim=0):
    """Legacy 1-D empty tensors join anything, as in PyTorch: they are skipped."""
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return tensors[0]
    return jnp.concatenate(kept, axis=_dim(dim, kept[0].ndim))


@lower("stack.default", check=_check_stack)
def stack(tensors, dim=0):
    return jnp.stack(tensors, axis=_dim(dim, tensors[0].ndim + 1))


@lower("repeat.default")
def repeat(self, repeats):
    lead = (1,) * (len(repeats) - self.ndim)
    return jnp.tile(self.reshape(lead + self.shape), tuple(repeats))


# ---------------------------------------------------------------- permutations


def _as_input_layout(values: list, result):
    """CPU lays the result of these ops out as the input's suggested memory format
    (channels_last stays channels_last, anything else is contiguous); PyTorch's meta
    kernels and decompositions give contiguous."""
    return in_memory_format(result, suggest_memory_format(values[0]))


@lower("flip.default")
def flip(self, dims):
    """A 0-d tensor flips to itself along its one (wrapped) dim, as on CPU."""
    if not dims or self.ndim == 0:
        return self
    return jnp.flip(self, tuple(_dim(d, self.ndim) for d in dims))


def _roll_layout(values: list, result):
    """CPU rolls over dims as `_as_input_layout`; a flat roll (no dims) is contiguous."""
    return _as_input_layout(values, result) if values[2] else result  # (self, shifts, dims)


@lower("roll.default", result_layout=_roll_layout)
def roll(self, shifts, dims=()):
    if not dims:
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), tuple(_dim(d, self.ndim) for d in dims))


@lower("pixel_shuffle.default", result_layout=_as_input_layout)
def pixel_shuffle(self, upscale_factor):
    """(*, C r^2, H, W) -> (*, C, H r, W r); its own lowering for CPU's channels_last
    result (PyTorch's decomposition, which CUDA runs too, gives contiguous)."""
    r = upscale_factor
    *batch, c, h, w = self.shape
    n = len(batch)
    x = self.reshape(*batch, c // (r * r), r, r, h, w)
    x = x.transpose(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return x.reshape(*batch, c // (r * r), h * r, w * r)


@lower("pixel_unshuffle.default", result_layout=_as_input_layout)
def pixel_unshuffle(self, downscale_factor):
    """(*, C, H r, W r) -> (*, C r^2, H, W), pixel_shuffle's inverse."""
    r = downscale_factor
    *batch, c, h, w = self.shape
    n = len(batch)
    x = self.reshape(*batch, c, h // r, r, w // r, r)
    x = x.transpose(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return x.reshape(*batch, c * r * r, h // r, w // r)


# ------------------------------------------------------------------- triangles


@lower("tril.default")
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lower("triu.default")
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


# ------------------------------------------------------------------------ pads


def _pairs(pad, ndim: int) -> list:
    """PyTorch's pad list (last dim first, (before, after) pairs) as per-dim pairs."""
    pairs = [(0, 0)] * ndim
    for k in range(len(pad) // 2):
        pairs[ndim - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    return pairs


@lower("constant_pad_nd.default")
def constant_pad_nd(self, pad, value=0):
    """lax.pad takes negative widths, which crop, as PyTorch's do."""
    config = [(lo, hi, 0) for lo, hi in _pairs(pad, self.ndim)]
    return lax.pad(self, jnp.asarray(value).astype(self.dtype), config)


def _source_positions(n: int, lo: int, hi: int, mode: str):
    """Per output position along one dim, the input position it copies: PyTorch's
    index formula, so negative widths crop exactly as PyTorch's do."""
    j = np.arange(n + lo + hi) - lo
    if mode == "edge":
        return np.clip(j, 0, n - 1)
    return (n - 1) - np.abs((n - 1) - np.abs(j))  # reflect about both ends


def _pad(self, padding, mode: str):
    for d, (lo, hi) in enumerate(_pairs(padding, self.ndim)):
        if lo or hi:
            self = jnp.take(self, _source_positions(self.shape[d], lo, hi, mode), axis=d)
    return self


def _pad_backward(grad_output, self, padding, mode: str):
    """The pad's own pullback: each input element gets the sum of its copies."""
    _, pullback = jax.vjp(lambda x: _pad(x, padding, mode), self.astype(grad_output.dtype))
    return pullback(grad_output)[0]


@lower(
    "reflection_pad1d.default", "reflection_pad2d.default", "reflection_pad3d.default",
    result_layout=_as_input_layout,
)
def reflection_pad(self, padding):
    return _pad(self, padding, "reflect")


@lower(
    "replication_pad1d.default", "replication_pad2d.default", "replication_pad3d.default",
    result_layout=_as_input_layout,
)
def replication_pad(self, padding):
    return _pad(self, padding, "edge")


@lower(
    "reflection_pad1d_backward.default",
    "reflection_pad2d_backward.default",
    "reflection_pad3d_backward.default",
)
def reflection_pad_backward(grad_output, self, padding):
    return _pad_backward(grad_output, self, padding, "reflect")


@lower(
    "replication_pad1d_backward.default",
    "replication_pad2d_backward.default",
    "replication_pad3d_backward.default",
)
def replication_pad_backward(grad_output, self, padding):
    return _pad_backward(grad_output, self, padding, "edge")


# ------------------------------------------ view geometry: copies and scatters


def _slice_index(shape, dim, start, end, step) -> tuple:
    dim = _dim(dim, len(shape))
    return (slice(None),) * dim + (slice(*slice(start, end, step).indices(shape[dim])),)


def _select_index(shape, dim, index) -> tuple:
    dim = _dim(dim, len(shape))
    return (slice(None),) * dim + (index % shape[dim],)


def _set_diagonal(base, src, offset, dim1, dim2):
    """base with its (offset, dim1, dim2) diagonal replaced by src's last dim."""
    dim1, dim2 = _dim(dim1, base.ndim), _dim(dim2, base.ndim)
    moved = jnp.moveaxis(base, (dim1, dim2), (-2, -1))
    n = src.shape[-1]
    rows = jnp.arange(n) + max(-offset, 0)
    cols = jnp.arange(n) + max(offset, 0)
    moved = moved.at[..., rows, cols].set(src.astype(base.dtype))
    return jnp.moveaxis(moved, (-2, -1), (dim1, dim2))


@lower("slice_backward.default")
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    index = _slice_index(input_sizes, dim, start, end, step)
    return jnp.zeros(tuple(input_sizes), grad_output.dtype).at[index].set(grad_output)


@lower("slice_scatter.default")
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    index = _slice_index(self.shape, dim, start, end, step)
    return self.at[index].set(src.astype(self.dtype))


@lower("select_backward.default")
def select_backward(grad_output, input_sizes, dim, index):
    where = _select_index(input_sizes, dim, index)
    return jnp.zeros(tuple(input_sizes), grad_output.dtype).at[where].set(grad_output)


@lower("select_scatter.default")
def select_scatter(self, src, dim, index):
    return self.at[_select_index(self.shape, dim, index)].set(src.astype(self.dtype))


@lower("diagonal_backward.default")
def diagonal_backward(grad_output, input_sizes, offset, dim1, dim2):
    base = jnp.zeros(tuple(input_sizes), grad_output.dtype)
    return _set_diagonal(base, grad_output, offset, dim1, dim2)


@lower("diagonal_scatter.default")
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    return _set_diagonal(self, src, offset, dim1, dim2)


@lower("diag_embed.default")
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    n = self.shape[-1] + abs(offset)
    base = jnp.zeros(self.shape[:-1] + (n, n), self.dtype)
    base = _set_diagonal(base, self, offset, -2, -1)
    ndim = self.ndim + 1
    return jnp.moveaxis(base, (-2, -1), (_dim(dim1, ndim), _dim(dim2, ndim)))


@lower("narrow_copy.default")
def narrow_copy(self, dim, start, length):
    dim = _dim(dim, self.ndim)
    start = start % self.shape[dim] if start < 0 else start
    return lax.slice_in_dim(self, start, start + length, axis=dim)


@lower("unfold_backward.default")
def unfold_backward(grad_in, input_sizes, dim, size, step):
    """Every window's gradient added back onto the positions it read."""
    if not input_sizes:  # a 0-d input unfolds into its one element
        return grad_in.reshape(())
    dim = _dim(dim, len(input_sizes))
    windows = grad_in.shape[dim]
    taken = (jnp.arange(windows)[:, None] * step + jnp.arange(size)[None, :]).reshape(-1)
    grad = jnp.moveaxis(grad_in, -1, dim + 1)
    grad = grad.reshape(grad.shape[:dim] + (windows * size,) + grad.shape[dim + 2 :])
    base = jnp.zeros(tuple(input_sizes), grad_in.dtype)
    return base.at[(slice(None),) * dim + (taken,)].add(grad)
