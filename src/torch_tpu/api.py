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

import sys
import types
from dataclasses import dataclass

import torch

from . import memory, rng, streams
from . import platform as _platform
from .amp import get_amp_supported_dtype, is_bf16_supported
from .engine import modes as _modes
from .engine.modes import EagerMode, set_eager_mode
from .streams import Event, Stream, current_stream, default_stream, set_stream, stream

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
    "reset_max_memory_allocated",
    "memory_summary",
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
    "memory_reserved",
    "max_memory_reserved",
    "mem_get_info",
    "set_stream",
    "get_amp_supported_dtype",
    "is_bf16_supported",
    "to_jax",
    "from_jax",
    "OutOfMemoryError",
]  # and _TpuModule's properties: eager_mode, enable_cpu_fallback, check_nans, compiler,
#  pallas, ops

# what an allocation on tpu that does not fit raises (memory_errors.py): the class
# torch.cuda.OutOfMemoryError also is, so handlers written for either catch it
OutOfMemoryError = torch.OutOfMemoryError

_current_device = 0


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
    _index(device if device is not None else _current_device)
    streams.synchronize()


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


def reset_max_memory_allocated(device=None) -> None:
    """torch.cuda's older name for resetting the peak (training scripts still call it)."""
    memory.reset_peak()


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A printable table of `memory_stats`, where training scripts log torch.cuda's
    (`abbreviated` is taken for torch.cuda's signature: the table is short either way)."""
    stats = memory_stats(device)
    rows = [("allocated", "allocated_bytes.all"), ("reserved", "reserved_bytes.all")]
    lines = [f"tpu:{_index(device if device is not None else _current_device)} memory summary",
             f"{'':12}{'current':>14}{'peak':>14}"]  # fmt: skip
    for label, key in rows:
        current, peak = stats[f"{key}.current"], stats[f"{key}.peak"]
        lines.append(f"{label:12}{_mib(current):>14}{_mib(peak):>14}")
    return "\n".join(lines) + "\n"


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


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


# ------------------------------------------------------------------ JAX interop


def to_jax(t: torch.Tensor):
    """The jax.Array behind tpu tensor t (no copy for a 1-D whole storage; docs/kernels.md)."""
    _lazy_init()
    from .interop import exchange

    return exchange.to_jax(t)


def from_jax(a) -> torch.Tensor:
    """jax.Array a as a tpu tensor (no copy for a 1-D array; docs/kernels.md)."""
    _lazy_init()
    from .interop import exchange

    return exchange.from_jax(a)


class _TpuModule(types.ModuleType):
    """Module type giving torch.tpu its settable properties, its lazily imported
    `compiler` namespace, and a dir() that lists the public API."""

    @property
    def _initialized(self) -> bool:
        """torch.cuda's flag, read by PyTorch itself: activation checkpointing stashes a
        device's RNG state only when it is set, so without it a recomputed dropout drew
        a new mask and the gradients silently differed from the forward's."""
        return is_initialized()

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

    @property
    def pallas(self) -> types.ModuleType:
        """`torch.tpu.pallas.jax_op`: JAX/Pallas kernels as custom ops (imports JAX)."""
        _lazy_init()
        from .interop import pallas

        return pallas

    @property
    def ops(self) -> types.ModuleType:
        """`torch.tpu.ops`: ragged_dot, optimization_barrier, attention (imports JAX)."""
        _lazy_init()
        from .interop import ops

        return ops

    def __dir__(self) -> list[str]:
        properties = [
            name
            for name, v in vars(_TpuModule).items()
            if isinstance(v, property) and not name.startswith("_")
        ]
        return sorted([*__all__, *properties])


sys.modules[__name__].__class__ = _TpuModule
