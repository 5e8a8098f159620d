"""First calls of data-movement programs, served on the host without a compile.

A strict op's first call at a new shape compiles an XLA program (25-30 ms on
XLA:CPU even for a flip: most of it is the compiler's fixed cost per program).
Many such programs only move data: flip, cat, stack, roll, repeat, a copy
through strides, a zero fill. Their results are the input elements, moved; no
arithmetic can round differently. So the first call evaluates the op's own
program -- the jaxpr its registry lowering traces to, stride machinery
included -- with numpy on the host copies of its inputs, and uploads the
results. The executable is compiled at the signature's next call after
`calls_before_compile()` of them, so a loop compiles a little later than
before and runs it from then on.

Only programs whose every primitive is data movement (or integer index
arithmetic, which numpy computes with the same wraparound) qualify, and only
small ones: the host copies cost a transfer each way. Anything else returns
None and compiles as before. Arithmetic on floats never runs here: XLA
flushes subnormals and approximates transcendentals, numpy does not.
"""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.extend.core import Literal

from .. import env, metrics, platform

# inputs and results together, in bytes: beyond it the host copies cost more than a
# compile saves, on an accelerator whose transfers are slow
_MAX_BYTES = 1 << 22

# numpy's arrays have at most 64 dims (32 before numpy 2)
_MAX_DIMS = 32


@functools.cache
def calls_before_compile() -> int:
    """Calls of one signature served here before it compiles (TORCH_TPU_HOSTED_CALLS,
    default 2; 0 compiles every first call). A test or a script's set-up often repeats
    a call once (dims spelled another way, a comparison), a loop many times; each
    served call copies its data twice. A job that must compile everything during a
    warm-up of one step sets 0."""
    return env.integer("TORCH_TPU_HOSTED_CALLS", 2, 0)


class HostPlan:
    """A data-movement program's jaxpr, evaluated with numpy for each call."""

    def __init__(self, closed, out_tree) -> None:
        self.closed = closed
        self.out_tree = out_tree
        jaxpr = closed.jaxpr
        used = {id(v) for eqn in jaxpr.eqns for v in eqn.invars} | {id(v) for v in jaxpr.outvars}
        self.read = [i for i, v in enumerate(jaxpr.invars) if id(v) in used]  # (XLA drops
        # the others: they decide nothing about its results)

    def __call__(self, args: tuple):
        """The program's results for args, on the device; None (the caller compiles)
        if numpy typed one of them otherwise than XLA would, or failed."""
        closed = self.closed
        leaves = jax.tree.leaves(args)
        host = [np.asarray(a, dtype=aval.dtype) for a, aval in zip(leaves, closed.in_avals)]
        try:
            results = _evaluate(closed.jaxpr, closed.consts, host)
        except _Inexact:
            return None
        except Exception:  # (a numpy form of ours that fails must not fail a call XLA runs)
            metrics.count("first_calls_on_host_failed")
            return None
        for value, aval in zip(results, closed.out_avals):
            if value.shape != aval.shape or value.dtype != aval.dtype:
                return None
        metrics.count("first_calls_on_host")
        # committed as the executable's results would be: when an input it reads is
        # (uploads are; a factory's results are not); copies, never views of an input
        committed = any(getattr(leaves[i], "_committed", False) for i in self.read)
        on_device = [platform.put(np.array(v, order="C"), committed) for v in results]
        return jax.tree.unflatten(self.out_tree, on_device)


def plan(program, args: tuple) -> tuple[HostPlan | None, object]:
    """(How to run program(*args) on the host, or None when it does anything but move
    data or is too big to copy both ways; the program traced at args, for the cache to
    compile without tracing it again, or None when it was not traced)."""
    if sum(_nbytes(a) if hasattr(a, "dtype") else 8 for a in jax.tree.leaves(args)) > _MAX_BYTES:
        return None, None
    traced = jax.jit(program).trace(*args)
    closed = traced.jaxpr
    if (
        not _moves_only(closed.jaxpr)
        or sum(map(_nbytes, closed.out_avals)) > _MAX_BYTES
        or any(len(a.shape) > _MAX_DIMS for a in (*closed.in_avals, *closed.out_avals))
    ):
        return None, traced
    return HostPlan(closed, jax.tree.structure(traced.out_info)), traced


def _nbytes(a) -> int:
    return int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize


# ------------------------------------------------------------ which programs qualify

_MOVES = frozenset(
    """reshape transpose rev broadcast_in_dim squeeze slice concatenate pad stack tile
    copy copy_p select_n dynamic_slice dynamic_update_slice""".split()
)
_CALLS = frozenset(("pjit", "jit"))
# exact on integers and bools in numpy as in XLA (two's complement wraparound)
_INTEGER_ONLY = frozenset("add sub mul lt le gt ge eq ne and or not iota".split())


def _exact_integer(dtype) -> bool:
    return _numeric(dtype) and np.dtype(dtype).kind in "biu"


def _numeric(dtype) -> bool:
    return not jax.dtypes.issubdtype(dtype, jax.dtypes.extended)


def _moves_only(jaxpr) -> bool:
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if any(len(getattr(v.aval, "shape", ())) > _MAX_DIMS for v in (*eqn.invars, *eqn.outvars)):
            return False
        if name in _CALLS:
            if not _moves_only(eqn.params["jaxpr"].jaxpr):
                return False
        elif name == "convert_element_type":  # from integers: checked exact at each call
            source, target = eqn.invars[0].aval.dtype, eqn.params["new_dtype"]
            if not _exact_integer(source) or not _numeric(target):
                return False
        elif name in _INTEGER_ONLY:
            operands = [v.aval for v in eqn.invars] + [v.aval for v in eqn.outvars]
            if not all(_exact_integer(a.dtype) for a in operands):
                return False
        elif name not in _MOVES:
            return False
        if name == "reshape" and eqn.params.get("dimensions") is not None:
            return False
        if name == "tile" and len(eqn.params["reps"]) != len(eqn.invars[0].aval.shape):
            return False
    return True


# ------------------------------------------------------------ the numpy interpreter


def _evaluate(jaxpr, consts, args) -> list:
    bound: dict = {}

    def read(var):
        if isinstance(var, Literal):
            return np.asarray(var.val, dtype=var.aval.dtype)
        return bound[var]

    for var, value in zip(jaxpr.constvars, consts):
        bound[var] = np.asarray(value)
    for var, value in zip(jaxpr.invars, args):
        bound[var] = value
    for eqn in jaxpr.eqns:
        inputs = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        if name in _CALLS:
            inner = eqn.params["jaxpr"]
            outputs = _evaluate(inner.jaxpr, inner.consts, inputs)
        else:
            result = _RULES[name](*inputs, **eqn.params)
            outputs = [np.asarray(result, dtype=eqn.outvars[0].aval.dtype)]
        for var, value in zip(eqn.outvars, outputs):
            bound[var] = value
    return [read(v) for v in jaxpr.outvars]


def _broadcast_in_dim(x, shape, broadcast_dimensions, **_):
    placed = [1] * len(shape)
    for axis, dim in enumerate(broadcast_dimensions):
        placed[dim] = x.shape[axis]
    return np.broadcast_to(x.reshape(placed), shape)


def _pad(x, value, padding_config, **_):
    """lax.pad: interior padding between elements, then edges (negative ones crop)."""
    for axis, (low, high, interior) in enumerate(padding_config):
        if interior:
            size = x.shape[axis]
            spread = list(x.shape)
            spread[axis] = size + (size - 1) * interior if size else 0
            out = np.full(spread, value, dtype=x.dtype)
            index = [slice(None)] * x.ndim
            index[axis] = slice(None, None, interior + 1)
            out[tuple(index)] = x
            x = out
        for width, at_start in ((low, True), (high, False)):
            if width > 0:
                edge = list(x.shape)
                edge[axis] = width
                block = np.full(edge, value, dtype=x.dtype)
                x = np.concatenate([block, x] if at_start else [x, block], axis=axis)
            elif width < 0:
                index = [slice(None)] * x.ndim
                index[axis] = (
                    slice(-width, None) if at_start else slice(None, x.shape[axis] + width)
                )
                x = x[tuple(index)]
    return x


def _clamped_starts(shape, sizes, starts) -> tuple:
    """XLA clamps dynamic start indices so the slice lies inside the operand."""
    return tuple(
        min(max(int(start), 0), dim - size) for dim, size, start in zip(shape, sizes, starts)
    )


def _dynamic_slice(x, *starts, slice_sizes, **_):
    begin = _clamped_starts(x.shape, slice_sizes, starts)
    return x[tuple(slice(b, b + n) for b, n in zip(begin, slice_sizes))]


def _dynamic_update_slice(x, update, *starts, **_):
    begin = _clamped_starts(x.shape, update.shape, starts)
    out = x.copy()
    out[tuple(slice(b, b + n) for b, n in zip(begin, update.shape))] = update
    return out


def _select_n(which, *cases, **_):
    if which.dtype == np.bool_:
        return np.where(which, cases[1], cases[0]) if len(cases) == 2 else cases[0]
    return np.choose(which, np.broadcast_arrays(*cases))


def _iota(*, dtype, shape, dimension, **_):
    index = np.arange(shape[dimension], dtype=dtype)
    placed = [1] * len(shape)
    placed[dimension] = shape[dimension]
    return np.broadcast_to(index.reshape(placed), shape)


class _Inexact(Exception):
    """An integer that the float type it is converted to cannot hold exactly: numpy
    and XLA might round it differently, so the call compiles instead."""


def _convert(x, new_dtype, **_):
    out = x.astype(new_dtype)
    if out.dtype.kind in "fc" and x.dtype != np.bool_:
        with np.errstate(invalid="ignore", over="ignore"):
            if not np.array_equal(out.real.astype(x.dtype), x):
                raise _Inexact
    return out


def _wrapping(op):
    def rule(*xs, **_):
        with np.errstate(over="ignore"):
            return op(*xs)

    return rule


_RULES = {
    "reshape": lambda x, new_sizes, **_: x.reshape(new_sizes),
    "transpose": lambda x, permutation, **_: np.transpose(x, permutation),
    "rev": lambda x, dimensions, **_: np.flip(x, tuple(dimensions)),
    "broadcast_in_dim": _broadcast_in_dim,
    "squeeze": lambda x, dimensions, **_: np.squeeze(x, tuple(dimensions)),
    "slice": lambda x, start_indices, limit_indices, strides, **_: x[
        tuple(map(slice, start_indices, limit_indices, strides or [None] * x.ndim))
    ],
    "concatenate": lambda *xs, dimension, **_: np.concatenate(xs, axis=dimension),
    "pad": _pad,
    "stack": lambda *xs, axis, **_: np.stack(xs, axis=axis),
    "tile": lambda x, reps, **_: np.tile(x, reps),
    "copy": lambda x, **_: x,
    "copy_p": lambda x, **_: x,
    "select_n": _select_n,
    "dynamic_slice": _dynamic_slice,
    "dynamic_update_slice": _dynamic_update_slice,
    "iota": _iota,
    "convert_element_type": _convert,
    "add": _wrapping(np.add),
    "sub": _wrapping(np.subtract),
    "mul": _wrapping(np.multiply),
    "lt": lambda x, y, **_: np.less(x, y),
    "le": lambda x, y, **_: np.less_equal(x, y),
    "gt": lambda x, y, **_: np.greater(x, y),
    "ge": lambda x, y, **_: np.greater_equal(x, y),
    "eq": lambda x, y, **_: np.equal(x, y),
    "ne": lambda x, y, **_: np.not_equal(x, y),
    "and": lambda x, y, **_: np.bitwise_and(x, y),
    "or": lambda x, y, **_: np.bitwise_or(x, y),
    "not": lambda x, **_: np.logical_not(x) if x.dtype == np.bool_ else np.invert(x),
}
