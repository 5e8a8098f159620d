"""DEFER_AND_FUSE: record ops, run each segment as one XLA computation.

An op in fused mode runs nothing: its outputs (and the storages it writes)
get `Pending` values naming the node that will produce them. When the host
needs a value, at torch.tpu.synchronize(), at a mode switch, or when a
segment reaches CAP ops, the segment becomes one jitted function that
replays every node's program (the same pure per-op program strict mode
jits) and returns only the values still referenced by live storages: dead
intermediates never reach memory. The function is cached by the segment's
structure (which per-op executables, wired how, with which live outputs), so
a training loop compiles its segments once and then replays them.

Donation: an input array that nothing but the segment holds any more (the
storage it backed was overwritten by the segment, or freed) is donated to the
executable, so XLA writes the new parameters and optimizer moments into the
old buffers instead of keeping both alive while the segment runs. "Nothing
else holds it" is read from the jax.Array's reference count, as strict mode's
donation does (engine/donation.py says what that relies on): another storage
sharing the array (tensor.clone_storage), a resolved Pending not yet taken by
its storage, the shared zeros table or a user reference each add one, and
then the array is kept. Which leaves are donated is part of the cache key.
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
import weakref
from collections.abc import Callable

import jax
import numpy as np

from .. import cache, dtypes, env, memory_errors, metrics, strided
from . import donation

CAP = env.integer("TORCH_TPU_FUSE_CAP", 2048, 1)  # ops per segment before a flush
# Estimated contraction work (matmuls, convolutions) after which the segment is run at
# the next op, without waiting: the device computes while Python records the rest.
# Off (None) by default: at 128 MFLOP, interleaved gpt runs were faster (median
# fused/strict per round 1.28x against 1.02x unsplit, on a loaded 2-core machine), but
# fused AdamW on the 101M MLP then peaked at 1.82x the ideal state against 1.20x
# unsplit (cause not yet found); see docs/architecture.md.
SPLIT_FLOPS: int | None = None


class Pending:
    """A value a recorded node will produce; `value` is set when its segment runs.
    shape: the array's (a storage's shape is part of every op's signature)."""

    __slots__ = ("ref", "value", "shape", "__weakref__")

    def __init__(self, ref: tuple, shape: tuple) -> None:
        self.ref = ref
        self.value = None
        self.shape = shape


class _Segment:
    __slots__ = ("leaves", "leaf_index", "nodes", "pendings", "flops", "replaced")

    def __init__(self) -> None:
        self.leaves: list = []
        self.leaf_index: dict[int, int] = {}
        self.nodes: list[tuple] = []
        self.pendings: list[weakref.ref] = []
        self.flops = 0  # estimated contraction work recorded so far
        # (a strict window's) per value a node writes, the ref of the value it replaced:
        # what its storage reads again if the window fails before that node ran
        self.replaced: dict[tuple, object] = {}

    def leaf(self, array) -> int:
        index = self.leaf_index.get(id(array))
        if index is None:
            index = self.leaf_index[id(array)] = len(self.leaves)
            self.leaves.append(array)
        return index

    def scalar(self, value) -> int:
        """A host scalar input, one leaf per use: deduplicating equal-valued or interned
        scalars would make the segment's structure depend on their values."""
        self.leaves.append(value)
        return len(self.leaves) - 1

    def pending(self, ref: tuple, shape: tuple) -> Pending:
        p = Pending(ref, shape)
        self.pendings.append(weakref.ref(p))
        return p


_segment = _Segment()
# True while strict mode records its ops behind compiles running ahead (`open_window`):
# the segment then runs op by op, each node by `_run_node`
window = False
_run_node: Callable | None = None
_compiled: dict[tuple, tuple] = {}  # fingerprint -> (executable, donated leaves, output order)
_FLOPS: dict = {}  # per-op executable -> its estimated contraction work
cache.on_clear(_compiled.clear)
cache.on_clear(_FLOPS.clear)


def _input_ref(value):
    """A node input: a Pending of this segment (by ref) or a concrete array (a leaf)."""
    if type(value) is Pending:
        if value.value is not None:
            return _segment.leaf(value.value)
        return value.ref
    return _segment.leaf(value)


def record(entry, storage_values: list, dynamic: tuple, key_inputs: tuple):
    """Record one op; returns (fresh outputs, written storage values) as Pendings."""
    segment = _segment
    if SPLIT_FLOPS is not None:
        if segment.flops >= SPLIT_FLOPS:
            # here rather than after the op that crossed the line: its caller still held
            # the arrays it read, which would keep the segment from donating them
            flush("compute split")
            segment = _segment
        flops = _FLOPS.get(entry)
        if flops is None:
            flops = _FLOPS[entry] = _flops(entry)
        segment.flops += flops
    n = len(segment.nodes)
    storage_refs = tuple([_input_ref(v) for v in storage_values])
    scalar = segment.scalar
    dynamic_refs = tuple([scalar(d) for d in dynamic]) if dynamic else ()
    key_refs = tuple([scalar(k) for k in key_inputs]) if key_inputs else ()
    segment.nodes.append((entry, storage_refs, dynamic_refs, key_refs))
    shapes = fresh_shapes(entry)
    pending = segment.pending
    fresh = [_pendings(pending, shape, (n, "f", k)) for k, shape in enumerate(shapes)]
    written = [
        pending((n, "w", k), storage_values[slot].shape)
        for k, slot in enumerate(entry.written_slots)
    ]
    if window:  # (strict mode records through here only: never record_one)
        for k, slot in enumerate(entry.written_slots):
            segment.replaced[(n, "w", k)] = storage_refs[slot]
    metrics.count("ops_deferred")
    if n + 1 >= CAP:
        flush("segment size cap")
    return fresh, written


def record_one(entry, storages: list, dynamic: list, shape: tuple, written: bool) -> Pending:
    """`record` for an op with one result that draws and checks nothing: a fresh output
    or (written) the one storage it writes; the fused counterpart of strict mode's plain
    call (executor._plain_record). storages: the op's Storage objects; shape: the
    result's array shape. Returns the result's Pending."""
    if SPLIT_FLOPS is not None:  # (the general path keeps the contraction count)
        fresh, new = record(entry, [s.current() for s in storages], tuple(dynamic), ())
        return new[0] if written else fresh[0]
    segment = _segment
    n = len(segment.nodes)
    storage_refs = tuple([_input_ref(s.current()) for s in storages])
    dynamic_refs = tuple([segment.scalar(d) for d in dynamic]) if dynamic else ()
    segment.nodes.append((entry, storage_refs, dynamic_refs, ()))
    pending = segment.pending((n, "w" if written else "f", 0), shape)
    metrics.count("ops_deferred")
    if n + 1 >= CAP:
        flush("segment size cap")
    return pending


def fresh_shapes(entry) -> tuple:
    """Per fresh output of the op, its array shape (a list for a list output, None for an
    absent one), worked out once per executable."""
    shapes = _FRESH_SHAPES.get(entry)
    if shapes is None:
        shapes = _FRESH_SHAPES[entry] = tuple(_array_shapes(meta) for meta in entry.fresh)
    return shapes


_FRESH_SHAPES: dict = {}  # per-op executable -> per fresh output its array shape(s)
cache.on_clear(_FRESH_SHAPES.clear)


def _array_shapes(meta):
    """A fresh output's storage array shape (a list of them for a list output; None for
    an absent one), worked out once per executable."""
    if isinstance(meta, list):
        return [_array_shapes(m) for m in meta]
    if meta == "absent":
        return None
    shape, _, strides = meta
    return strided.layout_shape(shape, strides)


def _pendings(pending, shape, ref):
    if shape is None:
        return None
    if isinstance(shape, list):
        return [_pendings(pending, s, ref + (j,)) for j, s in enumerate(shape)]
    return pending(ref, shape)


# The argument whose last dimension a contraction sums over, per ATen packet
_CONTRACTED = {"mm": "self", "bmm": "self", "mv": "self", "addmm": "mat1", "baddbmm": "batch1"}


def _flops(entry) -> int:
    """A rough count of an op's multiply-adds x2, from its signature (view shapes of
    the first argument reading each storage) and its output shape: enough to tell a
    segment whose compute dwarfs a dispatch. Ops other than contractions count 0."""
    packet = entry.name.removeprefix("aten::").split(".")[0].rstrip("_")
    shapes = {name: shape for name, shape, _ in entry.signature}
    out = entry.fresh[0] if entry.fresh else None
    if not isinstance(out, tuple):
        return 0
    out_numel = math.prod(out[0])
    if packet in _CONTRACTED:
        lhs = shapes.get(_CONTRACTED[packet])
        return 2 * out_numel * lhs[-1] if lhs else 0
    if packet == "convolution" and "weight" in shapes:
        return 2 * out_numel * math.prod(shapes["weight"][1:])
    if packet == "convolution_backward" and "weight" in shapes and "grad_output" in shapes:
        return 4 * math.prod(shapes["grad_output"]) * math.prod(shapes["weight"][1:])
    return 0


def open_window(run_node: Callable) -> None:
    """Strict mode: record ops from here on, each to run by its own executable, so that
    their first-call compiles run on worker threads at once instead of one after
    another (executor.py decides which ops). `run_node(entry, arrays, dynamic)` runs a
    node and returns (its fresh outputs, the values it wrote). The window closes at the
    flush."""
    global window, _run_node
    window, _run_node = True, run_node


def _run_window_before_fork() -> None:
    """A forked child has none of this process's compile threads: a strict window
    waiting for them would wait there forever. (An error of the window is reported
    here and raised by no one: its values then read as a failed window's.)"""
    if window:
        flush("fork")


os.register_at_fork(before=_run_window_before_fork)


def flush(reason: str = "value needed") -> None:
    """Run the recorded segment (if any) as one computation, or (strict mode's window)
    op by op."""
    global _segment, window
    segment, each = _segment, window
    window = False  # (also when a window opened and its op failed before it was recorded)
    if not segment.nodes:
        return
    _segment = _Segment()
    live = [p for p in (w() for w in segment.pendings) if p is not None]
    if each:
        metrics.count(f"flush: {reason}")
        _run_each(segment, live)
        return
    outputs = tuple(p.ref for p in live)
    nodes = segment.nodes
    metrics.count("segments_run")
    metrics.count(f"flush: {reason}")
    leaves = segment.leaves
    floats = tuple([i for i, v in enumerate(leaves) if type(v) is float])
    ints = tuple([i for i, v in enumerate(leaves) if type(v) is int and dtypes.fits_int64(v)])
    donated = _donatable(leaves)
    segment.leaves = None  # (the donated arrays are deleted by the call)
    # (a node's entry hashes and compares by identity: the nodes are their own key)
    fingerprint = (tuple(nodes), outputs, donated, floats, ints)
    found = _compiled.get(fingerprint)
    if found is None:
        donated, order = _paired_first(nodes, outputs, donated)
    else:
        fn, donated, order = found
    given = tuple([leaves[i] for i in donated])
    apart = set(donated).union(floats, ints)
    kept_at = tuple([i for i in range(len(leaves)) if i not in apart])
    kept = tuple([leaves[i] for i in kept_at])
    # the Python floats (an optimizer's lr, betas and bias corrections, hundreds a step)
    # in one array, the ints (views' storage offsets) in another: one argument each
    # instead of one host scalar each (about 175 us apiece on a TPU host, 45 us an array)
    numbers = (
        np.array([leaves[i] for i in floats], dtype=np.float64),
        np.array([leaves[i] for i in ints], dtype=np.int64),
    )
    if found is None:
        returned = tuple(outputs[k] for k in order)
        program = _segment_program(nodes, returned, donated, kept_at, floats, ints)
        with warnings.catch_warnings():
            # a donated input no output can reuse (another shape) is merely freed
            warnings.filterwarnings("ignore", "Some donated buffers were not usable")
            fn = cache.compile(
                program,
                (given, kept, numbers),
                kind="segment",
                name=_segment_name(nodes),
                signature=_leaf_signature(nodes, leaves, (*donated, *kept_at, *floats, *ints)),
                donate_argnums=(0,) if donated else (),
            )
        _compiled[fingerprint] = (fn, donated, order)
    else:
        metrics.count("cache_hits")
    del leaves
    if donated:
        metrics.count("segment_donated_buffers", len(donated))
    try:
        values = fn(given, kept, numbers)
    except jax.errors.JaxRuntimeError as error:
        memory_errors.raise_if_out_of_memory(error)
        raise
    for k, value in zip(order, values):
        live[k].value = value


def _run_each(segment: _Segment, live: list) -> None:
    """A strict window's nodes in order, each by its own executable: the results strict
    mode computes, op for op. A value is dropped at its last reader unless a live
    tensor holds it, as strict mode frees an intermediate when its tensor dies (before
    the reader runs: a write into it may then donate its buffer)."""
    nodes, leaves = segment.nodes, segment.leaves
    segment.leaves = None
    wanted = {p.ref: p for p in live}
    last_read: dict = {}
    for n, (_, storage_refs, _, _) in enumerate(nodes):
        for ref in storage_refs:
            last_read[ref] = n
    env: dict = {}

    def keep(ref: tuple, value, n: int) -> None:
        pending = wanted.get(ref)
        if pending is not None:
            pending.value = value
        if last_read.get(ref, -1) > n:
            env[ref] = value

    run = _run_node
    for n, (entry, storage_refs, dynamic_refs, _) in enumerate(nodes):
        arrays = tuple([leaves[r] if type(r) is int else env[r] for r in storage_refs])
        for ref in storage_refs:
            if last_read.get(ref) == n:
                del last_read[ref]
                if type(ref) is int:
                    leaves[ref] = None
                else:
                    env.pop(ref, None)
        try:
            outputs = run(entry, arrays, [leaves[i] for i in dynamic_refs])
        except BaseException as error:
            _restore(segment, n, dict(zip(storage_refs, arrays)), leaves, env, live)
            if isinstance(error, jax.errors.JaxRuntimeError):
                memory_errors.raise_if_out_of_memory(error)
            raise
        del arrays
        _keep_outputs(n, outputs, keep)
        del outputs  # (a value held here would not be donated by the next node)


def _restore(
    segment: _Segment, failed: int, inputs: dict, leaves: list, env: dict, live: list
) -> None:
    """After node `failed` of a strict window raised: each storage written by it or a
    later node reads again the value it had after the last node that ran (a parameter
    its value from before the window), as when strict mode raises at that op; values
    the window creates in those nodes stay without one. inputs: the failed node's
    arguments by ref (the window already let go of those it read last)."""
    for pending in live:
        ref = pending.ref
        if pending.value is not None or ref[1] != "w" or ref[0] < failed:
            continue
        while ref is not None and type(ref) is not int and ref[0] >= failed:
            ref = segment.replaced.get(ref)  # (None: a fresh value of a node not run)
        if ref is None:
            continue
        value = inputs[ref] if ref in inputs else leaves[ref] if type(ref) is int else env.get(ref)
        if value is not None and not value.is_deleted():  # (a donated buffer is gone)
            pending.value = value


def _keep_outputs(n: int, outputs: tuple, keep: Callable) -> None:
    """keep(ref, value, n) for each of node n's (fresh outputs, written values)."""
    fresh, written = outputs
    for k, value in enumerate(fresh):
        if isinstance(value, list):
            for j, item in enumerate(value):
                keep((n, "f", k, j), item, n)
        else:
            keep((n, "f", k), value, n)
    for k, value in enumerate(written):
        keep((n, "w", k), value, n)


def _paired_first(nodes: list, outputs: tuple, donated: tuple) -> tuple[tuple, tuple]:
    """(donated leaves, output positions), each reordered so that the leaves whose storage
    the segment rewrote come first, in the same order as their new values among the
    outputs. JAX pairs each donated input with the first unpaired output of its shape
    and dtype; given a parameter's gradient before its new value, XLA wrote the gradient
    into the parameter's buffer and copied the parameter first."""
    origin: dict = {}  # written ref -> the leaf whose storage it rewrote
    for n, (entry, storage_refs, _, _) in enumerate(nodes):
        for k, slot in enumerate(entry.written_slots):
            ref = storage_refs[slot]
            origin[(n, "w", k)] = ref if type(ref) is int else origin.get(ref)
    wanted = set(donated)
    newest: dict = {}  # leaf -> the position of its latest new value among the outputs
    for position, ref in enumerate(outputs):
        leaf = origin.get(ref)
        if leaf in wanted and (leaf not in newest or outputs[newest[leaf]][0] < ref[0]):
            newest[leaf] = position
    paired = [leaf for leaf in donated if leaf in newest]
    first = [newest[leaf] for leaf in paired]
    taken = set(first)
    rest = [k for k in range(len(outputs)) if k not in taken]
    return tuple(paired + [leaf for leaf in donated if leaf not in newest]), tuple(first + rest)


def _donatable(leaves: list) -> tuple[int, ...]:
    """Indices of the array leaves that nothing outside this segment (its leaf list)
    refers to."""
    return tuple(
        i
        for i in range(len(leaves))
        if isinstance(leaves[i], jax.Array) and donation.held_only_by(leaves, i, 1)
    )


def _segment_name(nodes: list) -> str:
    """Names the segment's code, the same in every process: its op sequence, hashed.
    The same ops at other shapes are a recompile of the same segment."""
    ops = [entry.name for entry, _, _, _ in nodes]
    digest = hashlib.sha1("\n".join(ops).encode()).hexdigest()[:10]
    return f"{ops[0]}..{ops[-1]} ({len(ops)} ops, {digest})"


def _leaf_signature(nodes: list, leaves: list, order: tuple) -> list:
    """Each input of the segment, in the order the executable takes them (donated ones
    first, the packed floats and ints last), named by the first op argument that reads it, with
    that argument's shape: what a recompile reports as changed."""
    labels = {}
    for entry, storage_refs, _, _ in nodes:
        for slot, ref in enumerate(storage_refs):
            if type(ref) is int and ref not in labels and slot < len(entry.signature):
                arg, shape, dtype = entry.signature[slot]
                labels[ref] = (f"{entry.name} {arg}", shape, dtype)
    return [
        labels.get(
            i,
            ("scalar", tuple(np.shape(leaves[i])), str(getattr(leaves[i], "dtype", "python"))),
        )
        for i in order
    ]


def _segment_program(
    nodes: list, outputs: tuple, donated: tuple, kept: tuple, floats: tuple, ints: tuple
):
    """The segment as one function of (donated leaves, kept leaves, (packed floats,
    packed ints)), each group's leaf positions given."""
    programs = [(entry.program, s, d, k) for entry, s, d, k in nodes]
    n_leaves = len(donated) + len(kept) + len(floats) + len(ints)

    def segment(given, kept_leaves, numbers):
        leaves = [None] * n_leaves
        for i, value in zip(donated, given):
            leaves[i] = value
        for i, value in zip(kept, kept_leaves):
            leaves[i] = value
        packed_floats, packed_ints = numbers
        for j, i in enumerate(floats):
            # weakly typed, as the Python number itself is traced: a scalar to the lowering
            leaves[i] = _weakly_typed(packed_floats[j])
        for j, i in enumerate(ints):
            leaves[i] = _weakly_typed(packed_ints[j])
        env = {}

        def get(ref):
            return leaves[ref] if type(ref) is int else env[ref]

        for n, (program, storage_refs, dynamic_refs, key_refs) in enumerate(programs):
            fresh, written = program(
                tuple(get(r) for r in storage_refs),
                tuple(leaves[i] for i in dynamic_refs),
                tuple(leaves[i] for i in key_refs),
            )
            for k, value in enumerate(fresh):
                if isinstance(value, list):
                    for j, item in enumerate(value):
                        env[(n, "f", k, j)] = item
                else:
                    env[(n, "f", k)] = value
            for k, value in enumerate(written):
                env[(n, "w", k)] = value
        return [env[ref] for ref in outputs]

    return segment


def _weakly_typed(x):
    # (JAX has no public way to mark a traced value weakly typed)
    from jax._src.lax.lax import _convert_element_type

    return _convert_element_type(x, weak_type=True)


def pending_ops() -> int:
    return len(_segment.nodes)
