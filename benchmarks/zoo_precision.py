"""Which side misses: one zoo case's first-step gradients in float32 on the CPU and on
tpu, each against the same step in float64 on the CPU.

A zoo cell that fails on a TPU compares tpu with CPU float32; this says whether tpu or
the CPU is the further from the exact step, per parameter (max |g - g64| / max |g64|;
gradients zero in exact arithmetic, below 1e-6 of the largest, are left out).

Run: python benchmarks/zoo_precision.py efficientnet_b0 [--rows 12]
(needs the `models` extra; docs/on_tpu.md, fifteenth run, used it on a v5e.)
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "models"))
import zoo  # noqa: E402  (the zoo's cases live with its tests)

import torch_tpu  # noqa: E402, F401  (registers the device)


def first_step_gradients(built: zoo.Built, device: str, dtype: torch.dtype):
    """(loss, {name: gradient as float64 on the CPU}) of one forward and backward."""
    model = copy.deepcopy(built.model).to(device=device, dtype=dtype)
    args = [a.to(device=device, dtype=dtype) if a.is_floating_point() else a.to(device)
            for a in built.args]  # fmt: skip
    loss = zoo.loss_of(model(*args, **built.kwargs))
    loss.backward()
    grads = {n: p.grad.detach().to("cpu", torch.float64) for n, p in model.named_parameters()
             if p.grad is not None}  # fmt: skip
    return loss.item(), grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", help="a zoo case name (tests/models/zoo.py)")
    parser.add_argument("--rows", type=int, default=12, help="worst parameters to list")
    args = parser.parse_args()
    built = zoo.CASES[args.case].build()
    exact_loss, exact = first_step_gradients(built, "cpu", torch.float64)
    cpu_loss, cpu = first_step_gradients(built, "cpu", torch.float32)
    tpu_loss, tpu = first_step_gradients(built, "tpu", torch.float32)
    largest = max(g.abs().max().item() for g in exact.values())
    rows = []
    for name, g in exact.items():
        scale = g.abs().max().item()
        if scale > 1e-6 * largest:
            errors = [(other[name] - g).abs().max().item() / scale for other in (cpu, tpu)]
            rows.append((errors[1], errors[0], name))
    rows.sort(reverse=True)
    print(f"loss relative error: cpu {abs(cpu_loss - exact_loss) / abs(exact_loss):.2e}, "
          f"tpu {abs(tpu_loss - exact_loss) / abs(exact_loss):.2e}")  # fmt: skip
    print(f"median over {len(rows)} parameters: cpu {statistics.median(r[1] for r in rows):.2e}, "
          f"tpu {statistics.median(r[0] for r in rows):.2e}; tpu further in "
          f"{sum(r[0] > r[1] for r in rows)}")  # fmt: skip
    print("tpu err   cpu err   parameter")
    for tpu_error, cpu_error, name in rows[: args.rows]:
        print(f"{tpu_error:.2e}  {cpu_error:.2e}  {name}")


if __name__ == "__main__":
    main()
