"""Issue 12's target table in one run: each figure's benchmark, in turn, with its anchor.

Each row is its own script (a fresh process, so one row's compiles and memory
do not reach the next); this one runs them in sequence and prints their output
under the figure it answers. Every script prints our figure beside the
substrate's own limit measured in the same process (JAX jitted, PyTorch CPU
eager, CPU Inductor), so each ratio is from one run even when the machine is
noisy.

Run: python benchmarks/bench_targets.py [--quick] [--only memory,strict,...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent

# (name, what it answers, script, arguments, arguments with --quick)
ROWS = [
    # (the target's own model even with --quick: at --small's 6M parameters, XLA's compile
    # memory outweighs the state, and the compiled row read 1.15-1.74x from run to run)
    ("memory", "peak memory, AdamW 101M MLP, vs PyTorch CPU eager (target <= 1.15x)",
     "bench_memory.py", [], []),
    ("strict", "strict a + b 64x64 vs JAX jitted dispatch (target <= 2x)",
     "bench_strict.py", ["--per-op"], ["--per-op", "--quick"]),
    ("step", "compiled whole step vs hand-written JAX step (<= 1.15x) and CPU Inductor",
     "bench_step.py", [], ["--workloads", "gpt_small", "--rounds", "2"]),
    ("modes", "fused vs strict on mlp / gpt / gpt_small (>= 1.0x / 1.3x / 2x)",
     "bench_modes.py", [], ["--steps", "3", "--workloads", "mlp", "gpt_small"]),
    ("first_call", "compile time per new op shape (<= 20 ms), cold first steps (<= 1/4)",
     "bench_first_call.py", [], ["--shapes", "1"]),
    ("test_file", "PyTorch's test_shape_ops.py, cold cache, tpu vs CPU wall time (<= 10x)",
     "bench_test_file.py", [], []),
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller settings per row")
    parser.add_argument("--only", default=",".join(r[0] for r in ROWS))
    args = parser.parse_args()
    chosen = args.only.split(",")
    unknown = set(chosen) - {r[0] for r in ROWS}
    if unknown:
        parser.error(f"unknown rows {sorted(unknown)}; choose from {[r[0] for r in ROWS]}")
    failed = []
    for name, answers, script, full, quick in ROWS:
        if name not in chosen:
            continue
        command = [sys.executable, str(HERE / script), *(quick if args.quick else full)]
        print(f"\n=== {name}: {answers}\n$ {' '.join(command[1:])}", flush=True)
        start = time.perf_counter()
        result = subprocess.run(command, cwd=HERE.parent)
        print(f"--- {name}: {time.perf_counter() - start:.0f} s, exit {result.returncode}")
        if result.returncode:
            failed.append(name)
    if failed:
        sys.exit(f"rows that failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
