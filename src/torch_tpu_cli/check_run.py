"""One run of `torch-tpu check`: the user's script or model on one device, in one mode,
in a process of its own (so a crash, a hang or a leaked global cannot touch the other
runs). Writes what it saw as JSON to --out; the script's own output goes to stdout.

The CPU reference runs without torch_tpu (TORCH_DEVICE_BACKEND_AUTOLOAD=0, and this
module lives outside the torch_tpu package so that running it imports nothing of
ours), so a script that picks its device with
`torch.accelerator.current_accelerator()` gets `cpu` there and `tpu` in the other
runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import sys
import time
import traceback

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

_NOT_USER_CODE = (
    os.sep + "site-packages" + os.sep,
    os.sep + "torch_tpu" + os.sep,
    os.sep + "torch_tpu_cli" + os.sep,
    "<frozen",
)
OUTPUT_ELEMENTS = 4096  # of the first step's output kept for the comparison


def _user_error(e: BaseException) -> dict:
    frames = [
        f"{f.filename}:{f.lineno} in {f.name}"
        for f in traceback.extract_tb(e.__traceback__)
        if not any(part in f.filename for part in _NOT_USER_CODE)
    ]
    return {
        "type": type(e).__name__,
        "message": str(e).splitlines()[0][:500] if str(e) else "",
        "where": frames[-1] if frames else "",
    }


class _StepClock:
    """Times each optimizer step (from the end of the previous one): a script needs no
    change for its step times to be seen."""

    def __init__(self, sync) -> None:
        self.sync = sync
        self.times: list[float] = []
        self.last = time.perf_counter()

    def tick(self, *_args) -> None:
        self.sync()
        now = time.perf_counter()
        self.times.append(now - self.last)
        self.last = now


def _load_factory(spec: str):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"--model {spec!r}: expected package.module:factory")
    sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"module {module_name!r} has no attribute {attr!r}") from None


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def _first_tensor(out):
    if isinstance(out, torch.Tensor):
        return out
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, dict):
        out = list(out.values())
    for v in out if isinstance(out, (list, tuple)) else ():
        t = _first_tensor(v)
        if t is not None:
            return t
    logits = getattr(out, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else None


def _run_model(spec: str, device: str, mode: str, steps: int, clock: _StepClock) -> dict:
    factory = _load_factory(spec)
    torch.manual_seed(0)
    made = factory()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise TypeError(f"{spec} must return (model, example_inputs[, loss_fn]), got {type(made)}")
    model, inputs, loss_fn = (*made, None) if len(made) == 2 else made
    model = model.to(device)
    inputs = _to(inputs, device)
    runner = torch.compile(model, backend="tpu") if mode == "compiled" else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, output = [], None
    clock.last = time.perf_counter()
    for step in range(steps):
        if isinstance(inputs, dict):
            out = runner(**inputs)
        elif isinstance(inputs, (list, tuple)):
            out = runner(*inputs)
        else:
            out = runner(inputs)
        first = _first_tensor(out)
        if first is None:
            raise TypeError("the model's output holds no tensor to compare")
        if step == 0:
            flat = first.detach().float().reshape(-1)[:OUTPUT_ELEMENTS].cpu()
            output = {"values": flat.tolist(), "dtype": str(first.dtype).removeprefix("torch.")}
        loss = loss_fn(out) if loss_fn is not None else first.float().pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return {"losses": losses, "output": output}


def _run_script(path: str, args: list[str]) -> dict:
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as e:
        if e.code not in (None, 0):
            raise RuntimeError(f"the script exited with status {e.code}") from None
    return {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torch_tpu_cli.check_run")
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=["cpu", "tpu"], required=True)
    parser.add_argument("--mode", default="eager")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model")
    parser.add_argument("script", nargs="?")
    parser.add_argument("script_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)

    metrics = None
    sync = lambda: None  # noqa: E731
    if args.device == "tpu":
        import torch_tpu
        from torch_tpu import metrics

        if args.mode in ("strict", "fused", "debug"):
            torch.tpu.eager_mode = args.mode
        metrics.locate_fallbacks = True
        metrics.reset()
        torch.tpu.reset_peak_memory_stats()
        sync = torch.tpu.synchronize
        assert torch_tpu
    clock = _StepClock(sync)
    register_optimizer_step_post_hook(clock.tick)
    result: dict = {"device": args.device, "mode": args.mode}
    start = time.perf_counter()
    try:
        if args.model:
            result.update(_run_model(args.model, args.device, args.mode, args.steps, clock))
        else:
            result.update(_run_script(args.script, args.script_args))
    except BaseException as e:  # the user's error is a finding: report it, don't crash
        result["error"] = _user_error(e)
    sync()
    result["wall_seconds"] = time.perf_counter() - start
    result["step_seconds"] = clock.times
    if metrics is not None:
        snap = metrics.snapshot()
        result["metrics"] = {
            "ops": snap.get("ops_dispatched", 0) + snap.get("ops_deferred", 0),
            "compiles": snap.get("compiles", 0),
            "compile_seconds": snap.get("compile_seconds", 0.0),
            "fallbacks": snap["fallback_ops"],
            "fallback_sites": [
                {"op": op, "where": where, "count": n}
                for (op, where), n in metrics.fallback_sites().items()
            ],
            "recompiles": [
                {"kind": e.kind, "name": e.name, "reason": e.reason}
                for e in metrics.compiles()
                if e.reason is not None
            ],
            "host_syncs": {
                k.split(": ", 1)[1]: v for k, v in snap.items() if k.startswith("host sync: ")
            },
            "peak_memory_bytes": torch.tpu.max_memory_allocated(),
        }
        from torch_tpu import cache

        stats = cache.stats()
        result["metrics"]["cache_hits"] = stats["memory_hits"] + stats["disk_hits"]
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
