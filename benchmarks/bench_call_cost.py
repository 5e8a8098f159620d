"""What one call of a compiled XLA executable costs the host, by argument count.

compile_step's executable takes more inputs and gives more outputs than the same
step hand-written in JAX (AdamW's per-parameter step counters, the gradients it
hands back): on a TPU VM's host it is 1.7x slower than JAX's step, while on
XLA:CPU the two are equal. This prints the host's cost of calling a program
that only passes small arrays through (`x + 1` per input), for a range of
argument counts, through `jax.jit` and through an ahead-of-time `Compiled` (what
torch_tpu calls), with and without donated inputs -- so the cost per argument on
this platform is one division.

Run: python benchmarks/bench_call_cost.py [--counts 1,31,62,93,124,155]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp


def _best(fn, repeats: int = 5, inner: int = 50) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            out = fn()
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def _program(n: int):
    return lambda *xs: [x + 1 for x in xs]


def measure(n: int) -> dict[str, float]:
    """Seconds per call with n (8,)-float32 inputs and n outputs."""
    xs = [jnp.full((8,), i, jnp.float32) for i in range(n)]
    jitted = jax.jit(_program(n))
    compiled = jitted.lower(*xs).compile()
    donating = jax.jit(_program(n), donate_argnums=tuple(range(n)))
    state = {"xs": [x + 0 for x in xs]}

    def donated():
        state["xs"] = donating(*state["xs"])
        return state["xs"]

    jax.block_until_ready((jitted(*xs), compiled(*xs), donated()))
    return {
        "jit": _best(lambda: jitted(*xs)),
        "compiled": _best(lambda: compiled(*xs)),
        "jit, donated": _best(donated),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", default="1,31,62,93,124,155")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    device = jax.devices()[0]
    print(f"platform: {device.platform} ({device.device_kind}), jax {jax.__version__}")
    rows = {n: measure(n) for n in counts}
    kinds = list(rows[counts[0]])
    print("inputs = outputs   " + "".join(f"{k:>16s}" for k in kinds) + "   (us per call)")
    for n, row in rows.items():
        print(f"{n:>16d}   " + "".join(f"{row[k] * 1e6:16.1f}" for k in kinds))
    if len(counts) > 1:
        lo, hi = counts[0], counts[-1]
        per = {k: (rows[hi][k] - rows[lo][k]) / (hi - lo) * 1e6 for k in kinds}
        print(
            f"per extra input and output ({lo} to {hi}): "
            + ", ".join(f"{k} {v:.2f} us" for k, v in per.items())
        )


if __name__ == "__main__":
    main()
