"""The three eager modes (TorchTPU's names) and the switches that choose them.

- DEFER_NEVER_AND_LAUNCH_BLOCKING (debug): each op runs and is waited for; a
  failure names the ATen op, its inputs and the user's source line; optional
  NaN/Inf checks.
- DEFER_NEVER (strict, the default): each op is its own cached executable,
  dispatched asynchronously.
- DEFER_AND_FUSE (fused): ops are recorded and run as one XLA computation when
  a value is needed (see engine/fuse.py).

The environment (TORCH_TPU_EAGER_MODE, TORCH_TPU_LAUNCH_BLOCKING,
TORCH_TPU_DEFER_AND_FUSE, TORCH_TPU_CHECK_NANS) is read by `configure()` at the
first use of the device, never at import: this module is imported by every
`import torch`, and a bad value must not break programs that never use tpu.
A value that cannot be parsed is a ValueError naming the variable, the valid
values and the fix: silently running in another mode than the one asked for
would hide exactly what the switch was set to show.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sys


class EagerMode(enum.Enum):
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    DEFER_NEVER = "strict"
    DEFER_AND_FUSE = "fused"


# Read by the executor on every op: plain attributes, set from the environment by configure().
current: EagerMode = EagerMode.DEFER_NEVER
check_nans: bool = False
_configured = False

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _mode_names() -> str:
    return ", ".join(f"{m.value} ({m.name})" for m in EagerMode)


def parse_mode(text: str) -> EagerMode:
    """'fused', 'DEFER_AND_FUSE', 'Strict', ... -> the EagerMode (names and values, any case)."""
    key = text.strip()
    for mode in EagerMode:
        if key.lower() in (mode.value, mode.name.lower()):
            return mode
    raise ValueError(f"{text!r} is not an eager mode; valid (any case): {_mode_names()}")


def env_flag(name: str, default: bool = False) -> bool:
    """A switch variable: 1/true/yes/on or 0/false/no/off; default when unset or empty."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{name}={raw!r} is not a boolean; use one of {', '.join(_TRUE)} to turn it on, "
        f"or {', '.join(v for v in _FALSE if v)} (or unset it) to turn it off"
    )


def env_mode() -> EagerMode:
    raw = os.environ.get("TORCH_TPU_EAGER_MODE", "")
    if raw.strip():
        try:
            return parse_mode(raw)
        except ValueError:
            raise ValueError(
                f"TORCH_TPU_EAGER_MODE={raw!r} is not an eager mode; valid values (any case): "
                f"{_mode_names()}. Fix the value, or unset it for strict (the default)"
            ) from None
    if env_flag("TORCH_TPU_LAUNCH_BLOCKING"):
        return EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    if env_flag("TORCH_TPU_DEFER_AND_FUSE"):
        return EagerMode.DEFER_AND_FUSE
    return EagerMode.DEFER_NEVER


def configure() -> None:
    """Take the starting mode and NaN checks from the environment (once; first device use).
    Raises a clear ValueError for a bad value, and again at the next use until it is fixed."""
    global current, check_nans, _configured
    if _configured:
        return
    mode, nans = env_mode(), env_flag("TORCH_TPU_CHECK_NANS")
    current, check_nans, _configured = mode, nans, True


def set_mode(mode: EagerMode | str) -> None:
    """Switch mode, first running whatever the fused mode has pending."""
    global current
    if isinstance(mode, str):
        mode = parse_mode(mode)
    if not isinstance(mode, EagerMode):
        raise TypeError(f"expected a torch.tpu.EagerMode, got {mode!r}")
    configure()  # an explicit mode wins over the environment, whenever it was read
    fuse = sys.modules.get(f"{__package__}.fuse")
    if fuse is not None:  # not imported yet: nothing can be pending (and no JAX to load)
        fuse.flush("mode switch")
    current = mode


@contextlib.contextmanager
def set_eager_mode(mode: EagerMode | str):
    """Context manager: run the block in `mode`, restore the previous mode after,
    also when the block raises."""
    configure()
    previous = current
    set_mode(mode)
    try:
        yield
    finally:
        set_mode(previous)
