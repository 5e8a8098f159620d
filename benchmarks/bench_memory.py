"""Peak memory of AdamW training, as a multiple of the ideal state (issue 12).

A 6 x Linear(4096) MLP (101M parameters), batch 8, MSE loss, AdamW: the state
that must live is parameters + gradients + two moments (4 x 384 MiB = 1536
MiB). Each configuration runs in a fresh subprocess, which reports its peak
resident memory (VmHWM, reset at the start through /proc/self/clear_refs)
above its resident memory at the start (imports done, device started, before
the model exists). On XLA:CPU the device's buffers are host memory, so this
counts them. Configurations: PyTorch CPU eager; tpu strict and fused eager;
torch.compile of the step ("compiled"); torch_tpu.compile_step, and the same
with keep_grads=False ("compile_step_nograds": no gradient held between steps,
as in a jitted JAX step; its ideal is three copies, not four). Printed: peak
above start in MiB, that as a multiple of the ideal state, and the ratio to
PyTorch CPU eager (issue 12's target: <= 1.15x).

Run: python benchmarks/bench_memory.py [--small] [--steps N] [--only cpu,strict,...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CONFIGS = ("cpu", "strict", "fused", "compiled", "compile_step", "compile_step_nograds")


def _rss_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} missing from /proc/self/status")


def _reset_peak() -> None:
    """Start VmHWM afresh (Linux: writing 5 to clear_refs resets the peak RSS)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def child(config: str, width: int, steps: int) -> dict:
    import torch

    import torch_tpu

    device = "cpu" if config == "cpu" else "tpu"
    if device == "tpu":
        torch.ones(1, device="tpu").add_(1).cpu()  # start the device and JAX's backend
    torch.manual_seed(0)
    x = torch.randn(8, width, device=device)
    y = torch.randn(8, width, device=device)
    if device == "tpu":
        torch.tpu.synchronize()
    _reset_peak()
    start = _rss_mib("VmRSS")

    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, device=device) for _ in range(6)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = sum(p.numel() for p in model.parameters())

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    error = None
    if config == "compiled":
        step = torch.compile(step, backend="tpu")
    if config.startswith("compile_step"):
        keep = config == "compile_step"
        whole = torch_tpu.compile_step(model, opt, torch.nn.functional.mse_loss, keep_grads=keep)

        def step():
            return whole(x, y)

    mode = torch.tpu.set_eager_mode("fused") if config == "fused" else None
    try:
        if mode is not None:
            mode.__enter__()
        for _ in range(steps):
            step().item()  # a training loop that logs its loss waits for each step
    except Exception as e:  # report what broke; the table still prints
        error = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    finally:
        if mode is not None:
            mode.__exit__(None, None, None)
    if device == "tpu":
        torch.tpu.synchronize()
    peak = _rss_mib("VmHWM")
    return {
        "config": config,
        "params": params,
        "ideal_mib": 4 * params * 4 / 2**20,
        "peak_above_start_mib": peak - start,
        "error": error,
    }


def run(config: str, width: int, steps: int) -> dict:
    env = dict(os.environ)
    command = [sys.executable, __file__, "--child", config, "--width", str(width)]
    command += ["--steps", str(steps)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"config": config, "error": f"exit {done.returncode}: {tail[0][:160]}"}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true", help="6 x Linear(1024), 3 steps")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--only", default=",".join(CONFIGS), help="comma-separated configs")
    parser.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    width = args.width or (1024 if args.small else 4096)
    steps = args.steps or (3 if args.small else 4)
    if args.child:
        print(json.dumps(child(args.child, width, steps)))
        return
    results = [run(c, width, steps) for c in args.only.split(",")]
    cpu = next((r for r in results if r["config"] == "cpu" and not r.get("error")), None)
    first = next((r for r in results if "ideal_mib" in r), None)
    if first:
        print(
            f"AdamW, 6 x Linear({width}), batch 8, {steps} steps: {first['params'] / 1e6:.1f}M "
            f"params, ideal state {first['ideal_mib']:.0f} MiB"
        )
    print(f"{'config':<20} {'peak above start':>17} {'x ideal':>8} {'vs cpu eager':>13}")
    for r in results:
        if "peak_above_start_mib" not in r:
            print(f"{r['config']:<20} failed: {r['error']}")
            continue
        multiple = r["peak_above_start_mib"] / r["ideal_mib"]
        vs_cpu = f"{r['peak_above_start_mib'] / cpu['peak_above_start_mib']:.2f}x" if cpu else "-"
        print(
            f"{r['config']:<20} {r['peak_above_start_mib']:>13.0f} MiB {multiple:>7.2f}x "
            f"{vs_cpu:>13}" + (f"  ({r['error']})" if r["error"] else "")
        )


if __name__ == "__main__":
    main()
