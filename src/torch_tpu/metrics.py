"""Counters every execution path reports to: ops, compiles, cache hits, fallbacks, host syncs.

Every XLA compile (strict op, fused segment, compiled graph) is recorded with
what was compiled and how long it took. A compile of code already compiled at
other input shapes or dtypes is a recompile: it is recorded with the input
that changed, and after `TORCH_TPU_RECOMPILE_WARN_LIMIT` (default 8)
recompiles of the same segment or graph a warning names the input whose shape
keeps changing. Only segments and graphs count as recompiles: a strict op or a
host read at a new shape is an ordinary first compile of that shape (one op at
many shapes is how every model runs, and `torch.save` reads storages of every
size), so it is counted under "compiles" alone.
"""

from __future__ import annotations

import warnings
from collections import Counter, deque
from dataclasses import dataclass

_counts: Counter = Counter()
_compile_seconds: float = 0.0
_fallbacks: Counter = Counter()
_fallback_sites: Counter = Counter()  # (op, user's source line) while locate_fallbacks is on
locate_fallbacks = False  # `torch-tpu check` turns it on: finding the line costs a stack walk
_compiles: deque = deque(maxlen=1000)
_last_signature: dict[tuple[str, str], list] = {}
_recompiles: Counter = Counter()
_changed_inputs: dict[tuple[str, str], Counter] = {}
_warned: set = set()
_shapes: dict[tuple[str, str], dict] = {}  # (kind, name) -> {input shapes: compiles}
_buckets: dict[str, Counter] = {}  # graph -> Counter of (real sizes, bucket sizes)

_RECOMPILED_KINDS = ("segment", "graph")  # code whose shapes should be stable


@dataclass(frozen=True)
class CompileEvent:
    """One XLA compile: what, how long, and for a recompile what changed."""

    kind: str
    name: str
    seconds: float
    reason: str | None  # None for a first compile


def count(name: str, n: int = 1) -> None:
    _counts[name] += n


def count_hit() -> None:
    """An op dispatched and served from the cache (the eager fast path's one call)."""
    _counts["ops_dispatched"] += 1
    _counts["cache_hits"] += 1


def record_compile(
    seconds: float, kind: str = "op", name: str = "", signature: list | None = None
) -> CompileEvent:
    global _compile_seconds
    _counts["compiles"] += 1
    _counts[f"compiles: {kind}"] += 1
    _compile_seconds += seconds
    code = (kind, name)
    reason = None
    if signature is not None and kind in _RECOMPILED_KINDS:
        shapes = tuple(tuple(entry[1]) for entry in signature)
        seen = _shapes.setdefault(code, {})
        seen[shapes] = seen.get(shapes, 0) + 1
        previous = _last_signature.get(code)
        _last_signature[code] = signature
        if previous is not None:
            reason, changed = _difference(previous, signature)
            _recompiles[code] += 1
            _counts["recompiles"] += 1
            _changed_inputs.setdefault(code, Counter()).update(changed)
            _maybe_warn(code)
    event = CompileEvent(kind, name, seconds, reason)
    _compiles.append(event)
    return event


def _difference(old: list, new: list) -> tuple[str, list[str]]:
    """Which inputs changed shape or dtype between two signatures of the same code."""
    if len(old) != len(new):
        return f"number of inputs {len(old)} -> {len(new)}", ["(number of inputs)"]
    parts, changed = [], []
    for index, (a, b) in enumerate(zip(old, new)):
        if a == b:
            continue
        label = f"input {index} {a[0]!r}"
        changed.append(label)
        if tuple(a[1]) != tuple(b[1]):
            parts.append(f"{label}: shape {tuple(a[1])} -> {tuple(b[1])}")
        if a[2] != b[2]:
            parts.append(f"{label}: dtype {a[2]} -> {b[2]}")
    return ("; ".join(parts[:4]) or "same input shapes and dtypes"), changed


def _warn_limit() -> int:
    from .env import integer

    return integer("TORCH_TPU_RECOMPILE_WARN_LIMIT", 8, 1)


def _maybe_warn(code: tuple[str, str]) -> None:
    kind, name = code
    if code in _warned or _recompiles[code] < _warn_limit():
        return
    _warned.add(code)
    changed = _changed_inputs[code].most_common(1)
    if changed:
        culprit, times = changed[0]
        advice = (
            f"{culprit} changed shape or dtype in {times} of them. Every new shape is a new "
            "XLA compile: pad or bucket that input to a few fixed shapes: under "
            "torch.compile, mark the dimension dynamic (torch._dynamo.mark_dynamic or "
            "dynamic=True) and pass options={'bucket_size': N} or "
            "{'num_dynamic_buckets': K}; in eager, pad with "
            "torch_tpu.bucketing.pad_to_bucket (docs/serving.md)."
        )
    else:
        advice = (
            "no input changed shape or dtype; what did is compiled into the program: an "
            "input's strides or storage offset (a view: pass a contiguous copy), or an "
            "argument an op takes as a constant (dims, a tolerance, a size: pass the same "
            "values each time)."
        )
    warnings.warn(
        f"torch_tpu: {kind} {name!r} was recompiled {_recompiles[code]} times; {advice}",
        RuntimeWarning,
        stacklevel=4,
    )


def record_bucket(graph: str, sizes: tuple[int, ...], bucket: tuple[int, ...]) -> None:
    """A call of a bucketed graph: its real dynamic sizes and the bucket they ran at."""
    _counts["bucketed_calls"] += 1
    _buckets.setdefault(graph, Counter())[(sizes, bucket)] += 1


def shapes() -> dict[tuple[str, str], dict]:
    """(kind, name) of each compiled graph or fused segment -> {its input shapes:
    number of compiles at them}: the shapes each program was compiled for."""
    return {code: dict(seen) for code, seen in _shapes.items()}


def buckets() -> dict[str, dict]:
    """Bucketed graph -> {(real dynamic sizes, bucket sizes): calls}: where each size landed."""
    return {graph: dict(landed) for graph, landed in _buckets.items()}


def compiles() -> list[CompileEvent]:
    """The most recent compiles (up to 1000), oldest first."""
    return list(_compiles)


def snapshot() -> dict:
    """All counters as a plain dict (compile_seconds and per-op fallbacks included)."""
    out = dict(_counts)
    out["compile_seconds"] = _compile_seconds
    out["fallback_ops"] = dict(_fallbacks)
    return out


def record_fallback(op_name: str, where: str | None = None) -> None:
    _counts["cpu_fallbacks"] += 1
    _fallbacks[op_name] += 1
    if where is not None:
        _fallback_sites[(op_name, where)] += 1


def fallback_sites() -> dict[tuple[str, str], int]:
    """(op, user's source line) -> count, recorded while `locate_fallbacks` is True."""
    return dict(_fallback_sites)


def reset() -> None:
    """Clear every counter and the compile log (recompile detection starts afresh)."""
    global _compile_seconds
    _counts.clear()
    _fallbacks.clear()
    _fallback_sites.clear()
    _compiles.clear()
    _last_signature.clear()
    _recompiles.clear()
    _changed_inputs.clear()
    _warned.clear()
    _shapes.clear()
    _buckets.clear()
    _compile_seconds = 0.0


def report() -> None:
    """Print the counters, then the recompiles with their reasons, as a table."""
    print(report_text())


def report_text() -> str:
    """The table report() prints."""
    snap = snapshot()
    fallbacks = snap.pop("fallback_ops")
    lines = [f"{'counter':<28}{'value':>14}"]
    for key in sorted(snap):
        value = snap[key]
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        lines.append(f"{key:<28}{shown:>14}")
    for op, n in sorted(fallbacks.items()):
        lines.append(f"{'fallback ' + op:<28}{n:>14}")
    recompiled = [e for e in _compiles if e.reason is not None]
    if recompiled:
        lines.append("recompiles (most recent last):")
        for e in recompiled[-20:]:
            lines.append(f"  {e.kind} {e.name} ({e.seconds * 1e3:.1f} ms): {e.reason}")
    for graph, landed in _buckets.items():
        lines.append(f"buckets of {graph} (real sizes -> bucket: calls):")
        for (sizes, bucket), n in sorted(landed.items()):
            lines.append(f"  {sizes} -> {bucket}: {n}")
    return "\n".join(lines)
