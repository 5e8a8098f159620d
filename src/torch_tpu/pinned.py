"""Pinned host memory and asynchronous copies for the tpu device.

Once torch_tpu is registered, `tpu` is PyTorch's current accelerator, so every
`Tensor.pin_memory()`, `DataLoader(pin_memory=True)` and
`tpu_tensor.to("cpu", non_blocking=True)` of the process asks the accelerator
for a pinned-memory allocator, which a Python backend cannot provide
(`torch._C._acc.PrivateUse1Hooks` exposes no `getPinnedMemoryAllocator`).
Those calls would raise even in programs that never touch the device. This
module gives them kernels of their own instead: CPU kernels for `is_pinned`
and `_pin_memory` (through which `Tensor.pin_memory()` runs) and a tpu kernel
for `_to_copy` (whose non-blocking copy to the host allocates pinned memory).

What "pinned" means here: a host storage that torch_tpu allocated as a
transfer buffer and flagged as such. Its bytes are ordinary host memory
(XLA:CPU has no DMA engine to lock pages for, and on real accelerators JAX
stages host transfers itself), and copies from it take the same path as from
any host tensor: the upload first copies the bytes into a private buffer, so a
pinned staging buffer can be refilled as soon as `copy_` returns and the
device keeps the values it was given. Handing a pinned buffer to XLA without
that copy was rejected: XLA:CPU may alias the buffer, and the usual pattern of
refilling one pinned staging tensor every step would then rewrite values
already on the device. `non_blocking=True` is accepted in both directions and
the result is always right when read: to the device the copy is dispatched
asynchronously after the private host copy; to the host it completes before
returning (into pinned memory, as on CUDA).

Nothing here imports JAX: registering costs a few dispatcher entries.
"""

from __future__ import annotations

import warnings

import torch

_FLAG = "_tpu_pinned"  # attribute set on the Python object of a pinned host storage
_lib: torch.library.Library | None = None
_original: dict[str, torch._C._SafeKernelFunction] = {}


def _is_tpu(device, method: str) -> bool:
    """Whether the call is for tpu (no device given, or tpu); PyTorch's kernel serves the rest."""
    if device is None:
        return True
    if torch.device(device).type != "tpu":
        return False
    warnings.warn(  # as PyTorch's own kernel does
        f"The argument 'device' of Tensor.{method}() is deprecated. Please do not pass "
        "this argument.",
        DeprecationWarning,
        stacklevel=3,
    )
    return True


def is_pinned(self: torch.Tensor, device=None) -> bool:
    """CPU kernel of aten::is_pinned: whether the tensor's storage is a pinned buffer."""
    if not _is_tpu(device, "is_pinned"):
        return _original["is_pinned"].call_boxed(_CPU, self, device)
    return bool(getattr(self.untyped_storage(), _FLAG, False))


def pin(t: torch.Tensor) -> torch.Tensor:
    """Flag t's (host) storage as pinned and return t."""
    setattr(t.untyped_storage(), _FLAG, True)
    return t


def pin_memory(self: torch.Tensor, device=None) -> torch.Tensor:
    """CPU kernel of aten::_pin_memory: a pinned copy with the same sizes and strides."""
    if not _is_tpu(device, "pin_memory"):
        return _original["_pin_memory"].call_boxed(_CPU, self, device)
    out = torch.empty_strided(self.size(), self.stride(), dtype=self.dtype, device="cpu")
    out.copy_(self)
    return pin(out)


def to_copy(self: torch.Tensor, **kwargs) -> torch.Tensor:
    """tpu kernel of aten::_to_copy: PyTorch's own, except that a copy to pinned host
    memory (non_blocking to the CPU, or pin_memory=True) completes before returning
    into a buffer pinned here rather than by an allocator this backend cannot offer."""
    if type(self) is not torch.Tensor:
        self = _plain_tensor(self)
    device = kwargs.get("device")
    if _plain_upload(self, device, kwargs):
        from .engine import kernels

        return kernels.upload_to(self, device, kwargs.get("dtype"))
    to_host = device is not None and torch.device(device).type == "cpu"
    pinned = to_host and (kwargs.get("non_blocking") or kwargs.get("pin_memory"))
    if pinned:
        kwargs = {**kwargs, "non_blocking": False, "pin_memory": None}
    out = _original["_to_copy"].call_boxed(_PRIVATEUSE1, self, **kwargs)
    return pin(out) if pinned and out.layout == torch.strided else out


def _plain_tensor(t: torch.Tensor) -> torch.Tensor:
    """t as a plain Tensor: a subclass may override what this kernel reads (a lazy
    module's UninitializedParameter raises on `.shape`, so `LazyLinear(4).to("tpu")`
    failed where CPU and CUDA move it)."""
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def _plain_upload(self: torch.Tensor, device, kwargs: dict) -> bool:
    """A contiguous CPU tensor to a contiguous tpu tensor: what `.to("tpu")` does every
    step of a loop. PyTorch's own kernel would allocate an empty tpu tensor and copy
    into it (three Python kernels, 150 µs for a small tensor); this is one upload."""
    return (
        device is not None
        and torch.device(device).type == "tpu"
        and self.device.type == "cpu"
        and self.layout == torch.strided
        and kwargs.get("layout") in (None, torch.strided)
        and not kwargs.get("pin_memory")
        and kwargs.get("memory_format") in (None, torch.preserve_format, torch.contiguous_format)
        and self.is_contiguous()
    )


_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_PRIVATEUSE1 = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
_KERNELS = {
    "is_pinned": ("CPU", is_pinned),
    "_pin_memory": ("CPU", pin_memory),
    "_to_copy": ("PrivateUse1", to_copy),
}


def install() -> None:
    """Register the kernels (once per process; no JAX needed)."""
    global _lib
    if _lib is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    for name, (key, kernel) in _KERNELS.items():
        _original[name] = torch.library.get_kernel(f"aten::{name}", key)
        lib.impl(name, kernel, key)
    _lib = lib
