"""Throughput of TorchTitan-style training (examples/titan_train.py) per mesh shape, beside
the same model in one process.

    python benchmarks/bench_titan.py                    # 4 processes via torchrun
    python benchmarks/bench_titan.py --peak-tflops 197  # also MFU, at that peak per device

Per mesh shape (dp, tp) it trains `--steps` steps after `--warmup` (compiles) and
prints, from the median step time:

    tokens/s        = global batch * sequence length / step time
    model FLOP/s    = tokens/s * training FLOPs per token
    FLOPs per token = 6 * parameters + 12 * layers * dim * sequence length
    MFU             = model FLOP/s / (devices * peak FLOP/s of one device)

the formula TorchTitan reports (`model_flops_per_token` in the example), so a run on
accelerators is comparable with its figures. On XLA:CPU there is no meaningful peak:
MFU is printed only with --peak-tflops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MESHES = ((2, 2), (4, 1), (1, 4))


def _args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--peak-tflops", type=float, help="peak bf16 TFLOP/s of one device")
    return parser.parse_args()


def bench() -> None:
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import titan_train as tt

    args = _args()
    dist.init_process_group(backend="tpu_dist")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = tt.Config(
        dim=args.dim, layers=args.layers, seq=args.seq, batch=args.batch, hidden=2 * args.dim
    )
    params = sum(p.numel() for p in tt.build(c).parameters())
    flops_per_token = tt.model_flops_per_token(c, params)
    tokens = c.batch * c.seq
    steps = args.warmup + args.steps

    def timed(run) -> float:
        stamps: list[float] = []
        run(lambda step, loss: stamps.append(time.perf_counter()))
        measured = stamps[args.warmup :]
        return statistics.median(b - a for a, b in zip(measured, measured[1:]))

    rows = []
    for dp, tp in MESHES:
        seconds = timed(
            lambda on_step, dp=dp, tp=tp: tt.train_parallel(
                c, dp, tp, steps + 1, bf16=args.bf16, on_step=on_step
            )
        )
        rows.append((f"({dp}, {tp})", world, seconds))
    if rank == 0:
        seconds = timed(lambda on_step: tt.train_single(c, steps + 1, on_step=on_step))
        rows.append(("one process", 1, seconds))
        print(f"model: {params} parameters, {flops_per_token} training FLOPs per token, "
              f"{tokens} tokens per step")
        print("MFU = tokens/s * (6 * params + 12 * layers * dim * seq) / (devices * peak)")
        print(f"{'mesh':>12} {'devices':>8} {'step ms':>9} {'tokens/s':>10} "
              f"{'model GFLOP/s':>14} {'MFU':>7}")
        for name, devices, seconds in rows:
            rate = tokens / seconds
            flops = rate * flops_per_token
            mfu = (f"{flops / (devices * args.peak_tflops * 1e12):.2%}"
                   if args.peak_tflops else "n/a")
            print(f"{name:>12} {devices:>8} {seconds * 1e3:>9.1f} {rate:>10.1f} "
                  f"{flops / 1e9:>14.4f} {mfu:>7}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:
        bench()
    else:
        env = {**os.environ, "TORCH_TPU_PLATFORM": os.environ.get("TORCH_TPU_PLATFORM", "cpu")}
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        command += ["--nproc-per-node", "4", __file__, *sys.argv[1:]]
        sys.exit(subprocess.call(command, env=env))
