"""The `torch.tpu` module: device queries, synchronisation, seeds, memory, streams.

Public names follow torch.cuda and TorchTPU. `torch.tpu.enable_cpu_fallback`
is a settable module property.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass

import torch

from . import memory, platform, rng, streams
from .compile import options as compiler  # noqa: F401  (torch.tpu.compiler.custom_compiler_options)
from .engine import fallback, modes
from .engine.modes import EagerMode, set_eager_mode  # noqa: F401  (public names)
from .streams import (  # noqa: F401  (public names)
    Event,
    Stream,
    current_stream,
    default_stream,
    set_stream,
    stream,
)

_current_device = 0


def is_available() -> bool:
    try:
        return bool(platform.devices())
    except RuntimeError:
        return False


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """Called by PyTorch before it touches the device; nothing is lazy here."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """Addressable tpu devices. PyTorch 2.13's Python PrivateUse1 path pins every
    tensor to index 0 (torch._C._acc.create_empty_tensor), so this is 1."""
    return 1


def current_device() -> int:
    return _current_device


def _index(device) -> int:
    if isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != "tpu":
            raise ValueError(f"expected a tpu device, got {device}")
        index = 0 if device.index is None else device.index
    if not 0 <= index < device_count():
        raise RuntimeError(
            f"tpu:{index} is not available: this process has {device_count()} tpu device(s)"
        )
    return index


def set_device(device) -> None:
    global _current_device
    _current_device = _index(device)


class device:
    """Context manager that makes the given tpu device current."""

    def __init__(self, device) -> None:
        self.index = _index(device) if device is not None else None
        self.previous = None

    def __enter__(self):
        global _current_device
        self.previous = _current_device
        if self.index is not None:
            _current_device = self.index
        return self

    def __exit__(self, *exc) -> None:
        global _current_device
        _current_device = self.previous


def synchronize(device=None) -> None:
    """Run what fused mode has recorded, then wait until every value dispatched to
    the device has been computed."""
    _index(device if device is not None else _current_device)
    streams.synchronize()


def get_device_name(device=None) -> str:
    d = platform.device(_index(device if device is not None else _current_device))
    return f"{d.platform.upper()} ({d.device_kind}) via XLA"


@dataclass(frozen=True)
class _DeviceProperties:
    name: str
    platform: str
    device_kind: str
    total_memory: int


def get_device_properties(device=None) -> _DeviceProperties:
    d = platform.device(_index(device if device is not None else _current_device))
    stats = _pjrt_stats(d)
    return _DeviceProperties(
        name=get_device_name(device),
        platform=d.platform,
        device_kind=d.device_kind,
        total_memory=int(stats.get("bytes_limit", 0)) if stats else 0,
    )


def get_device_capability(device=None) -> tuple[int, int]:
    return (0, 0)


def _pjrt_stats(d) -> dict | None:
    try:
        return d.memory_stats()
    except Exception:  # PJRT:CPU raises or returns None: it keeps no allocator stats
        return None


def memory_stats(device=None) -> dict:
    """Device memory statistics, named as torch.cuda's (see torch_tpu.memory)."""
    _index(device if device is not None else _current_device)
    return memory.stats()


def memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    memory.reset_peak()


def empty_cache() -> None:
    memory.release()


def mem_get_info(device=None) -> tuple[int, int]:
    return memory.info()


# ------------------------------------------------------------------ random


def manual_seed(seed: int) -> None:
    rng.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    rng.manual_seed(seed)


def seed() -> int:
    return rng.seed()


def seed_all() -> int:
    return rng.seed()


def initial_seed() -> int:
    return rng.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return rng.get_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    rng.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [rng.get_state()]


def set_rng_state_all(new_states) -> None:
    rng.set_state(new_states[0])


class _TpuModule(types.ModuleType):
    """Module type giving torch.tpu its settable properties."""

    @property
    def enable_cpu_fallback(self) -> bool:
        return fallback.enabled

    @enable_cpu_fallback.setter
    def enable_cpu_fallback(self, value: bool) -> None:
        fallback.enabled = bool(value)

    @property
    def eager_mode(self) -> EagerMode:
        return modes.current

    @eager_mode.setter
    def eager_mode(self, mode: EagerMode) -> None:
        modes.set_mode(mode)

    @property
    def check_nans(self) -> bool:
        """Debug mode raises at the first op whose output holds NaN or Inf."""
        return modes.check_nans

    @check_nans.setter
    def check_nans(self, value: bool) -> None:
        modes.check_nans = bool(value)


sys.modules[__name__].__class__ = _TpuModule


# ---------------------------------------------------------- mixed precision

from .amp import get_amp_supported_dtype, is_bf16_supported  # noqa: E402, F401
