"""Every TORCH_TPU_* variable torch_tpu reads, and whether its value is valid.

Checked when the device first starts (`torch_tpu.init()`), never at import: a bad
value must not break programs that do not use the device, and must stop one that
does at once, naming the variable, the valid values and the fix — not later, in
the middle of a run. `torch-tpu doctor` asks the same questions.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def integer(name: str, default: int, minimum: int) -> int:
    """The variable as an integer of at least `minimum` (default when unset)."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(
            f"{name}={raw!r} is not an integer >= {minimum}; fix it, or unset it for "
            f"the default ({default})"
        )
    return value


def flag(name: str, default: bool = False) -> bool:
    """The variable as a switch: 1/true/yes/on, 0/false/no/off (default when unset)."""
    from .engine.modes import env_flag

    return env_flag(name, default)


def _eager_mode() -> None:
    from .engine.modes import env_mode

    env_mode()


def _platform() -> None:
    from .platform import forced

    forced()


def _one_of(name: str, values: tuple[str, ...]) -> Callable[[], None]:
    def check() -> None:
        raw = os.environ.get(name, "")
        if raw.strip().lower() not in values:
            raise ValueError(f"{name}={raw!r} is not one of {', '.join(values)}")

    return check


def _path(name: str) -> Callable[[], None]:
    def check() -> None:
        if not os.environ.get(name, "").strip():
            raise ValueError(f"{name} is set but empty: give a path, or unset it")

    return check


def compile_threads() -> int:
    """Threads that compile strict mode's first calls ahead of their run
    (TORCH_TPU_COMPILE_THREADS; default the CPU count less one, at most 8; 0: each first
    call compiles before it runs)."""
    default = min(8, max(1, (os.cpu_count() or 2) - 1))
    return integer("TORCH_TPU_COMPILE_THREADS", default, 0)


VARIABLES: dict[str, Callable[[], object]] = {
    "TORCH_TPU_EAGER_MODE": _eager_mode,
    "TORCH_TPU_LAUNCH_BLOCKING": lambda: flag("TORCH_TPU_LAUNCH_BLOCKING"),
    "TORCH_TPU_DEFER_AND_FUSE": lambda: flag("TORCH_TPU_DEFER_AND_FUSE"),
    "TORCH_TPU_CHECK_NANS": lambda: flag("TORCH_TPU_CHECK_NANS"),
    "TORCH_TPU_PLATFORM": _platform,
    "TORCH_TPU_FUSE_CAP": lambda: integer("TORCH_TPU_FUSE_CAP", 2048, 1),
    "TORCH_TPU_RECOMPILE_WARN_LIMIT": lambda: integer("TORCH_TPU_RECOMPILE_WARN_LIMIT", 8, 1),
    "TORCH_TPU_HOSTED_CALLS": lambda: integer("TORCH_TPU_HOSTED_CALLS", 2, 0),
    "TORCH_TPU_COMPILE_THREADS": compile_threads,
    "TORCH_TPU_CACHE_MAX_BYTES": lambda: integer("TORCH_TPU_CACHE_MAX_BYTES", 4 << 30, 0),
    "TORCH_TPU_PERSISTENT_CACHE": lambda: flag("TORCH_TPU_PERSISTENT_CACHE", True),
    "TORCH_TPU_CACHE_DIR": _path("TORCH_TPU_CACHE_DIR"),
    "TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT": _path("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"),
    "TORCH_TPU_CACHE_KEY_FILE": _path("TORCH_TPU_CACHE_KEY_FILE"),
    "TORCH_TPU_CHECK_DEVICE": _one_of("TORCH_TPU_CHECK_DEVICE", ("cpu", "tpu")),
}


def problem(name: str) -> str | None:
    """What is wrong with the variable's value (None: nothing, or not set)."""
    check = VARIABLES.get(name)
    if check is None:
        known = ", ".join(sorted(VARIABLES))
        return f"{name} is not a variable torch_tpu reads (misspelt?); known: {known}"
    if name not in os.environ:
        return None
    try:
        check()
    except (ValueError, RuntimeError) as e:
        return str(e)
    return None


def check_all() -> None:
    """Raise the first bad value's error (at device start)."""
    for name, check in VARIABLES.items():
        if name in os.environ:
            check()
