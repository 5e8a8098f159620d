"""The `torch.tpu` module: device queries, synchronisation, seeds, memory, streams.

Public names follow torch.cuda and TorchTPU. `torch.tpu.enable_cpu_fallback`,
`eager_mode` and `check_nans` are settable module properties.

`import torch` imports this module (it is `torch.tpu`), so it must stay cheap:
JAX and the engine are imported inside the functions that use the device,
each of which starts the package first (`_lazy_init`, which PyTorch also calls
before it first puts a tensor on tpu). A new public name goes in `__all__`
(tests/test_startup.py checks that every public function here is listed).
"""

from __future__ import annotations

import contextlib
import sys
import time
import types
from dataclasses import dataclass

import torch

from . import platform as _platform
from . import rng as _rng
from .engine import modes as _modes
from .engine.modes import EagerMode, set_eager_mode

__all__ = [
    "is_available",
    "is_initialized",
    "device_count",
    "current_device",
    "set_device",
    "device",
    "synchronize",
    "get_device_name",
    "get_device_properties",
    "get_device_capability",
    "memory_stats",
    "memory_allocated",
    "max_memory_allocated",
    "reset_peak_memory_stats",
    "empty_cache",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "initial_seed",
    "get_rng_state",
    "set_rng_state",
    "get_rng_state_all",
    "set_rng_state_all",
    "Stream",
    "Event",
    "default_stream",
    "current_stream",
    "stream",
    "EagerMode",
    "set_eager_mode",
]  # and _TpuModule's properties: eager_mode, enable_cpu_fallback, check_nans, compiler

_current_device = 0
_peak_bytes = 0


def is_available() -> bool:
    """XLA:CPU always runs the device; a forced TORCH_TPU_PLATFORM must be present."""
    return _platform.available()


def is_initialized() -> bool:
    """Whether the device has started (JAX loaded, kernels registered): at its first use."""
    return sys.modules[__package__]._initialised


def _lazy_init() -> None:
    """Start the device: PyTorch calls this before it first puts a tensor on tpu, the
    boxed fallback before the first tpu op, and every function here that needs the device.
    A bad TORCH_TPU_* value or a forced platform that is absent raises here, clearly."""
    sys.modules[__package__].init()
    if not _platform.available():  # probes a forced GPU/TPU only (XLA:CPU is always there)
        _platform.platform()  # raises PlatformUnavailableError, naming TORCH_TPU_PLATFORM


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """Addressable tpu devices. PyTorch 2.13's Python PrivateUse1 path pins every
    tensor to index 0 (torch._C._acc.create_empty_tensor), so this is 1; 0 when
    TORCH_TPU_PLATFORM forces a platform this machine lacks."""
    return 1 if is_available() else 0


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
    _lazy_init()
    import jax

    from .engine import fuse

    fuse.flush("synchronize()")
    for array in jax.live_arrays(_platform.platform()):
        array.block_until_ready()


def get_device_name(device=None) -> str:
    _lazy_init()
    d = _platform.device(_index(device if device is not None else _current_device))
    return f"{d.platform.upper()} ({d.device_kind}) via XLA"


@dataclass(frozen=True)
class _DeviceProperties:
    name: str
    platform: str
    device_kind: str
    total_memory: int


def get_device_properties(device=None) -> _DeviceProperties:
    _lazy_init()
    d = _platform.device(_index(device if device is not None else _current_device))
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
    """PJRT's allocator statistics where the platform reports them; otherwise the
    bytes held by live arrays, which is what allocated memory means for XLA:CPU."""
    global _peak_bytes
    _lazy_init()
    import jax

    d = _platform.device(0)
    stats = _pjrt_stats(d)
    if stats:
        current = int(stats.get("bytes_in_use", 0))
        peak = int(stats.get("peak_bytes_in_use", current))
    else:
        current = sum(a.nbytes for a in jax.live_arrays(_platform.platform()))
        _peak_bytes = max(_peak_bytes, current)
        peak = _peak_bytes
        stats = {}
    return {
        "allocated_bytes.all.current": current,
        "allocated_bytes.all.peak": peak,
        **{f"pjrt.{k}": v for k, v in stats.items()},
    }


def memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    global _peak_bytes
    _peak_bytes = 0


def empty_cache() -> None:
    """XLA frees buffers when their arrays die; nothing is cached to release."""


# ------------------------------------------------------------------ random


def manual_seed(seed: int) -> None:
    _rng.manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    _rng.manual_seed(seed)


def seed() -> int:
    return _rng.seed()


def seed_all() -> int:
    return _rng.seed()


def initial_seed() -> int:
    return _rng.initial_seed()


def get_rng_state(device=None) -> torch.Tensor:
    return _rng.get_state()


def set_rng_state(new_state: torch.Tensor, device=None) -> None:
    _rng.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [_rng.get_state()]


def set_rng_state_all(new_states) -> None:
    _rng.set_state(new_states[0])


# ----------------------------------------------------------------- streams


class Stream:
    """An XLA device has one in-order queue per executable stream; tpu streams all map
    onto it, so waiting on one is waiting on the device."""

    def __init__(self, device=None, priority: int = 0) -> None:
        self.device = torch.device("tpu", _index(device if device is not None else 0))
        self.priority = priority

    def synchronize(self) -> None:
        synchronize()

    def query(self) -> bool:
        _lazy_init()
        import jax

        return all(a.is_ready() for a in jax.live_arrays(_platform.platform()))

    def wait_event(self, event: Event) -> None:
        event.synchronize()

    def wait_stream(self, stream: Stream) -> None:
        stream.synchronize()

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


class Event:
    """Records a point in the device's work; elapsed_time measures between two."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        synchronize()
        self._time = time.perf_counter()

    def query(self) -> bool:
        return self._time is not None

    def synchronize(self) -> None:
        synchronize()

    def wait(self, stream: Stream | None = None) -> None:
        synchronize()

    def elapsed_time(self, end: Event) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Events must be created with enable_timing=True")
        if self._time is None or end._time is None:
            raise RuntimeError("both events must be recorded before elapsed_time")
        return (end._time - self._time) * 1000.0


_default_stream = None


def default_stream(device=None) -> Stream:
    global _default_stream
    if _default_stream is None:
        _default_stream = Stream()
    return _default_stream


def current_stream(device=None) -> Stream:
    return default_stream(device)


@contextlib.contextmanager
def stream(s: Stream | None):
    yield s


class _TpuModule(types.ModuleType):
    """Module type giving torch.tpu its settable properties, its lazily imported
    `compiler` namespace, and a dir() that lists the public API."""

    @property
    def enable_cpu_fallback(self) -> bool:
        from .engine import fallback

        return fallback.enabled

    @enable_cpu_fallback.setter
    def enable_cpu_fallback(self, value: bool) -> None:
        from .engine import fallback

        fallback.enabled = bool(value)

    @property
    def eager_mode(self) -> EagerMode:
        _modes.configure()
        return _modes.current

    @eager_mode.setter
    def eager_mode(self, mode: EagerMode) -> None:
        _modes.set_mode(mode)

    @property
    def check_nans(self) -> bool:
        """Debug mode raises at the first op whose output holds NaN or Inf."""
        _modes.configure()
        return _modes.check_nans

    @check_nans.setter
    def check_nans(self, value: bool) -> None:
        _modes.configure()
        _modes.check_nans = bool(value)

    @property
    def compiler(self) -> types.ModuleType:
        """`torch.tpu.compiler.custom_compiler_options` (imports JAX: only when asked for)."""
        _lazy_init()
        from .compile import options

        return options

    def __dir__(self) -> list[str]:
        properties = [name for name, v in vars(_TpuModule).items() if isinstance(v, property)]
        return sorted([*__all__, *properties])


sys.modules[__name__].__class__ = _TpuModule
