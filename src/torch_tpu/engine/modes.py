"""The three eager modes (TorchTPU's names) and the switches that choose them.

- DEFER_NEVER_AND_LAUNCH_BLOCKING (debug): each op runs and is waited for; a
  failure names the ATen op, its inputs and the user's source line; optional
  NaN/Inf checks.
- DEFER_NEVER (strict, the default): each op is its own cached executable,
  dispatched asynchronously.
- DEFER_AND_FUSE (fused): ops are recorded and run as one XLA computation when
  a value is needed (see engine/fuse.py).
"""

from __future__ import annotations

import contextlib
import enum
import os


class EagerMode(enum.Enum):
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    DEFER_NEVER = "strict"
    DEFER_AND_FUSE = "fused"


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _initial_mode() -> EagerMode:
    named = os.environ.get("TORCH_TPU_EAGER_MODE", "").strip().lower()
    if named:
        try:
            return EagerMode(named)
        except ValueError:
            raise ValueError(
                f"TORCH_TPU_EAGER_MODE={named!r} is not one of debug, strict, fused"
            ) from None
    if _truthy("TORCH_TPU_LAUNCH_BLOCKING"):
        return EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    if _truthy("TORCH_TPU_DEFER_AND_FUSE"):
        return EagerMode.DEFER_AND_FUSE
    return EagerMode.DEFER_NEVER


current: EagerMode = _initial_mode()
check_nans: bool = _truthy("TORCH_TPU_CHECK_NANS")


def set_mode(mode: EagerMode | str) -> None:
    """Switch mode, first running whatever the fused mode has pending."""
    global current
    if isinstance(mode, str):
        mode = EagerMode[mode] if mode in EagerMode.__members__ else EagerMode(mode)
    if not isinstance(mode, EagerMode):
        raise TypeError(f"expected a torch.tpu.EagerMode, got {mode!r}")
    from . import fuse

    fuse.flush("mode switch")
    current = mode


@contextlib.contextmanager
def set_eager_mode(mode: EagerMode | str):
    """Context manager: run the block in `mode`, restore the previous mode after,
    also when the block raises."""
    previous = current
    set_mode(mode)
    try:
        yield
    finally:
        set_mode(previous)
