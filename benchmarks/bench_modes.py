"""Eager modes side by side, printed as ratios from one run.

For each workload, a training step in debug, strict and fused mode and in
PyTorch CPU eager:
- mlp: 3 x Linear(1024)+ReLU, batch 128, SGD (compute-bound here);
- gpt: 2 blocks, d=256, 4 heads, seq 128, batch 8, vocab 1024, AdamW(foreach=False);
- gpt_small: d=64, seq 32, batch 4, vocab 256 (dispatch-bound: a fast TPU's regime).
Then: fused recording cost per op (amortised), and each mode's first step
(compiles included) measured in a fresh process.

Targets (issue): fused >= 2x strict on gpt_small, >= 1.2x on gpt; recording
<= 20 us/op; fused first step <= 3x strict's.

Run: python benchmarks/bench_modes.py [--steps N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

import torch_tpu
from torch_tpu.engine import executor, fuse
from torch_tpu.training import gpt_step_fn, wide_mlp_step_fn

MODES = {
    "debug": "DEFER_NEVER_AND_LAUNCH_BLOCKING",
    "strict": "DEFER_NEVER",
    "fused": "DEFER_AND_FUSE",
}


def step_fn(workload: str, device: str):
    if workload == "mlp":
        return wide_mlp_step_fn(device)
    return gpt_step_fn(workload, device)


def time_steps(workload: str, device: str, mode: str | None, steps: int) -> float:
    """Best seconds per training step after two warm-up steps (each ends in .item())."""
    ctx = torch.tpu.set_eager_mode(MODES[mode]) if mode else _null()
    with ctx:
        _, step = step_fn(workload, device)
        for _ in range(2):
            step().item()
        best = float("inf")
        for _ in range(steps):
            start = time.perf_counter()
            step().item()
            best = min(best, time.perf_counter() - start)
    return best


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def recording_cost(steps: int) -> tuple[float, float]:
    """Seconds per recorded op in fused mode on a gpt_small step: (the step's whole
    recording time, everything before the flush, per op; the part of it spent in
    torch_tpu's kernels, per op). The rest is PyTorch's own: modules, autograd,
    the optimizer's Python loop and the dispatcher."""
    inside = [0.0]
    run = executor.run

    def timed_run(spec, args, kwargs):
        start = time.perf_counter()
        try:
            return run(spec, args, kwargs)
        finally:
            inside[0] += time.perf_counter() - start

    with torch.tpu.set_eager_mode("DEFER_AND_FUSE"):
        _, step = gpt_step_fn("gpt_small", "tpu")
        for _ in range(2):
            step().item()
        best = (float("inf"), float("inf"))
        executor.run = timed_run  # the kernels look executor.run up per call
        try:
            for _ in range(steps):
                torch.tpu.synchronize()
                inside[0] = 0.0
                start = time.perf_counter()
                loss = step()
                ops = max(fuse.pending_ops(), 1)
                elapsed = time.perf_counter() - start
                loss.item()
                best = min(best, (elapsed / ops, inside[0] / ops))
        finally:
            executor.run = run
    return best


_FIRST_STEP = """
import time, torch
from benchmarks.bench_modes import step_fn
torch.tpu.eager_mode = torch.tpu.EagerMode.{mode}
_, step = step_fn("{workload}", "tpu")
start = time.perf_counter()
step().item()
print(time.perf_counter() - start)
"""


def first_step(workload: str, mode: str) -> float:
    code = _FIRST_STEP.format(mode=MODES[mode], workload=workload)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=900
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workloads", nargs="*", default=["mlp", "gpt", "gpt_small"])
    args = parser.parse_args()
    print(f"platform: {torch_tpu.platform.platform()}  ({torch.get_num_threads()} CPU threads)")
    for workload in args.workloads:
        times = {m: time_steps(workload, "tpu", m, args.steps) for m in MODES}
        times["cpu eager"] = time_steps(workload, "cpu", None, args.steps)
        shown = "  ".join(f"{k} {v * 1e3:.1f} ms" for k, v in times.items())
        print(f"{workload}: {shown}")
        print(
            f"  fused vs strict: {times['strict'] / times['fused']:.2f}x faster; "
            f"strict vs debug: {times['debug'] / times['strict']:.2f}x; "
            f"fused vs torch cpu eager: {times['cpu eager'] / times['fused']:.2f}x faster"
        )
    whole, ours = recording_cost(args.steps)
    print(
        f"fused recording (gpt_small): {whole * 1e6:.1f} us per op for the whole step, "
        f"of which torch_tpu's kernels {ours * 1e6:.1f} us (the rest is PyTorch's own)"
    )
    strict_first, fused_first = first_step("gpt_small", "strict"), first_step("gpt_small", "fused")
    print(
        f"first step (fresh process, compiles included), gpt_small: strict {strict_first:.2f} s, "
        f"fused {fused_first:.2f} s, ratio {fused_first / strict_first:.2f}x"
    )


if __name__ == "__main__":
    main()
