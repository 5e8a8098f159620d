"""torch.load onto tpu, and copies of tpu storages (deepcopy).

PyTorch's generic deserializer for a PrivateUse1 location allocates a storage
through a C++ allocator the Python backend does not have. We register our own
(torch.serialization.register_package, ahead of the generic one) that builds
the storage from a tpu tensor of the saved bytes, so the tensors rebuilt on
it read their values from its payload.
"""

from __future__ import annotations

import torch


def _tag(obj) -> str | None:
    if obj.device.type == "tpu":
        return "tpu:0"
    return None


def _restore(obj, location: str):
    if not location.startswith("tpu"):
        return None
    from . import api

    api._index(torch.device(location))  # a clear error for a device this process lacks
    if obj.device.type == "tpu":
        return obj
    host = torch.empty((0,), dtype=torch.uint8, device="cpu").set_(obj)
    return host.to("tpu").untyped_storage()


_original_clone = torch.UntypedStorage.clone


def _clone(self: torch.UntypedStorage) -> torch.UntypedStorage:
    """UntypedStorage.clone (used by copy.deepcopy of a tensor): PyTorch's allocates
    through the C++ allocator the Python backend lacks (a crash for tpu)."""
    if self.device.type != "tpu":
        return _original_clone(self)
    from .tensor import clone_storage

    return clone_storage(self)


def install() -> None:
    torch.serialization.register_package(15, _tag, _restore)
    torch.UntypedStorage.clone = _clone
