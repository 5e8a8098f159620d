"""`torch-tpu check`, `migrate` and `doctor`, run as a user runs them (fresh processes)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from torch_tpu.cli.migrate import migrate_source

HERE = Path(__file__).parent
PROGRAMS = HERE / "check_programs"
CORPUS = HERE / "migrate_corpus"


def _cli(*args, cwd=PROGRAMS, env=None, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "torch_tpu", *args],
        cwd=cwd,
        env=dict(os.environ, **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ------------------------------------------------------------------- check


def test_check_model_ready_in_every_mode(tmp_path):
    report, plot = tmp_path / "r.json", tmp_path / "steps.png"
    done = _cli(
        "check", "--model", "models:mlp", "--steps", "3", "--json", str(report), "--plot", str(plot)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "READY" in done.stdout
    data = json.loads(report.read_text())
    assert data["schema"] == "torch-tpu-check/1" and data["exit_status"] == 0
    assert set(data["modes"]) == {"strict", "fused", "compiled"}
    for mode in data["modes"].values():
        assert mode["status"] == "ready" and mode["max_abs_error"] < 1e-4
        assert len(mode["step_seconds"]) == 3 and mode["metrics"]["fallbacks"] == {}
        assert mode["first_step_s"] > 0 and mode["steady_step_s"] > 0
    assert plot.read_bytes().startswith(b"\x89PNG")


def test_check_reports_fallback_line_and_recompile(tmp_path):
    report = tmp_path / "r.json"
    done = _cli("check", "--modes", "fused", "--json", str(report), "fallback_and_recompile.py")
    assert done.returncode == 1, done.stdout + done.stderr
    fused = json.loads(report.read_text())["modes"]["fused"]
    assert fused["status"] == "falls back"
    sites = fused["metrics"]["fallback_sites"]
    assert any(
        "special_airy_ai" in s["op"] and "fallback_and_recompile.py:11" in s["where"] for s in sites
    ), sites
    assert fused["metrics"]["recompiles"], "the changing length must show as a recompile"
    assert "shape (3, 4) -> (4, 4)" in json.dumps(fused["metrics"]["recompiles"])
    assert "fallback_and_recompile.py:11" in done.stdout  # the fix names the user's line


def test_check_script_with_device_argument_matches():
    done = _cli("check", "--modes", "strict", "device_argument.py", "--device", "{device}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "READY" in done.stdout


def test_check_numeric_mismatch(tmp_path):
    report = tmp_path / "r.json"
    done = _cli("check", "--modes", "strict", "--json", str(report), "mismatch.py")
    assert done.returncode == 1, done.stdout + done.stderr
    strict = json.loads(report.read_text())["modes"]["strict"]
    assert strict["status"] == "mismatch" and strict["max_abs_error"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "args, message",
    [
        (["raises.py"], "this script is broken on purpose"),
        (["--timeout", "15", "hangs.py"], "--timeout 15"),
        (["--modes", "strict", "cpu_only.py"], "never used the tpu device"),
        (["--model", "no_such_module:factory"], "No module named 'no_such_module'"),
        (["--model", "models"], "expected package.module:factory"),
        (["missing.py"], "no such file"),
    ],
)
def test_check_failures_are_clear(args, message):
    done = _cli("check", *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


# ----------------------------------------------------------------- migrate


@pytest.mark.parametrize("name", sorted(p.name.split(".")[0] for p in CORPUS.glob("*.cuda.txt")))
def test_migrate_corpus(name):
    source = (CORPUS / f"{name}.cuda.txt").read_text()
    expected = (CORPUS / f"{name}.tpu.txt").read_text()
    result = migrate_source(source, name)
    assert result.migrated == expected
    assert migrate_source(result.migrated).migrated == result.migrated  # idempotent


def test_migrate_lists_what_it_cannot_migrate():
    result = migrate_source((CORPUS / "unmigratable.cuda.txt").read_text(), "u.py")
    found = {(f.line, f.message.split(":")[0]) for f in result.manual}
    assert found == {
        (3, "import of cupy"),
        (5, "import of triton"),
        (6, "import of torch.utils.cpp_extension"),
        (8, "NCCL_IB_DISABLE"),
        (10, "torch.cuda.CUDAGraph"),
        (11, "torch.cuda.graph"),
        (13, "torch.cuda.nvtx"),
        (14, "torch.compile(backend='inductor') cannot compile tpu tensors"),
    }


def test_migrate_writes_only_when_asked_and_leaves_bad_files(tmp_path):
    script = tmp_path / "train.py"
    script.write_text((CORPUS / "train.cuda.txt").read_text())
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n    torch.cuda.synchronize()\n")
    before = script.read_text()
    shown = _cli("migrate", str(tmp_path), "--diff", cwd=tmp_path)
    assert shown.returncode == 2  # the unparsable file
    assert "broken.py: cannot parse" in shown.stderr and "left untouched" in shown.stderr
    assert '+device = "tpu" if torch.accelerator.is_available() else "cpu"' in shown.stdout
    assert script.read_text() == before and broken.read_text().startswith("def f(:")
    script.unlink()
    shutil.copy(CORPUS / "train.cuda.txt", script)
    done = _cli("migrate", str(script), "--write", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert script.read_text() == (CORPUS / "train.tpu.txt").read_text()
    again = _cli("migrate", str(script), cwd=tmp_path)
    assert "0 would migrate" in again.stdout


def test_migrated_training_script_matches_cpu(tmp_path):
    """The migrated CUDA script runs on tpu to CPU's losses (check compares its prints)."""
    script = tmp_path / "train.py"
    shutil.copy(CORPUS / "train.tpu.txt", script)
    done = _cli("check", "--modes", "strict", str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "READY" in done.stdout


# ------------------------------------------------------------------ doctor


def test_doctor_healthy(tmp_path):
    done = _cli("doctor", env={"TORCH_TPU_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all is well" in done.stdout and "torch version" in done.stdout


def test_doctor_broken_environment(tmp_path):
    blocker = tmp_path / "cache"
    blocker.write_text("a file where the cache directory should be")
    done = _cli(
        "doctor",
        env={"TORCH_TPU_CACHE_DIR": str(blocker), "TORCH_TPU_EAGER_MODE": "fastest"},
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "TORCH_TPU_EAGER_MODE" in done.stdout and "fastest" in done.stdout
    assert "not a directory" in done.stdout
    assert "2 thing(s) to fix" in done.stdout
