"""FSDP2 on tpu tensors: freeing and re-allocating unsharded parameter storage.

FSDP2 frees an unsharded parameter between uses with
`untyped_storage().resize_(0)` and re-allocates it with `resize_(nbytes)`.
For a PrivateUse1 storage PyTorch routes that to the C++ hook
`resizePrivateUse1Bytes`, which PyTorch 2.13's Python hooks cannot provide.
On tpu the storage's bytes live in its JAX array, so freeing drops the array
(the storage keeps its size; a read before the next all-gather gives zeros)
and allocating has nothing to do. Other devices keep FSDP2's own functions.
"""

from __future__ import annotations

import torch

from ..tensor import storage_of

_installed = False


def install() -> None:
    global _installed
    if _installed:
        return
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    alloc, free = _fsdp_param.alloc_storage, _fsdp_param.free_storage

    def alloc_storage(tensor: torch.Tensor) -> None:
        if tensor.device.type != "tpu":
            alloc(tensor)

    def free_storage(tensor: torch.Tensor) -> None:
        if tensor.device.type == "tpu":
            storage_of(tensor).value = None
        else:
            free(tensor)

    _fsdp_param.alloc_storage = _fsdp_param_group.alloc_storage = alloc_storage
    _fsdp_param.free_storage = free_storage
    _installed = True
