"""Which XLA platform backs the tpu device: the TPU if JAX sees one, else a GPU, else XLA:CPU."""

from __future__ import annotations

import functools
import os

import jax

_ALIASES = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu", "tpu": "tpu"}


class PlatformUnavailableError(RuntimeError):
    """TORCH_TPU_PLATFORM names a platform JAX cannot reach on this machine."""


@functools.cache
def platform() -> str:
    """The XLA platform name ('tpu', 'gpu' or 'cpu'), chosen once per process."""
    forced = os.environ.get("TORCH_TPU_PLATFORM", "").strip().lower()
    if forced:
        if forced not in _ALIASES:
            raise PlatformUnavailableError(
                f"TORCH_TPU_PLATFORM={forced!r} is not one of cpu, gpu, tpu"
            )
        name = _ALIASES[forced]
        try:
            jax.devices(name)
        except RuntimeError as e:
            raise PlatformUnavailableError(
                f"TORCH_TPU_PLATFORM={forced} but JAX finds no {name} device here: {e}"
            ) from None
        return name
    for name in ("tpu", "gpu"):
        try:
            if jax.devices(name):
                return name
        except RuntimeError:
            continue
    return "cpu"


@functools.cache
def devices() -> tuple[jax.Device, ...]:
    return tuple(jax.devices(platform()))


def device(index: int = 0) -> jax.Device:
    return devices()[index]
