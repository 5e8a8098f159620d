"""Exchange with JAX: the jax.Array behind a tpu tensor, a jax.Array as a tpu tensor, DLPack.

A tpu storage holds one immutable jax.Array: of the tensor's shape when it was
made for a contiguous tensor, else flat. Aliasing rules:

- `to_jax(t)` of a contiguous tensor that is its whole storage, with the
  storage array's shape, returns that very array (no copy, no dispatch;
  pending fused work runs first).
  Any other tensor costs one on-device copy: a reshape (JAX has no zero-copy
  reshape) or a strided read for views. No host transfer either way.
- A later in-place torch op on `t` replaces the storage's array: the array
  handed out keeps the old value (it is referenced by the caller, so it is
  never donated).
- `from_jax(a)` wraps `a` itself (no copy) as a new contiguous tpu tensor; `a`
  keeps its value whatever torch does to the tensor. Donating a wrapped `a` to
  a jitted JAX function deletes it under the tensor too: later uses then raise
  JAX's "Array has been deleted".
- `t.__dlpack__()` exports a private on-device copy: a DLPack consumer may
  write into what it receives (torch.from_dlpack ignores the read-only flag),
  and tpu arrays are shared and immutable. Zero-copy sharing is `to_jax`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .. import dtypes
from ..engine import executor
from ..tensor import is_whole, new_tensor, storage_of


def to_jax(t: torch.Tensor) -> jax.Array:
    """The value of tpu tensor t as a jax.Array of its shape and dtype (see module doc)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"to_jax expects a torch.Tensor, got {type(t).__name__}")
    if t.device.type != executor.DEVICE_TYPE:
        raise RuntimeError(
            f"to_jax expects a tpu tensor, got a {t.device.type} tensor; move it with .to('tpu')"
        )
    t = t.detach()
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    storage = storage_of(t)
    if is_whole(t, storage):
        array = storage.array("to_jax")
        return array if array.shape == t.shape else array.reshape(tuple(t.shape))
    return executor.device_value(t, "to_jax")


def from_jax(a: jax.Array) -> torch.Tensor:
    """A tpu tensor holding jax.Array a (see module doc for when that is a copy)."""
    from .. import platform

    if not isinstance(a, jax.Array):
        raise TypeError(f"from_jax expects a jax.Array, got {type(a).__name__}")
    if isinstance(a, jax.core.Tracer):
        raise TypeError("from_jax got a tracer: call it outside jax.jit/vmap/grad")
    if a.dtype not in dtypes.JAX_TO_TORCH:
        raise TypeError(f"from_jax: tpu tensors have no dtype for {a.dtype}")
    device = platform.device()
    if a.devices() != {device}:
        a = jax.device_put(a, device)
    return new_tensor(tuple(a.shape), dtypes.to_torch(a.dtype), a)


# ------------------------------------------------------------------ DLPack

_original_dlpack = torch.Tensor.__dlpack__
_original_dlpack_device = torch.Tensor.__dlpack_device__


def _dlpack(self, *, stream=-1, max_version=None, dl_device=None, copy=None):
    if self.device.type != executor.DEVICE_TYPE:
        return _original_dlpack(
            self, stream=stream, max_version=max_version, dl_device=dl_device, copy=copy
        )
    if self.requires_grad:  # as PyTorch refuses it for every device
        raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
    if copy is False:
        raise BufferError(
            "tpu tensors export a private copy through DLPack (their arrays are shared and "
            "immutable); for zero-copy sharing with JAX use torch_tpu.to_jax"
        )
    private = jnp.array(to_jax(self), copy=True)
    kwargs = {} if max_version is None else {"max_version": max_version}
    if stream not in (None, -1):
        kwargs["stream"] = stream
    return private.__dlpack__(**kwargs)


def _dlpack_device(self):
    if self.device.type != executor.DEVICE_TYPE:
        return _original_dlpack_device(self)
    from .. import platform

    return jnp.zeros((0,), jnp.float32, device=platform.device()).__dlpack_device__()


def install_dlpack() -> None:
    """tpu tensors' `__dlpack__`/`__dlpack_device__` (other devices keep PyTorch's): PyTorch
    would pack our never-dereferenced storage address. Installed at device start."""
    torch.Tensor.__dlpack__ = _dlpack
    torch.Tensor.__dlpack_device__ = _dlpack_device
