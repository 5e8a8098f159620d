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
    """Per global rank (= JAX process index), the device torch_tpu uses in that process:
    its first local device of the platform."""
    by_process: dict[int, list[jax.Device]] = {}
    for d in jax.devices(platform.platform()):
        by_process.setdefault(d.process_index, []).append(d)
    chosen = tuple(min(by_process[p], key=lambda d: d.id) for p in sorted(by_process))
    from . import runtime

    if chosen[runtime.rank()] != platform.device():
        raise RuntimeError(
            f"tpu_dist: rank {runtime.rank()} computes on {platform.device()} but the mesh "
            f"expects {chosen[runtime.rank()]}"
        )
    return chosen


@functools.cache
def mesh(ranks: tuple[int, ...]) -> Mesh:
    devices = rank_devices()
    return Mesh(np.array([devices[r] for r in ranks]), (AXIS,))


@functools.cache
def sharding(ranks: tuple[int, ...]) -> NamedSharding:
    """Arrays whose dim 0 is split over the group, one block per rank."""
    return NamedSharding(mesh(ranks), PartitionSpec(AXIS))
