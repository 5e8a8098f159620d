"""`tpu_dist`: the c10d backend of the tpu device, on XLA collectives.

`dist.init_process_group(backend="tpu_dist")` (under torchrun, or with an
explicit init_method/store, rank and world_size) makes each process one JAX
controller of its device (`runtime.py`); collectives are XLA programs over a
mesh of the group's devices (`programs.py`, `mesh.py`), driven by a c10d
process group (`process_group.py`) whose Work objects wait within the group's
timeout (`work.py`). The functional collectives DTensor and FSDP2 use have
tpu kernels (`functional.py`); compiled graphs run those kernels between
their compiled segments (`compile/split.py`).

JAX's backend must start after jax.distributed. When tpu tensors already
exist at `init_process_group` (a sanity batch on one device first), their
values are held on the host across a restart of the backend and uploaded onto
the distributed one (`relocate.py`), so they stay valid.
"""

from __future__ import annotations

import torch.distributed as dist

from .process_group import TpuProcessGroup, create
from .work import CollectiveError, CollectiveTimeout, TpuWork

__all__ = ["CollectiveError", "CollectiveTimeout", "TpuProcessGroup", "TpuWork", "register"]

_registered = False


def register() -> None:
    """Make `tpu_dist` a c10d backend for tpu tensors, and install the functional
    collectives' tpu kernels (once; called by torch_tpu.init)."""
    global _registered
    if _registered or not dist.is_available():
        return
    from . import functional

    dist.Backend.register_backend("tpu_dist", create, extended_api=True, devices=["tpu"])
    functional.register()
    _registered = True
