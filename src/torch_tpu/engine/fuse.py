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
"""

from __future__ import annotations

import hashlib
import weakref

import numpy as np

from .. import cache, env, metrics

CAP = env.integer("TORCH_TPU_FUSE_CAP", 2048, 1)  # ops per segment before a flush


class Pending:
    """A value a recorded node will produce; `value` is set when its segment runs."""

    __slots__ = ("ref", "value", "__weakref__")

    def __init__(self, ref: tuple) -> None:
        self.ref = ref
        self.value = None


class _Segment:
    __slots__ = ("leaves", "leaf_index", "nodes", "pendings")

    def __init__(self) -> None:
        self.leaves: list = []
        self.leaf_index: dict[int, int] = {}
        self.nodes: list[tuple] = []
        self.pendings: list[weakref.ref] = []

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

    def pending(self, ref: tuple) -> Pending:
        p = Pending(ref)
        self.pendings.append(weakref.ref(p))
        return p


_segment = _Segment()
_compiled: dict[tuple, object] = {}
cache.on_clear(_compiled.clear)


def _input_ref(value):
    """A node input: a Pending of this segment (by ref) or a concrete array (a leaf)."""
    if type(value) is Pending:
        if value.value is not None:
            return _segment.leaf(value.value)
        return value.ref
    return _segment.leaf(value)


def record(entry, storage_values: list, dynamic: tuple, key_inputs: tuple):
    """Record one op; returns (fresh outputs, written storage values) as Pendings."""
    n = len(_segment.nodes)
    storage_refs = tuple(_input_ref(v) for v in storage_values)
    dynamic_refs = tuple(_segment.scalar(d) for d in dynamic)
    key_refs = tuple(_segment.scalar(k) for k in key_inputs)
    _segment.nodes.append((entry, storage_refs, dynamic_refs, key_refs))
    fresh = [_pendings(meta, (n, "f", k)) for k, meta in enumerate(entry.fresh)]
    written = [_segment.pending((n, "w", k)) for k in range(len(entry.written_slots))]
    metrics.count("ops_deferred")
    if len(_segment.nodes) >= CAP:
        flush("segment size cap")
    return fresh, written


def _pendings(meta, ref):
    if isinstance(meta, list):
        return [_pendings(m, ref + (j,)) for j, m in enumerate(meta)]
    if meta == "absent":
        return None
    return _segment.pending(ref)


def flush(reason: str = "value needed") -> None:
    """Run the recorded segment (if any) as one computation."""
    global _segment
    segment = _segment
    if not segment.nodes:
        return
    _segment = _Segment()
    live = [p for p in (w() for w in segment.pendings) if p is not None]
    outputs = tuple(p.ref for p in live)
    nodes = segment.nodes
    fingerprint = (
        tuple((id(entry), s, d, k) for entry, s, d, k in nodes),
        outputs,
    )
    fn = _compiled.get(fingerprint)
    metrics.count("segments_run")
    metrics.count(f"flush: {reason}")
    leaves = tuple(segment.leaves)
    if fn is None:
        fn = _compiled[fingerprint] = cache.compile(
            _segment_program(nodes, outputs),
            (leaves,),
            kind="segment",
            name=_segment_name(nodes),
            signature=_leaf_signature(nodes, leaves),
        )
    else:
        metrics.count("cache_hits")
    values = fn(leaves)
    for p, value in zip(live, values):
        p.value = value


def _segment_name(nodes: list) -> str:
    """Names the segment's code, the same in every process: its op sequence, hashed.
    The same ops at other shapes are a recompile of the same segment."""
    ops = [entry.name for entry, _, _, _ in nodes]
    digest = hashlib.sha1("\n".join(ops).encode()).hexdigest()[:10]
    return f"{ops[0]}..{ops[-1]} ({len(ops)} ops, {digest})"


def _leaf_signature(nodes: list, leaves: tuple) -> list:
    """Each input of the segment named by the first op argument that reads it, with
    that argument's shape: what a recompile reports as changed."""
    labels = {}
    for entry, storage_refs, _, _ in nodes:
        for slot, ref in enumerate(storage_refs):
            if type(ref) is int and ref not in labels and slot < len(entry.signature):
                arg, shape, dtype = entry.signature[slot]
                labels[ref] = (f"{entry.name} {arg}", shape, dtype)
    return [
        labels.get(i, ("scalar", tuple(np.shape(a)), str(getattr(a, "dtype", type(a).__name__))))
        for i, a in enumerate(leaves)
    ]


def _segment_program(nodes: list, outputs: tuple):
    programs = [(entry.program, s, d, k) for entry, s, d, k in nodes]

    def segment(leaves):
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


def pending_ops() -> int:
    return len(_segment.nodes)
