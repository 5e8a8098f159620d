"""Where the host's time goes: cProfile of strict `a + b` (64x64) and of compile_step's
gpt_small step, the functions that cost most by their own time, per call.

For a machine where a figure is far from its floor for reasons this repo's machine does
not show (a TPU VM's host: docs/on_tpu.md), so one run there says which part of the
Python or which JAX entry point is slow.

Run: python benchmarks/profile_host.py [--top 20]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
from pathlib import Path

import torch

import torch_tpu

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its siblings


def _profile(label: str, fn, calls: int, top: int) -> None:
    for _ in range(20):  # compiled, cached, fast paths built
        fn()
    torch.tpu.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    torch.tpu.synchronize()
    profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    print(f"== {label}: {stats.total_tt / calls * 1e6:.1f} us per call under the profiler")
    stats.sort_stats("tottime").print_stats(top)
    for line in out.getvalue().splitlines():
        if line.strip() and not line.startswith(("   Ordered", "   List reduced")):
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    print(f"platform: {torch_tpu.platform.platform()}")
    a, b = torch.randn(64, 64, device="tpu"), torch.randn(64, 64, device="tpu")
    with torch.tpu.set_eager_mode("strict"):
        _profile("strict a + b, 64x64", lambda: a + b, 3000, args.top)

    from bench_step import gpt_parts

    model, opt, inputs, targets, loss_fn = gpt_parts("gpt_small", "tpu")
    step = torch_tpu.compile_step(model, opt, loss_fn)
    _profile("compile_step, gpt_small", lambda: step(inputs, targets), 200, args.top)


if __name__ == "__main__":
    main()
