"""torch.load onto tpu.

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
    host = torch.empty((0,), dtype=torch.uint8).set_(obj)
    return host.to("tpu").untyped_storage()


def install() -> None:
    torch.serialization.register_package(15, _tag, _restore)
