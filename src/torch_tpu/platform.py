"""Which XLA platform backs the tpu device: the TPU if JAX sees one, else a GPU, else XLA:CPU.

JAX is imported here only inside functions: `import torch` autoloads this
package and must stay cheap. JAX's backend is started lazily, on the first
use of a device, not when torch_tpu is imported: `jax.distributed.initialize`
(run by `dist.init_process_group("tpu_dist")`) must come before it.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import jax
    import numpy as np

_ALIASES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}
_UNSET_HINT = "unset TORCH_TPU_PLATFORM to use the best platform present (TPU, else GPU, else CPU)"


class PlatformUnavailableError(RuntimeError):
    """TORCH_TPU_PLATFORM is misspelt, or names a platform JAX cannot reach on this machine."""


def forced() -> str | None:
    """The platform TORCH_TPU_PLATFORM names (spelling checked), or None."""
    raw = os.environ.get("TORCH_TPU_PLATFORM", "")
    name = raw.strip().lower()
    if not name:
        return None
    if name not in _ALIASES:
        raise PlatformUnavailableError(
            f"TORCH_TPU_PLATFORM={raw!r} is not a platform; valid values (any case): "
            f"{', '.join(_ALIASES)}. Fix the value or {_UNSET_HINT}"
        )
    return _ALIASES[name]


@functools.cache
def platform() -> str:
    """The XLA platform name ('tpu', 'gpu' or 'cpu'), chosen once per process (starts
    JAX's backend)."""
    import jax

    name = forced()
    _restrict_to_local_device(name)
    if name:
        try:
            jax.devices(name)
        except RuntimeError as e:
            raise PlatformUnavailableError(
                f"TORCH_TPU_PLATFORM={os.environ['TORCH_TPU_PLATFORM']} but JAX finds no "
                f"{name} device on this machine ({e}); {_UNSET_HINT}, or set it to cpu"
            ) from None
        return name
    for name in ("tpu", "gpu"):
        try:
            if jax.devices(name):
                return name
        except RuntimeError:
            continue
    return "cpu"


_restricted = False


def _restrict_to_local_device(name: str | None) -> None:
    """Before the backend starts: on a host shared by several ranks (torchrun's
    LOCAL_WORLD_SIZE > 1), open only this rank's accelerator (`local_device.py`)."""
    global _restricted
    if _restricted or backend_started():
        return
    import jax

    from . import local_device

    settings = local_device.visibility(name, os.environ)
    os.environ.update(settings.env)
    for option, value in settings.jax_config.items():
        jax.config.update(option, value)
    _restricted = True


def available() -> bool:
    """Whether the tpu device can run here. XLA:CPU always can, so only a forced GPU or TPU
    platform is probed (which starts JAX's backend); a misspelt one is not available.
    Remembered per TORCH_TPU_PLATFORM value: every upload and stream query asks."""
    return _available(os.environ.get("TORCH_TPU_PLATFORM", ""))


@functools.lru_cache(maxsize=8)
def _available(raw: str) -> bool:
    try:
        name = forced()
        if name in (None, "cpu"):
            return True
        platform()
    except PlatformUnavailableError:
        return False
    return True


def backend_started() -> bool:
    """Whether JAX's backend is up (after which jax.distributed cannot initialise)."""
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


@functools.cache
def devices() -> tuple[jax.Device, ...]:
    """This process's devices of the platform (starts JAX's backend). Local ones: in a
    multi-process job jax.devices() also lists the other processes' devices."""
    import jax

    return tuple(jax.local_devices(backend=platform()))


@functools.cache
def _own() -> jax.Device:
    """The device this process computes on: its LOCAL_RANK's when it sees several."""
    import jax

    from . import local_device

    found = devices()
    chosen = found[local_device.index(os.environ, len(found))]
    jax.config.update("jax_default_device", chosen)
    return chosen


def restart() -> None:
    """Forget the started backend's devices (after jax.extend.backend.clear_backends)."""
    import jax

    platform.cache_clear()
    _available.cache_clear()
    devices.cache_clear()
    _own.cache_clear()
    _placement.cache_clear()
    jax.config.update("jax_default_device", forced())


def device(index: int = 0) -> jax.Device:
    """The JAX device behind tpu:index. Every tpu tensor is on tpu:0 (one device per
    process, see docs/architecture.md), which is this process's own device."""
    if index != 0:
        raise RuntimeError(f"tpu:{index}: torch_tpu has one device per process (tpu:0)")
    return _own()


def put(host: np.ndarray, committed: bool = True) -> jax.Array:
    """host on this process's device, through JAX's C++ transfer: jax.device_put's
    Python costs about 95 µs for a small array here, this 9 µs. The caller owns `host`
    (XLA:CPU may wrap its memory rather than copy it). committed=False gives what a
    program without committed inputs returns (jitted functions key on it)."""
    from jax._src.lib import xla_client

    target = device()
    try:
        return xla_client.batched_device_put(
            _aval(host.shape, host.dtype), _placement(target), [host], [target], committed
        )
    except Exception as error:  # (JAX's error type: jax is imported lazily here)
        from . import memory_errors

        memory_errors.raise_if_out_of_memory(error)
        raise


@functools.lru_cache(maxsize=1024)
def _aval(shape: tuple[int, ...], dtype: np.dtype):
    from jax._src import core

    return core.ShapedArray(shape, dtype)


@functools.cache
def _placement(target: jax.Device) -> jax.sharding.Sharding:
    import jax

    return jax.sharding.SingleDeviceSharding(target)
