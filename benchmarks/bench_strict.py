"""Strict-mode figures, printed as ratios from one run (absolute times are noise here).

1. Per-op dispatch: `a + b` on 64x64 float32 tpu tensors, next to JAX's own
   jitted add on the same arrays (target: within 1.5x).
2. MLP training step (3 x Linear(1024) + ReLU, batch 128, SGD) on tpu, next to
   PyTorch CPU eager (target: within 1.25x).

Run: python benchmarks/bench_strict.py [--quick]
"""

from __future__ import annotations

import argparse
import time

import jax
import torch

import torch_tpu
from torch_tpu.engine.executor import device_value
from torch_tpu.training import wide_mlp_step_fn


def _best(fn, repeats: int, inner: int) -> float:
    """Best mean seconds per call over `repeats` timings of `inner` calls."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def per_op(repeats: int) -> tuple[float, float]:
    a = torch.randn(64, 64).to("tpu")
    b = torch.randn(64, 64).to("tpu")
    ja, jb = device_value(a), device_value(b)
    jadd = jax.jit(lambda x, y: x + y)

    def ours():
        return a + b

    def theirs():
        return jadd(ja, jb)

    for fn in (ours, theirs):
        fn()
    torch.tpu.synchronize()
    t_ours = _best(ours, repeats, 2000)
    torch.tpu.synchronize()
    t_jax = _best(theirs, repeats, 2000)
    jax.block_until_ready(jadd(ja, jb))
    return t_ours, t_jax


def mlp_step(device: str, steps: int) -> float:
    _, step = wide_mlp_step_fn(device)
    for _ in range(3):
        step().item()
    best = float("inf")
    for _ in range(steps):
        start = time.perf_counter()
        step().item()  # .item() waits for the step, as a training loop that logs does
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    args = parser.parse_args()
    repeats = 3 if args.quick else 7
    platform = torch_tpu.platform.platform()
    print(f"platform: {platform}  torch {torch.__version__}  jax {jax.__version__}")
    t_ours, t_jax = per_op(repeats)
    print(f"per-op a+b 64x64: tpu strict {t_ours * 1e6:.1f} us, jax jit {t_jax * 1e6:.1f} us, "
          f"ratio {t_ours / t_jax:.2f}x (target <= 1.5x)")
    t_tpu = mlp_step("tpu", repeats + 3)
    t_cpu = mlp_step("cpu", repeats + 3)
    print(f"MLP step: tpu strict {t_tpu * 1e3:.2f} ms, torch cpu eager {t_cpu * 1e3:.2f} ms, "
          f"ratio {t_tpu / t_cpu:.2f}x (target <= 1.25x)")


if __name__ == "__main__":
    main()
