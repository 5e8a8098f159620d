"""Start-up: `import torch` stays cheap and never fails because of torch_tpu; the device
starts (JAX, environment checks, kernels) at its first use; `torch-tpu --help` answers
without torch. Every check runs in fresh processes: start-up happens once per process."""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import torch

import torch_tpu
import torch_tpu.api

ROOT = Path(__file__).resolve().parent.parent
IMPORT_BUDGET_S = 0.5  # what autoload may add to `import torch`


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def _ok(code: str, **env) -> str:
    out = _run(code, **env)
    assert out.returncode == 0, out.stderr
    return out.stdout


# ------------------------------------------------------------------ import cost


def test_import_torch_registers_the_name_but_loads_nothing_heavy():
    out = _ok(
        """
        import sys
        import torch

        has = torch._C._dispatch_has_kernel_for_dispatch_key
        print(torch._C._get_privateuse1_backend_name())
        print(sorted(m for m in ("jax", "jaxlib", "torch_tpu.ops", "torch_tpu.engine.kernels",
                                 "torch_tpu.engine.executor", "torch_tpu.cache", "torch._dynamo")
                     if m in sys.modules))
        print(has("aten::add.Tensor", "PrivateUse1"), torch.tpu.is_initialized())
        x = torch.ones(3, device="tpu")
        print("jax" in sys.modules, has("aten::add.Tensor", "PrivateUse1"),
              torch.tpu.is_initialized(), (x + 1).cpu().tolist())
        """
    )
    assert out.splitlines() == [
        "tpu",
        "[]",
        "False False",
        "True True True [2.0, 2.0, 2.0]",
    ]


def _child_cpu_seconds(env: dict) -> float:
    """CPU time (user + system) of one fresh `import torch`: far less sensitive than wall
    time to other processes on a shared machine, and just as able to show JAX's import."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import torch"], env=env, check=True, timeout=300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_autoload_adds_at_most_half_a_second_to_import_torch():
    on_env = dict(os.environ)
    off_env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    on, off = [], []
    for _ in range(5):  # interleaved, so that a burst of load hits both sides
        on.append(_child_cpu_seconds(on_env))
        off.append(_child_cpu_seconds(off_env))
    added = statistics.median(on) - statistics.median(off)
    assert added <= IMPORT_BUDGET_S, (
        f"autoload adds {added:.2f} s of CPU time to import torch (budget {IMPORT_BUDGET_S} s): "
        f"on {sorted(on)}, off {sorted(off)}"
    )


# ---------------------------------------------------------------- first use


def test_first_use_through_the_fallback_starts_the_device():
    # torch.ops calls skip PyTorch's _lazy_init: the PrivateUse1 fallback starts the device
    out = _ok(
        """
        import torch
        x = torch.ops.aten.full.default([2, 3], 1.5, dtype=torch.float32, device="tpu")
        print(torch.tpu.is_initialized(), torch.equal(x.cpu(), torch.full((2, 3), 1.5)))
        """
    )
    assert out.split() == ["True", "True"]


def test_torch_compile_decorated_before_first_use_runs_on_tpu():
    out = _ok(
        """
        import torch

        @torch.compile  # before any tpu use: the default must still route tpu graphs to `tpu`
        def f(x):
            return torch.sin(x) * 2 + 1

        x = torch.linspace(-2, 2, 7)
        print(torch.allclose(f(x.to("tpu")).cpu(), torch.sin(x) * 2 + 1, rtol=1e-6, atol=1e-6))
        """
    )
    assert out.split() == ["True"]


def test_explicit_import_and_python_m_with_autoload_off():
    out = _ok(
        """
        import sys
        import torch
        assert torch._C._get_privateuse1_backend_name() == "privateuseone"
        import torch_tpu
        print("jax" in sys.modules, torch.tpu.is_initialized())
        print(torch.arange(3, device="tpu").sum().item())
        """,
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert out.split() == ["False", "False", "3"]
    for autoload in ("0", "1"):
        check = subprocess.run(
            [sys.executable, "-m", "torch_tpu", "ops", "--check", "add.Tensor"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": autoload},
        )
        assert check.returncode == 0, check.stderr
        assert check.stdout.strip() == "aten::add.Tensor: lowered (runs on XLA)"


# ------------------------------------------------------------------ the CLI


def test_console_script_points_at_the_light_entry():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["torch-tpu"] == "torch_tpu_cli:main"


@pytest.mark.parametrize("argv", [["--help"], ["ops", "--help"], ["verify", "--help"], []])
def test_help_and_usage_errors_do_not_import_torch(argv):
    out = _run(
        f"""
        import sys
        from torch_tpu_cli import main
        try:
            main({argv!r})
        except SystemExit as e:
            print("exit", e.code, file=sys.stderr)
        print(sorted(m for m in ("torch", "jax", "torch_tpu") if m in sys.modules))
        """
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "[]"
    assert ("exit 0" if argv else "exit 2") in out.stderr  # --help exits 0, no command 2
    assert "usage: torch-tpu" in out.stdout + out.stderr


# --------------------------------------------------------- bad environment


BAD_VALUES = [
    ("TORCH_TPU_EAGER_MODE", "bogus", ValueError, ["debug", "strict", "fused", "DEFER_AND_FUSE"]),
    ("TORCH_TPU_LAUNCH_BLOCKING", "maybe", ValueError, ["1", "0"]),
    ("TORCH_TPU_DEFER_AND_FUSE", "2", ValueError, ["1", "0"]),
    ("TORCH_TPU_CHECK_NANS", "ture", ValueError, ["true", "false"]),
    ("TORCH_TPU_PLATFORM", "tpux", RuntimeError, ["cpu", "gpu", "tpu", "unset"]),
]


@pytest.mark.parametrize("name, value, error, valid", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_value_never_breaks_import_and_is_reported_at_first_use(name, value, error, valid):
    out = _ok(
        f"""
        import sys
        import torch
        print((torch.ones(2) * 3).tolist(), "jax" in sys.modules)
        for attempt in range(2):  # reported again at every use until fixed
            try:
                torch.ones(2, device="tpu")
            except {error.__name__} as e:
                print(e)
        """,
        **{name: value},
    )
    lines = out.splitlines()
    assert lines[0] == "[3.0, 3.0] False"
    assert len(lines) == 3 and lines[1] == lines[2], out
    message = lines[1]
    assert f"{name}={value!r}" in message
    for v in valid:
        assert v in message, (v, message)


@pytest.mark.parametrize(
    "text, mode",
    [
        ("fused", "DEFER_AND_FUSE"),
        ("DEFER_AND_FUSE", "DEFER_AND_FUSE"),
        (" Defer_And_Fuse ", "DEFER_AND_FUSE"),
        ("STRICT", "DEFER_NEVER"),
        ("defer_never", "DEFER_NEVER"),
        ("Debug", "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
        ("DEFER_NEVER_AND_LAUNCH_BLOCKING", "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
    ],
)
def test_eager_mode_spellings(text, mode, monkeypatch):
    from torch_tpu.engine import modes

    assert modes.parse_mode(text) is modes.EagerMode[mode]
    monkeypatch.setenv("TORCH_TPU_EAGER_MODE", text)
    assert modes.env_mode() is modes.EagerMode[mode]


def test_environment_mode_is_the_starting_mode():
    out = _ok(
        """
        import torch
        print(torch.tpu.eager_mode.name, torch.tpu.check_nans)
        x = torch.ones(2, device="tpu")
        print(torch.tpu.eager_mode.name)
        """,
        TORCH_TPU_EAGER_MODE="Defer_And_Fuse",
        TORCH_TPU_CHECK_NANS="on",
    )
    assert out.split() == ["DEFER_AND_FUSE", "True", "DEFER_AND_FUSE"]


# ---------------------------------------------------------- forced platform


def test_forced_absent_platform_is_unavailable_and_fails_clearly_at_first_use():
    out = _ok(
        """
        import torch
        print(torch.tpu.is_available(), torch.tpu.device_count(), torch.ones(2).sum().item())
        try:
            torch.ones(2, device="tpu")
        except RuntimeError as e:
            print(type(e).__name__)
            print(e)
        """,
        TORCH_TPU_PLATFORM="tpu",
    )
    lines = out.splitlines()
    if lines[0].startswith("True"):
        pytest.skip("this machine has a TPU")  # reason: the forced platform exists here
    assert lines[0] == "False 0 2.0"
    assert lines[1] == "PlatformUnavailableError"
    assert "TORCH_TPU_PLATFORM=tpu" in lines[2] and "set it to cpu" in lines[2]


def test_forced_cpu_platform_is_available():
    out = _ok(
        """
        import torch
        print(torch.tpu.is_available(), torch.tpu.device_count())
        print((torch.ones(2, device="tpu") * 2).cpu().tolist(), torch.tpu.get_device_name())
        """,
        TORCH_TPU_PLATFORM="CPU",
    )
    assert out.splitlines()[:2] == ["True 1", "[2.0, 2.0] CPU (cpu) via XLA"]


# --------------------------------------------------------------- torch.tpu


def test_dir_torch_tpu_lists_the_public_api_and_no_modules():
    names = dir(torch.tpu)
    for public in ("eager_mode", "enable_cpu_fallback", "check_nans", "EagerMode",
                   "set_eager_mode", "compiler", "is_available", "device_count",
                   "synchronize", "manual_seed_all", "Stream"):
        assert public in names
    for module in ("jax", "sys", "time", "torch", "types", "contextlib", "platform", "rng"):
        assert module not in names
    assert not [n for n in names if n.startswith("_")]


def test_every_public_definition_of_torch_tpu_is_in_all():
    # a function added to api.py without __all__ would be missing from dir(torch.tpu)
    defined = [
        name
        for name, value in vars(torch_tpu.api).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == "torch_tpu.api"
    ]
    assert sorted(set(defined) - set(torch_tpu.api.__all__)) == []
    for name in torch_tpu.api.__all__:
        assert hasattr(torch.tpu, name)
