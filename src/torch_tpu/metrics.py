"""Counters every execution path reports to: ops, compiles, cache hits, fallbacks, host syncs."""

from __future__ import annotations

from collections import Counter

_counts: Counter = Counter()
_compile_seconds: float = 0.0
_fallbacks: Counter = Counter()


def count(name: str, n: int = 1) -> None:
    _counts[name] += n


def record_compile(seconds: float) -> None:
    global _compile_seconds
    _counts["compiles"] += 1
    _compile_seconds += seconds


def record_fallback(op_name: str) -> None:
    _counts["cpu_fallbacks"] += 1
    _fallbacks[op_name] += 1


def snapshot() -> dict:
    """All counters as a plain dict (compile_seconds and per-op fallbacks included)."""
    out = dict(_counts)
    out["compile_seconds"] = _compile_seconds
    out["fallback_ops"] = dict(_fallbacks)
    return out


def reset() -> None:
    global _compile_seconds
    _counts.clear()
    _fallbacks.clear()
    _compile_seconds = 0.0


def report() -> str:
    """The counters as a table; also printed."""
    snap = snapshot()
    fallbacks = snap.pop("fallback_ops")
    lines = [f"{'counter':<28}{'value':>14}"]
    for key in sorted(snap):
        value = snap[key]
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        lines.append(f"{key:<28}{shown:>14}")
    for op, n in sorted(fallbacks.items()):
        lines.append(f"{'fallback ' + op:<28}{n:>14}")
    text = "\n".join(lines)
    print(text)
    return text
