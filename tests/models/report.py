"""The whole model zoo, every case in every mode, written to docs/models_report.md.

    python tests/models/report.py                      # everything (about an hour on 2 cores)
    python tests/models/report.py --jobs 2             # two cases at a time (times get noisier)
    python tests/models/report.py --cases lstm,gru --modes strict --out /tmp/r.md

Each case runs in a subprocess of its own (its modes one after the other), so
a crash or a hang costs that case's cells, never the report: a case that
dies or passes `--timeout` seconds is reported as an error in every mode it
had not finished.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from importlib import metadata

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
MARK = "ZOO-CELL "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--modes", default="strict,fused,compiled")
    parser.add_argument("--out", default=str(ROOT / "docs" / "models_report.md"))
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per case")
    parser.add_argument("--jobs", type=int, default=1, help="cases run at once")
    parser.add_argument("--state", help="JSON-lines file of finished cells: appended to as"
                        " cases finish, and cases already in it are not run again")  # fmt: skip
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if args.worker:
        return _work(args.worker, modes)

    import zoo

    names = args.cases.split(",") if args.cases else list(zoo.CASES)
    unknown = [n for n in names if n not in zoo.CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {list(zoo.CASES)}")
    started = time.time()
    state = pathlib.Path(args.state) if args.state else None
    saved = state.read_text().splitlines() if state and state.exists() else []
    cells = [json.loads(line) for line in saved]
    cells = [c for c in cells if c["case"] in names and c["mode"] in modes]
    finished = {c["case"] for c in cells}
    lock = threading.Lock()
    resumed = bool(finished)

    def write() -> None:
        seconds = time.time() - started
        text = render(cells, [zoo.CASES[n] for n in names], modes, seconds, resumed)
        pathlib.Path(args.out).write_text(text)

    def run(name: str) -> None:
        done = _run_case(name, modes, args.timeout)
        print(f"{name}: " + ", ".join(f"{c['mode']} {c['status']}" for c in done), flush=True)
        with lock:  # the report is rewritten as each case finishes: a cut run still tells
            cells.extend(done)
            if state:
                with state.open("a") as file:
                    file.writelines(json.dumps(c) + "\n" for c in done)
            write()

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(run, [n for n in names if n not in finished]))
    write()  # (also when every case was in the state file: the report is rendered anew)
    print(f"wrote {args.out}")
    return 0


def _work(name: str, modes: list[str]) -> int:
    """In the subprocess: run one case's cells, printing each as a JSON line."""
    import warnings

    warnings.simplefilter("ignore")  # fallbacks are counted in the cells
    import harness
    import zoo

    for mode in modes:
        cell = harness.run_cell(zoo.CASES[name], mode)
        print(MARK + json.dumps(dataclasses.asdict(cell)), flush=True)
    return 0


def _run_case(name: str, modes: list[str], timeout: float) -> list[dict]:
    command = [sys.executable, __file__, "--worker", name, "--modes", ",".join(modes)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        stdout, why = done.stdout, f"the case's process exited with status {done.returncode}"
        tail = done.stderr.strip().splitlines()[-1:] if done.returncode else []
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        why, tail = f"the case passed the {timeout:.0f} s timeout", []
    cells = [json.loads(line[len(MARK) :]) for line in (stdout or "").splitlines()
             if line.startswith(MARK)]  # fmt: skip
    for mode in modes[len(cells) :]:
        detail = why + (f": {tail[0][:200]}" if tail else "")
        cells.append({"case": name, "mode": mode, "status": "error", "detail": detail,
                      "max_error": None, "tolerance_used": None, "generate": "",
                      "fallbacks": {}, "trace": ""})  # fmt: skip
    return cells


def _seconds(value) -> str:
    if value is None:
        return "–"
    return f"{value * 1e3:.0f} ms" if value < 1 else f"{value:.1f} s"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _versions() -> str:
    names = ("torch", "transformers", "timm", "torchvision", "jax")
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (absent)")
    return ", ".join(found)


def render(
    cells: list[dict], cases: list, modes: list[str], seconds: float, resumed: bool = False
) -> str:
    by_key = {(c["case"], c["mode"]): c for c in cells}
    passed = sum(c["status"] == "pass" for c in cells)
    not_run = [case.name for case in cases if (case.name, modes[0]) not in by_key]
    cases = [case for case in cases if case.name not in not_run]
    resumed_note = " (resumed: the cells of a state file, run earlier)" if resumed else ""
    lines = [
        "# Model zoo report",
        "",
        "Written by `python tests/models/report.py` (see docs/models.md); do not edit by hand.",
        f"Run {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC in {seconds / 60:.0f} min"
        f"{resumed_note} with {_versions()}; load average {os.getloadavg()[0]:.1f} on"
        f" {os.cpu_count()} cores at the end (times are wall-clock and shared with whatever"
        " else ran).",
        "",
        f"**{passed} of {len(cells)} cells pass.** A cell is one model in one mode: AdamW"
        " training steps, the first and the fourth compared with the CPU's step from the"
        " same state (outputs, loss, every gradient, every parameter's update, buffers,"
        " optimizer state), and for language models greedy `generate()` of"
        " a few tokens, which must be the CPU's tokens. A tensor matches when"
        " `allclose(rtol=1e-3, atol=max(1e-4·max|cpu|, 1e-6·max|cpu| of its group))`, the"
        " group being the gradients, the updates (which also allow 4 ulps of the weight),"
        " the outputs, or one kind of buffer or optimizer state; where the CPU's own float32"
        " gradients miss float64 (a ReLU kink crossed by rounding) a step's gradients are"
        " held to a relative norm error of 5e-2 instead, as *detail* says. *max error* is"
        " the largest max|tpu − cpu| / max|cpu| of a tensor whose own scale sets its"
        " tolerance; *of tolerance* the largest |tpu − cpu| / allowed of"
        " any element (a cell passes at ≤ 1). *first* is the first step"
        " (compiles included, in a fresh process with a warm or cold disk cache as found),"
        " *steady* the mean of two steps after the fourth; both against the CPU's eager"
        " step.",
        "",
        "## Summary",
        "",
        *([f"Not run (the run was cut short; `--state` resumes it): {', '.join(not_run)}.", ""]
          if not_run else []),
        "| model | source | " + " | ".join(modes) + " |",
        "|---|---|" + "---|" * len(modes),
    ]
    for case in cases:
        row = [by_key[(case.name, m)]["status"] for m in modes]
        lines.append(f"| {case.name} | {case.source} | " + " | ".join(row) + " |")
    lines += [
        "",
        "## Cells",
        "",
        "| model | mode | status | max error | of tolerance | generate"
        " | fell back to CPU (op: calls) | first tpu / cpu | steady tpu / cpu | detail |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        for mode in modes:
            c = by_key[(case.name, mode)]
            error = "–" if c.get("max_error") is None else f"{c['max_error']:.1e}"
            used = "–" if c.get("tolerance_used") is None else f"{c['tolerance_used']:.2f}"
            generate = c.get("generate") or "–"
            generate = generate if len(generate) < 40 else generate[:37] + "..."
            fallbacks = ", ".join(f"`{op.removeprefix('aten::')}`: {n}"
                                  for op, n in sorted(c["fallbacks"].items())) or "–"  # fmt: skip
            first = f"{_seconds(c.get('first_s'))} / {_seconds(c.get('cpu_first_s'))}"
            steady = f"{_seconds(c.get('steady_s'))} / {_seconds(c.get('cpu_steady_s'))}"
            lines.append(
                f"| {case.name} | {mode} | {c['status']} | {error} | {used} | {_escape(generate)}"
                f" | {fallbacks} | {first} | {steady} | {_escape(c['detail'] or '')} |"
            )
    ops: dict[str, set] = {}
    for c in cells:
        for op in c["fallbacks"]:
            ops.setdefault(op, set()).add(c["case"])
    lines += ["", "## Ops that fell back to the CPU", ""]
    lines += [f"- `{op}`: {', '.join(sorted(names))}" for op, names in sorted(ops.items())]
    lines += [] if ops else ["None."]
    failures = [c for c in cells if c["status"] != "pass"]
    lines += ["", "## Failures, first lines", ""]
    for c in failures:
        generate = c.get("generate", "")
        generate = f"; generate: {_escape(generate)}" if generate not in ("", "same") else ""
        lines.append(f"- {c['case']} / {c['mode']}: {c['status']}: {_escape(c['detail'] or '')}"
                     + generate)  # fmt: skip
    lines += [] if failures else ["None."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
