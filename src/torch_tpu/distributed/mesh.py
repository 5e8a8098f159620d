"""Which JAX device each global rank computes on, and the 1-D meshes of rank groups."""

from __future__ import annotations

import functools

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import platform

AXIS = "ranks"


@functools.cache
def rank_devices() -> tuple[jax.Device, ...]:
    """Per global rank (= JAX process index), the device torch_tpu uses in that process
    (its LOCAL_RANK's on a multi-device host, `local_device.py`), as each rank published
    it in the store when it joined."""
    from . import runtime

    by_id = {d.id: d for d in jax.devices(platform.platform())}
    chosen = tuple(by_id[i] for i in runtime.device_ids(jax.process_count()))
    for rank, d in enumerate(chosen):
        if d.process_index != rank:
            raise RuntimeError(f"tpu_dist: rank {rank}'s device {d} belongs to process "
                               f"{d.process_index}")
    return chosen


@functools.cache
def mesh(ranks: tuple[int, ...]) -> Mesh:
    devices = rank_devices()
    return Mesh(np.array([devices[r] for r in ranks]), (AXIS,))


@functools.cache
def sharding(ranks: tuple[int, ...]) -> NamedSharding:
    """Arrays whose dim 0 is split over the group, one block per rank."""
    return NamedSharding(mesh(ranks), PartitionSpec(AXIS))
