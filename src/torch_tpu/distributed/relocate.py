"""Keeps tpu tensors made before `init_process_group("tpu_dist")` valid across it.

jax.distributed must initialise before JAX's backend starts, but a program may
well have used the device first (a sanity batch on one device, then the
process group). Then `hold()` copies every live tpu storage to the host, the
backend is restarted with the distributed client, and `restore()` uploads the
copies onto the new backend: the same tensors (and their views, autograd
graphs, optimizer states) keep their values. Compiled executables are bound to
the old backend's devices, so the in-memory compilation caches are emptied.

JAX arrays that are not tpu storages (a user's own) cannot be moved; they would
stop working with the new backend, so their presence is an error.
"""

from __future__ import annotations

import gc

import jax
import numpy as np

from .. import cache, tensor
from ..engine import fuse


class Held:
    """Host copies of the device values of live tpu storages, while the backend restarts."""

    def __init__(self, storages: list, hosts: dict[int, np.ndarray], arrays: dict) -> None:
        self.storages = storages  # (storage, id of its old array)
        self.hosts = hosts  # id of an old array -> its host copy
        self.arrays = arrays  # id of an old array -> the array (kept alive until restore)


def hold() -> Held:
    """Copy every live tpu storage's value to the host (running fused work first)."""
    fuse.flush("init_process_group")
    cache.clear(disk=False)  # executables and cached arrays of the old backend
    gc.collect()
    storages, hosts, arrays = [], {}, {}
    for storage in list(tensor._BY_ADDRESS.values()):
        value = storage.value
        if value is None:
            continue
        value = storage.current()
        arrays[id(value)] = value
        storages.append((storage, id(value)))
    ours = set(arrays)
    foreign = [a for a in jax.live_arrays() if a.size and id(a) not in ours]
    if foreign:
        raise RuntimeError(
            "tpu_dist: JAX's backend was started before dist.init_process_group and "
            f"{len(foreign)} JAX array(s) that are not tpu tensors live on it "
            f"({', '.join(f'{a.dtype}{list(a.shape)}' for a in foreign[:3])}); "
            "jax.distributed must initialise before JAX's backend, and only tpu tensors "
            "can be moved across its restart. Call dist.init_process_group(backend="
            "'tpu_dist') before creating JAX arrays."
        )
    for key, value in arrays.items():
        hosts[key] = np.array(value, copy=True)  # not a view of the old backend's buffer
    return Held(storages, hosts, arrays)


def restore(held: Held, device: jax.Device) -> None:
    """Upload the held values onto `device` of the new backend (one array per old one,
    so storages that shared an array still share one)."""
    uploaded = {key: jax.device_put(host, device) for key, host in held.hosts.items()}
    for storage, key in held.storages:
        storage.value = uploaded[key]
    held.arrays.clear()
    held.hosts.clear()
