"""A file of PyTorch's device-generic tests, cold: tpu's wall time against CPU's.

PyTorch's own test files are what a user's test suite looks like: many small ops
at many shapes and dtypes, each run once, so nearly every call is a first call.
This runs one such file (by default `test/test_shape_ops.py`) twice, each in a
fresh pytest process: once for the CPU device and once for PrivateUse1 (`tpu`)
with an empty, private compilation cache (a temporary TORCH_TPU_CACHE_DIR), and
prints each run's wall time (start-up, collection and the tests), its passed /
failed / skipped counts (from pytest's junit XML), the tpu run's compiles (read
from `torch_tpu.metrics` at session end by a small pytest plugin), the ratio,
and the tests that fail on tpu but not on CPU (possible bugs).

The file is not in this repository (it is PyTorch's): save it outside, e.g.
  mkdir -p /tmp/pt_tests && curl -o /tmp/pt_tests/test_shape_ops.py \\
    https://raw.githubusercontent.com/pytorch/pytorch/main/test/test_shape_ops.py
(or the copy at the tag of the installed torch release).

Target (issue 12): test_shape_ops.py, cold compilation cache, tpu <= 10x CPU's wall time.

Run: python benchmarks/bench_test_file.py [--file PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_FILE = "/tmp/pt_tests/test_shape_ops.py"
SOURCE_URL = "https://raw.githubusercontent.com/pytorch/pytorch/main/test/test_shape_ops.py"
TARGET = 10.0

# Loaded into the tpu run with `-p`: writes torch_tpu's counters to a JSON file at the end.
PLUGIN = """
import json, os, sys

def pytest_sessionfinish(session, exitstatus):
    metrics = sys.modules.get("torch_tpu.metrics")
    if metrics is None:
        return
    snap = metrics.snapshot()
    jax = sys.modules.get("jax")
    out = {k: snap.get(k, 0) for k in
           ("compiles", "compile_seconds", "compile_cache_disk_hits", "cpu_fallbacks")}
    out["platform"] = jax.devices()[0].platform if jax is not None else "?"
    with open(os.environ["BENCH_TEST_FILE_METRICS"], "w") as f:
        json.dump(out, f)
"""


@dataclass
class Run:
    device: str
    wall: float
    outcomes: dict[str, str] = field(default_factory=dict)  # test id -> outcome
    messages: dict[str, str] = field(default_factory=dict)  # test id -> first line of failure
    metrics: dict = field(default_factory=dict)
    summary: str = ""

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)


def _test_id(case: ET.Element) -> str:
    """The test's name with its device taken out, so CPU's and tpu's ids match."""
    cls = case.get("classname", "").rsplit(".", 1)[-1]
    cls = re.sub(r"(CPU|PRIVATEUSE1)$", "", cls)
    name = re.sub(r"_(cpu|tpu|privateuse1)(?=_|$)", "", case.get("name", ""))
    return f"{cls}.{name}"


def _outcome(case: ET.Element) -> tuple[str, str]:
    for tag in ("failure", "error"):
        el = case.find(tag)
        if el is not None:
            message = (el.get("message") or el.text or "").strip().splitlines()
            return "failed", message[0][:160] if message else ""
    el = case.find("skipped")
    if el is not None:
        return ("xfailed" if el.get("type") == "pytest.xfail" else "skipped"), ""
    return "passed", ""


def run_file(path: Path, device: str, scratch: Path) -> Run:
    """One fresh pytest process over the file, for `device` ("cpu" or "privateuse1")."""
    root = Path(__file__).resolve().parent.parent
    junit = scratch / f"{device}.xml"
    metrics_file = scratch / f"{device}-metrics.json"
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR=device)
    env["BENCH_TEST_FILE_METRICS"] = str(metrics_file)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(scratch), str(root / "src"), env.get("PYTHONPATH")) if p
    )
    cache_dir = None
    if device != "cpu":
        cache_dir = tempfile.mkdtemp(prefix="torch_tpu_cache_")  # cold: empty and private
        os.chmod(cache_dir, 0o700)
        env["TORCH_TPU_CACHE_DIR"] = cache_dir
    command = [
        sys.executable, "-m", "pytest", path.name, "-q", "-p", "no:cacheprovider",
        "-p", "bench_test_file_plugin", f"--junitxml={junit}", f"--rootdir={path.parent}",
    ]  # fmt: skip
    start = time.perf_counter()
    out = subprocess.run(
        command, cwd=path.parent, env=env, capture_output=True, text=True, timeout=7200
    )
    wall = time.perf_counter() - start
    if cache_dir:
        shutil.rmtree(cache_dir, ignore_errors=True)
    if not junit.exists():
        raise RuntimeError(f"pytest for {device} wrote no report:\n{out.stdout[-3000:]}"
                           f"\n{out.stderr[-3000:]}")  # fmt: skip
    run = Run(device, wall)
    lines = [ln for ln in out.stdout.strip().splitlines() if ln.strip()]
    run.summary = lines[-1].strip("= ") if lines else ""
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, message = _outcome(case)
        run.outcomes[_test_id(case)] = outcome
        if message:
            run.messages[_test_id(case)] = message
    if device != "cpu" and metrics_file.exists():
        run.metrics = json.loads(metrics_file.read_text())
    return run


def print_run(label: str, run: Run) -> None:
    counts = ", ".join(
        f"{run.count(o)} {o}" for o in ("passed", "failed", "skipped", "xfailed") if run.count(o)
    )
    extra = ""
    if run.metrics:
        m = run.metrics
        extra = (
            f"; {m['compiles']} compiles ({m['compile_seconds']:.1f} s compiling), "
            f"{m['compile_cache_disk_hits']} disk cache hits, {m['cpu_fallbacks']} CPU "
            f"fallbacks, jax platform {m['platform']}"
        )
    print(f"[{label}] {run.wall:.1f} s wall: {counts}{extra}")
    print(f"  pytest: {run.summary}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=DEFAULT_FILE, help="a PyTorch device-generic test file")
    args = parser.parse_args()
    path = Path(args.file).resolve()
    if not path.is_file():
        sys.exit(
            f"no test file at {path}: save PyTorch's test/test_shape_ops.py there, e.g.\n"
            f"  mkdir -p {path.parent} && curl -o {path} {SOURCE_URL}\n"
            "(or the copy at the tag of the installed torch release), or pass --file"
        )
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "bench_test_file_plugin.py").write_text(PLUGIN)
        cpu = run_file(path, "cpu", Path(scratch))
        tpu = run_file(path, "privateuse1", Path(scratch))
    print(f"{path.name}, each run a fresh pytest process (tpu: empty compilation cache)")
    print_run("cpu", cpu)
    print_run("tpu", tpu)
    ratio = tpu.wall / cpu.wall
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"tpu / cpu wall time: {ratio:.1f}x ({verdict} the target <= {TARGET:.0f}x)")
    tpu_only = sorted(
        t for t, o in tpu.outcomes.items() if o == "failed" and cpu.outcomes.get(t) != "failed"
    )
    both = sorted(
        t for t, o in tpu.outcomes.items() if o == "failed" and cpu.outcomes.get(t) == "failed"
    )
    print(f"failing on tpu but not on cpu: {len(tpu_only)}")
    for t in tpu_only:
        print(f"  {t}: {tpu.messages.get(t, '')}")
    if both:
        print(f"failing on both: {', '.join(both)}")


if __name__ == "__main__":
    main()
