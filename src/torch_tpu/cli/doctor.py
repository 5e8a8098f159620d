"""`torch-tpu doctor`: check the environment a tpu program will run in, and say what to fix.

The checks follow the TPU migration guide's traps: a CUDA build of torch (gigabytes,
and the wrong one), versions other than the supported ones, JAX not seeing the
accelerator, libtpu missing on a TPU VM, autoload off, an unusable compilation
cache, and TORCH_TPU_* variables with invalid values. Exit 0 when all is well,
1 when something needs fixing.
"""

from __future__ import annotations

import glob
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

SUPPORTED_TORCH = "2.13.0"
SUPPORTED_JAX = ("0.10.", "jax 0.10.x")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


def _torch() -> list[Check]:
    import torch

    version = torch.__version__.split("+")[0]
    checks = [
        Check(
            "torch version",
            version == SUPPORTED_TORCH,
            torch.__version__,
            f"install torch=={SUPPORTED_TORCH} (first, before torch_tpu)",
        )
    ]
    cuda = torch.version.cuda
    checks.append(
        Check(
            "torch build",
            cuda is None,
            "CPU build" if cuda is None else f"CUDA {cuda} build",
            f"a CUDA build of torch is installed: it is gigabytes of unused CUDA libraries on "
            f"a TPU host. Reinstall the CPU build: pip uninstall torch, then install "
            f"torch=={SUPPORTED_TORCH} from the CPU wheel index",
        )
    )
    return checks


def _jax() -> list[Check]:
    checks = []
    for package in ("jax", "jaxlib"):
        try:
            version = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            checks.append(Check(package, False, "not installed", f"pip install '{package}<0.11'"))
            continue
        checks.append(
            Check(
                package,
                version.startswith(SUPPORTED_JAX[0]),
                version,
                f"install {SUPPORTED_JAX[1]} (pip install '{package}>=0.10,<0.11')",
            )
        )
    if not all(c.ok for c in checks):
        return checks
    import jax

    seen = []
    for platform in ("tpu", "gpu", "cpu"):
        try:
            devices = jax.devices(platform)
        except RuntimeError:
            continue
        seen.append(f"{platform} x{len(devices)} ({devices[0].device_kind})")
    checks.append(Check("platforms JAX sees", bool(seen), ", ".join(seen) or "none"))
    return checks


def _on_tpu_vm() -> bool:
    return bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))


def _libtpu() -> list[Check]:
    if not _on_tpu_vm():
        return [Check("libtpu", True, "not a TPU VM (no /dev/accel*): not needed")]
    found = importlib.util.find_spec("libtpu") is not None
    return [
        Check(
            "libtpu",
            found,
            "installed" if found else "missing on a TPU VM",
            "pip install 'jax[tpu]' matching your jax version",
        )
    ]


def _autoload() -> list[Check]:
    points = importlib.metadata.entry_points(group="torch.backends")
    registered = any(p.value.startswith("torch_tpu") for p in points)
    disabled = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD", "1") == "0"
    if not registered:
        return [
            Check(
                "autoload",
                False,
                "torch_tpu's torch.backends entry point is not installed",
                "reinstall torch_tpu (pip install -e .)",
            )
        ]
    detail = "off (TORCH_DEVICE_BACKEND_AUTOLOAD=0): scripts must `import torch_tpu`"
    return [Check("autoload", True, detail if disabled else "on: `import torch` loads the device")]


def _cache() -> list[Check]:
    from .. import cache

    stats = cache.stats()
    if stats["directory"] is None:
        return [Check("compilation cache", True, "memory only (TORCH_TPU_PERSISTENT_CACHE=0)")]
    if stats["problem"]:
        return [Check("compilation cache", False, stats["problem"], "see the message")]
    size = stats["disk_bytes"] / 2**20
    return [
        Check(
            "compilation cache",
            True,
            f"{stats['directory']}: {stats['disk_entries']} entries, {size:.1f} MiB of "
            f"{stats['max_bytes'] / 2**20:.0f} MiB",
        )
    ]


def _variables() -> list[Check]:
    from .. import env

    checks = []
    for name in sorted(k for k in os.environ if k.startswith("TORCH_TPU_")):
        problem = env.problem(name)
        checks.append(Check(name, problem is None, os.environ[name], problem or ""))
    return checks or [Check("TORCH_TPU_* variables", True, "none set")]


_SECTIONS: tuple[Callable[[], list[Check]], ...] = (
    _torch,
    _jax,
    _libtpu,
    _autoload,
    _variables,
    _cache,
)


def run() -> int:
    failed = 0
    width = 24
    for section in _SECTIONS:
        try:
            checks = section()
        except Exception as e:  # a check that breaks is itself a finding, not a traceback
            checks = [Check(section.__name__.strip("_"), False, f"{type(e).__name__}: {e}")]
        for check in checks:
            mark = "ok  " if check.ok else "FIX "
            print(f"{mark}{check.name:<{width}}{check.detail}")
            if not check.ok:
                failed += 1
                if check.fix:
                    print(f"{'':<{width + 4}}-> {check.fix}")
    print("all is well" if not failed else f"{failed} thing(s) to fix")
    return 0 if not failed else 1
