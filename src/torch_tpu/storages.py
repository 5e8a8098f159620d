"""Storage constructors on tpu: `torch.UntypedStorage(n, device="tpu")`, from a list of
bytes, and the `TypedStorage` constructors built on them.

PyTorch's constructor allocates through the device's C++ allocator, which a backend
written in Python cannot register: on tpu it crashed the process (a segfault). A
tpu storage is made here the way a tpu tensor's is (`tensor.py`), and a list of
bytes is first checked by PyTorch's own CPU constructor, so it refuses what CPU
refuses. Every other device goes to PyTorch's constructor unchanged.
"""

from __future__ import annotations

import torch

_pytorch_new = torch._C.StorageBase.__new__


def install() -> None:
    torch.UntypedStorage.__new__ = _new


def _new(cls, *args, **kwargs):
    device = kwargs.get("device")
    if device is None or torch.device(device).type != "tpu":
        return _pytorch_new(cls, *args, **kwargs)
    if kwargs.get("allocator") is not None:
        raise RuntimeError("a tpu storage cannot take an allocator: tpu allocates its own")
    size_or_bytes = args[0] if args else 0
    if isinstance(size_or_bytes, int) and len(args) == 1:
        if size_or_bytes < 0:
            raise RuntimeError(f"Storage size must be non-negative, got {size_or_bytes}")
        made = torch.empty(size_or_bytes, dtype=torch.uint8, device=device)
    else:  # (the sequence form, and anything CPU's constructor must judge)
        on_cpu = _pytorch_new(cls, *args)
        made = torch.empty(0, dtype=torch.uint8, device="cpu").set_(on_cpu).to(device)
    return made.untyped_storage()
