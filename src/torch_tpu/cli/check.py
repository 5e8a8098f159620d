"""`torch-tpu check`: how ready a program is for a TPU, measured before renting one.

It runs the same program on `cpu` (the reference, without torch_tpu) and on `tpu` in
each mode asked for, every run in a process of its own, and reports per mode what
the TPU migration guide says to measure separately: output correctness against CPU,
first step (compiles) against steady state, CPU fallbacks with the source line that
caused them, recompiles with the input that changed, host syncs, peak device memory
and compilation-cache hits. It ends with a verdict and the things to fix, in the
guide's order.

Forms:
- `torch-tpu check SCRIPT.py [args]`: the script picks its device with
  `torch.accelerator.current_accelerator()` (None in the CPU run), with a `{device}`
  placeholder in its arguments (`--device {device}`), or from the
  `TORCH_TPU_CHECK_DEVICE` variable (`cpu` or `tpu`). Its printed numbers (losses,
  metrics) are compared line by line; step times come from optimizer steps.
- `torch-tpu check --model package.module:factory`: factory() returns
  `(model, example_inputs[, loss_fn])`; check trains it `--steps` AdamW steps and
  compares the first output and every loss.

Exit status: 0 ready, 1 runs but mismatches or falls back, 2 fails. The --json
schema is in docs/check.md (`"schema": "torch-tpu-check/1"`).
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

SCHEMA = "torch-tpu-check/1"
MODES = ("strict", "fused", "compiled")
# (atol, rtol) by output dtype: what reordered float arithmetic may change
TOLERANCES = {
    "float64": (1e-7, 1e-6),
    "float32": (1e-4, 1e-3),
    "bfloat16": (2e-2, 4e-2),
    "float16": (2e-3, 1e-2),
}
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan|inf", re.IGNORECASE)


class CheckError(Exception):
    """A usage problem: a clear message and exit status 2, never a traceback."""


@dataclass
class ModeReport:
    mode: str
    status: str = "ready"  # ready | mismatch | falls back | fails
    problem: str = ""
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    first_step_s: float | None = None
    steady_step_s: float | None = None
    step_seconds: list[float] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)


def _run(
    kind: str,
    target: str,
    script_args: list[str],
    device: str,
    mode: str,
    steps: int,
    timeout: float,
) -> tuple[dict, str]:
    """One child run: its JSON result and its stdout."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        command = [
            sys.executable,
            "-m",
            "torch_tpu_cli.check_run",
            "--out",
            out,
            "--device",
            device,
            "--mode",
            mode,
            "--steps",
            str(steps),
        ]
        if kind == "model":
            command += ["--model", target]
        else:
            command += [target, *[a.replace("{device}", device) for a in script_args]]
        env = dict(os.environ, TORCH_TPU_CHECK_DEVICE=device)
        if device == "cpu":
            env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        try:
            done = subprocess.run(
                command,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return {
                "error": {
                    "type": "Timeout",
                    "message": f"still running after --timeout {timeout:g} s",
                    "where": "",
                }
            }, ""
        if not os.path.exists(out):
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            return {
                "error": {
                    "type": "Crash",
                    "message": f"exit {done.returncode}: {last}",
                    "where": "",
                }
            }, done.stdout
        with open(out) as f:
            return json.load(f), done.stdout


def _compare(expected: list[float], actual: list[float], dtype: str) -> tuple[float, float, bool]:
    atol, rtol = TOLERANCES.get(dtype, TOLERANCES["float32"])
    worst_abs = worst_rel = 0.0
    ok = len(expected) == len(actual)
    for e, a in zip(expected, actual):
        if math.isnan(e) and math.isnan(a):
            continue
        diff = abs(e - a)
        if math.isnan(diff):
            diff = math.inf
        worst_abs = max(worst_abs, diff)
        worst_rel = max(worst_rel, diff / abs(e) if e else (0.0 if diff == 0 else math.inf))
        ok = ok and diff <= atol + rtol * abs(e)
    return worst_abs, worst_rel, ok


def _numbers(stdout: str) -> list[list[float]]:
    return [
        [float(x) for x in _NUMBER.findall(line)]
        for line in stdout.splitlines()
        if _NUMBER.search(line)
    ]


def _parity(kind: str, cpu: dict, cpu_out: str, run: dict, out: str) -> tuple[float, float, str]:
    """Max abs/rel error against CPU and, if they do not match, why."""
    if kind == "model":
        dtype = run["output"]["dtype"]
        a1, r1, ok1 = _compare(cpu["output"]["values"], run["output"]["values"], dtype)
        a2, r2, ok2 = _compare(cpu["losses"], run["losses"], dtype)
        problem = "" if ok1 and ok2 else ("first output differs" if not ok1 else "losses differ")
        return max(a1, a2), max(r1, r2), problem
    expected, actual = _numbers(cpu_out), _numbers(out)
    if len(expected) != len(actual):
        return (
            math.inf,
            math.inf,
            (f"the script printed {len(actual)} lines with numbers, CPU {len(expected)}"),
        )
    worst_abs = worst_rel = 0.0
    for line, (e, a) in enumerate(zip(expected, actual), 1):
        abs_err, rel_err, ok = _compare(e, a, "float32")
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        if not ok:
            return worst_abs, worst_rel, f"printed line {line} differs: {e} vs {a}"
    return worst_abs, worst_rel, ""


def _timing(report: ModeReport, seconds: list[float]) -> None:
    report.step_seconds = seconds
    if seconds:
        report.first_step_s = seconds[0]
    if len(seconds) > 1:
        report.steady_step_s = statistics.median(seconds[1:])


def _assess(kind: str, mode: str, cpu: dict, cpu_out: str, run: dict, out: str) -> ModeReport:
    report = ModeReport(mode)
    _timing(report, run.get("step_seconds", []))
    report.metrics = run.get("metrics", {})
    if "error" in run:
        e = run["error"]
        report.status = "fails"
        report.problem = f"{e['type']}: {e['message']}" + (f" ({e['where']})" if e["where"] else "")
        return report
    if report.metrics.get("ops", 0) == 0:
        report.status = "fails"
        report.problem = (
            "the program never used the tpu device: pick the device with "
            "torch.accelerator.current_accelerator(), a `{device}` argument, or "
            "TORCH_TPU_CHECK_DEVICE"
        )
        return report
    report.max_abs_error, report.max_rel_error, mismatch = _parity(kind, cpu, cpu_out, run, out)
    if mismatch:
        report.status, report.problem = "mismatch", mismatch
    elif report.metrics.get("fallbacks"):
        report.status = "falls back"
        report.problem = f"{sum(report.metrics['fallbacks'].values())} ops ran on the CPU"
    return report


def _fixes(reports: list[ModeReport], steps: int) -> list[str]:
    """The things to fix, in the migration guide's order: make it run, make it right,
    keep it on the device, keep shapes stable, then speed."""
    fixes: list[str] = []
    for r in reports:
        if r.status == "fails":
            fixes.append(f"[{r.mode}] make it run: {r.problem}")
    for r in reports:
        if r.status == "mismatch":
            fixes.append(
                f"[{r.mode}] results differ from CPU: {r.problem} "
                f"(max abs error {r.max_abs_error:.3g})"
            )
    sites = {}
    for r in reports:
        for site in r.metrics.get("fallback_sites", []):
            sites.setdefault((site["op"], site["where"]), 0)
            sites[(site["op"], site["where"])] += site["count"]
    for (op, where), n in sorted(sites.items(), key=lambda kv: -kv[1])[:5]:
        fixes.append(f"{op} runs on the CPU ({n}x) at {where}: use another op or report it")
    for r in reports:
        for rec in r.metrics.get("recompiles", [])[:2]:
            fixes.append(
                f"[{r.mode}] recompiled {rec['kind']} {rec['name']}: {rec['reason']} "
                "- keep that input's shape fixed (pad or bucket)"
            )
    for r in reports:
        syncs = r.metrics.get("host_syncs", {})
        if sum(syncs.values()) > steps:  # one a step is reading the loss
            top = max(syncs, key=syncs.get)
            fixes.append(
                f"[{r.mode}] {sum(syncs.values())} host syncs (most: {top}): each "
                "waits for the device"
            )
    return fixes


def _verdict(reports: list[ModeReport]) -> tuple[str, int]:
    statuses = {r.status for r in reports}
    if "fails" in statuses:
        return "FAILS: the program does not run in every mode", 2
    if "mismatch" in statuses:
        return "NOT READY: results differ from CPU", 1
    if "falls back" in statuses:
        return "RUNS, with CPU fallbacks: results match, some ops leave the device", 1
    return "READY: results match CPU in every mode, nothing falls back", 0


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _render(
    target: str, cpu: dict, reports: list[ModeReport], verdict: str, fixes: list[str]
) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 132)
    seconds = cpu.get("step_seconds", [])
    cpu_steady = statistics.median(seconds[1:]) if len(seconds) > 1 else None
    table = Table(title=f"torch-tpu check {escape(target)}")
    for column in (
        "mode",
        "status",
        "abs err",
        "rel err",
        "fallbacks",
        "1st step ms",
        "steady ms",
        "x CPU",
        "compiles",
        "recompiles",
        "syncs",
        "peak MiB",
        "cache hits",
    ):
        table.add_column(column, justify="left" if column in ("mode", "status") else "right")
    cpu_first = cpu["step_seconds"][0] if cpu.get("step_seconds") else None
    table.add_row(
        "cpu", "reference", "", "", "", _ms(cpu_first), _ms(cpu_steady), "1.00", "", "", "", "", ""
    )
    colors = {"ready": "green", "falls back": "yellow", "mismatch": "red", "fails": "red"}
    for r in reports:
        m = r.metrics
        ratio = f"{r.steady_step_s / cpu_steady:.2f}" if r.steady_step_s and cpu_steady else "-"
        table.add_row(
            r.mode,
            f"[{colors[r.status]}]{r.status}[/]",
            "-" if r.max_abs_error is None else f"{r.max_abs_error:.2e}",
            "-" if r.max_rel_error is None else f"{r.max_rel_error:.2e}",
            str(sum(m.get("fallbacks", {}).values())),
            _ms(r.first_step_s),
            _ms(r.steady_step_s),
            ratio,
            str(m.get("compiles", "-")),
            str(len(m.get("recompiles", []))),
            str(sum(m.get("host_syncs", {}).values())),
            f"{m['peak_memory_bytes'] / 2**20:.1f}" if "peak_memory_bytes" in m else "-",
            str(m.get("cache_hits", "-")),
        )
    console.print(table)
    for r in reports:
        if r.problem:
            console.print(f"[bold]{r.mode}[/]: {escape(r.problem)}")
    console.print(f"[bold]verdict:[/] {escape(verdict)}")
    for i, fix in enumerate(fixes[:10], 1):
        console.print(f"  {i}. {escape(fix)}")


def _plot(path: str, cpu: dict, reports: list[ModeReport]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, seconds in [("cpu", cpu.get("step_seconds", []))] + [
        (r.mode, r.step_seconds) for r in reports
    ]:
        if seconds:
            ax.plot(range(1, len(seconds) + 1), [s * 1e3 for s in seconds], marker="o", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms, log)")
    ax.set_title("warm-up (first steps compile) against steady state")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run(
    script: str | None,
    script_args: list[str],
    model: str | None,
    modes: list[str] | None,
    steps: int,
    timeout: float,
    json_path: str | None,
    plot_path: str | None,
) -> int:
    if modes is None:  # a script compiles what it chooses itself
        modes = list(MODES) if model else ["strict", "fused"]
    try:
        kind, target = _target(script, model, modes)
        if steps < 2:
            raise CheckError("--steps must be at least 2 (a first step and a steady one)")
    except CheckError as e:
        print(f"torch-tpu check: {e}", file=sys.stderr)
        return 2
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    results = {}
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True
    ) as progress:
        for device, mode in [("cpu", "eager")] + [("tpu", m) for m in modes]:
            task = progress.add_task(
                f"running on {device}" + ("" if device == "cpu" else f" ({mode})")
            )
            results[mode if device == "tpu" else "cpu"] = _run(
                kind, target, script_args, device, mode, steps, timeout
            )
            progress.remove_task(task)
            if "error" in results["cpu"][0]:
                break  # nothing to compare with: no tpu run (a hang would cost each one)
    cpu, cpu_out = results.pop("cpu")
    if "error" in cpu:
        e = cpu["error"]
        print(
            f"torch-tpu check: the program fails on the CPU reference run already: "
            f"{e['type']}: {e['message']} {e['where']}".rstrip(),
            file=sys.stderr,
        )
        return 2
    reports = [_assess(kind, mode, cpu, cpu_out, *results[mode]) for mode in modes]
    verdict, status = _verdict(reports)
    fixes = _fixes(reports, steps)
    _render(target, cpu, reports, verdict, fixes)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(
                {
                    "schema": SCHEMA,
                    "target": target,
                    "kind": kind,
                    "steps": steps,
                    "cpu": {
                        "step_seconds": cpu.get("step_seconds", []),
                        "losses": cpu.get("losses"),
                    },
                    "modes": {r.mode: r.__dict__ for r in reports},
                    "verdict": verdict,
                    "exit_status": status,
                    "fixes": fixes,
                },
                f,
                indent=1,
            )
    if plot_path:
        _plot(plot_path, cpu, reports)
    return status


def _target(script: str | None, model: str | None, modes: list[str]) -> tuple[str, str]:
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise CheckError(f"unknown mode(s) {unknown}: choose from {', '.join(MODES)}")
    if bool(script) == bool(model):
        raise CheckError("give either a SCRIPT.py or --model package.module:factory")
    if model:
        if ":" not in model:
            raise CheckError(f"--model {model!r}: expected package.module:factory")
        return "model", model
    if not os.path.isfile(script):
        raise CheckError(f"{script}: no such file")
    if "compiled" in modes:
        raise CheckError(
            "mode 'compiled' needs --model (a script compiles what it chooses "
            "itself); use --modes strict fused for a script"
        )
    return "script", script
