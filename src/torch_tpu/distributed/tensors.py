"""tpu tensors as the flat local blocks the collectives work on, and back."""

from __future__ import annotations

import jax
import torch

from ..engine import executor
from ..tensor import is_whole, new_tensor, storage_of
from .work import settle


def check_device(t: torch.Tensor) -> None:
    """A tensor a tpu_dist group cannot serve gets PyTorch's error for a group with no
    backend for its device."""
    if t.device.type != executor.DEVICE_TYPE:
        raise RuntimeError(f"No backend type associated with device type {t.device.type}")


def describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}"


def flat_value(t: torch.Tensor) -> jax.Array:
    """The tensor's elements as a flat array (its storage array, reshaped, when the
    tensor is the whole contiguous storage: no strided read)."""
    check_device(t)
    settle(t)  # an unfinished collective writing t comes first
    storage = storage_of(t)
    if is_whole(t, storage):
        return storage.array("collective").reshape(-1)
    return executor.device_value(t, "collective").reshape(-1)


def write(t: torch.Tensor, flat: jax.Array) -> None:
    """Give t the values of `flat` in place (bumping its autograd version)."""
    settle(t)
    storage = storage_of(t)
    if is_whole(t, storage):
        storage.value = flat.reshape(storage.shape)  # (programs are keyed by it)
        torch.autograd.graph.increment_version(t)
    else:
        with torch.no_grad():
            t.copy_(new_tensor(tuple(t.shape), t.dtype, flat))

