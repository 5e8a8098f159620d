"""Overhead of a jax_op call against the same computation as built-in ops.

Three computations on 64x64 float32 tpu tensors, each as a jax_op and as
built-in PyTorch ops: `x + y` (one op either way: the jax_op's own overhead),
`x * 2 + sin(y)` (one jax_op against three built-in ops), and the same with a
backward. Each is timed in strict eager mode (per call, results left
asynchronous, one synchronize per timing) and compiled (torch.compile with the
tpu backend: the jax_op inlined into the graph's program). Absolute times on
a shared machine are noise; the ratios are the figures.

Run: python benchmarks/bench_jax_op.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import torch

import torch_tpu


def _best(fn, repeats: int, inner: int) -> float:
    """Best mean seconds per call over `repeats` timings of `inner` calls."""
    best = float("inf")
    for _ in range(repeats):
        torch.tpu.synchronize()
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        torch.tpu.synchronize()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def _ops():
    @torch_tpu.jax_op("bench::add")
    def add(x: jax.Array, y: jax.Array) -> jax.Array:
        return x + y

    @torch_tpu.jax_op("bench::scale_sin")
    def scale_sin(x: jax.Array, y: jax.Array) -> jax.Array:
        return x * 2 + jnp.sin(y)

    return {
        "x + y": (add, lambda x, y: x + y),
        "x * 2 + sin(y)": (scale_sin, lambda x, y: x * 2 + torch.sin(y)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats, inner = (3, 200) if args.quick else (5, 1000)
    x = torch.randn(64, 64, device="tpu")
    y = torch.randn(64, 64, device="tpu")
    xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
    print(f"{'computation':<32}{'jax_op us':>12}{'built-in us':>13}{'ratio':>8}")
    for label, (op, builtin) in _ops().items():
        for mode in ("strict", "strict + backward", "compiled"):
            timed = []
            for fn in (op, builtin):
                call = _caller(mode, fn, x, y, xg, yg)
                for _ in range(3):  # compile, warm the caches
                    call()
                timed.append(_best(call, repeats, inner // 5 if "backward" in mode else inner))
            name = f"{label} [{mode}]"
            ours, theirs = timed[0] * 1e6, timed[1] * 1e6
            print(f"{name:<32}{ours:>12.1f}{theirs:>13.1f}{ours / theirs:>8.2f}")


def _caller(mode: str, fn, x, y, xg, yg):
    if mode == "strict":
        return lambda: fn(x, y)
    if mode == "strict + backward":
        return lambda: fn(xg, yg).sum().backward()
    compiled = torch.compile(fn, backend="tpu")
    return lambda: compiled(x, y)


if __name__ == "__main__":
    main()
