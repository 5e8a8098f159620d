"""Device memory statistics for torch.tpu and torch.accelerator.

Allocated memory is the device buffers of live JAX arrays: tensor storages,
plus what torch_tpu caches on the device (shared zero arrays). Where PJRT
keeps allocator statistics (TPU, GPU) its `bytes_in_use` and
`peak_bytes_in_use` are reported. XLA:CPU keeps none, so there the bytes are
summed over `jax.live_arrays()` and the peak is the highest value measured:
at every query, at `synchronize()`, and at `reset_peak_memory_stats()`. A
buffer that lived and died between two of those points is not in that peak.

Queries run what fused mode has recorded first (its outputs do not exist
until then), and never start JAX's backend: before the first device use
everything is zero, and `dist.init_process_group("tpu_dist")` can still come
first.
"""

from __future__ import annotations

import gc
import math
import os
import sys

_peak = 0  # highest allocated bytes measured since the last reset
_pjrt_peak_at_reset = 0  # PJRT's own peak when reset_peak_memory_stats() ran


def backend_started() -> bool:
    """Whether JAX's backend is up (asked without importing JAX when it is not loaded)."""
    if "jax" not in sys.modules:
        return False
    from . import platform

    return platform.backend_started()


def _pjrt_stats() -> dict | None:
    from . import platform

    try:
        return platform.device(0).memory_stats() or None
    except Exception:  # PJRT:CPU keeps no allocator statistics (None, or raises)
        return None


def _live_bytes() -> int:
    import jax

    from . import platform

    total = 0
    for array in jax.live_arrays(platform.platform()):
        if isinstance(array.sharding, jax.sharding.SingleDeviceSharding):
            # array.nbytes, without its Python-level checks: synchronize() measures every
            # live array, and a model has thousands
            total += math.prod(array.shape) * array.dtype.itemsize
        elif array.is_fully_addressable:
            total += array.nbytes
        else:  # a global array of a tpu_dist job: only this process's shards are here
            total += sum(shard.data.nbytes for shard in array.addressable_shards)
    return total


def _cached_bytes() -> int:
    """Device bytes torch_tpu holds as a cache (tensor.cached_zeros_bytes)."""
    tensor = sys.modules.get("torch_tpu.tensor")
    return tensor.cached_zeros_bytes() if tensor is not None else 0


def _flush() -> None:
    fuse = sys.modules.get("torch_tpu.engine.fuse")
    if fuse is not None:
        fuse.flush("memory_stats()")


def stats() -> dict[str, int]:
    """Flat statistics named as torch.cuda.memory_stats names them, plus PJRT's own
    (prefixed `pjrt.`) where the platform keeps them."""
    global _peak
    _flush()
    if not backend_started():
        current, peak, reserved, pjrt = 0, _peak, 0, {}
    else:
        pjrt = _pjrt_stats() or {}
        if pjrt:
            in_use = int(pjrt.get("bytes_in_use", 0))
            current = in_use - _cached_bytes()
            # PyTorch's reserved is what the allocator holds, tensors' bytes included: a
            # GPU's BFC pool (`pool_bytes`). A TPU has no pool; its `bytes_reserved` is a
            # small region the runtime sets aside beside the tensors (16-48 KiB on a v5e).
            reserved = int(pjrt.get("pool_bytes", in_use + int(pjrt.get("bytes_reserved", 0))))
            reserved = max(reserved, in_use)
            own_peak = int(pjrt.get("peak_bytes_in_use", current))
            _peak = max(_peak, current)
            peak = own_peak if own_peak > _pjrt_peak_at_reset else _peak
        else:
            reserved = _live_bytes()
            current = reserved - _cached_bytes()
            _peak = peak = max(_peak, current)
    return {
        "allocated_bytes.all.current": current,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": reserved,
        "reserved_bytes.all.peak": max(peak, reserved),
        **{f"pjrt.{k}": int(v) for k, v in pjrt.items()},
    }


def nested_stats() -> dict:
    """stats() as the nested dictionary torch.accelerator.memory_stats flattens."""
    nested: dict = {}
    for key, value in stats().items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def sample() -> None:
    """Measure now, so the peak includes this moment (synchronize() calls it)."""
    if backend_started():
        stats()


def reset_peak() -> None:
    """Start peak tracking afresh from the bytes allocated now."""
    global _peak, _pjrt_peak_at_reset
    _peak = 0
    pjrt = _pjrt_stats() if backend_started() else None
    _pjrt_peak_at_reset = int(pjrt.get("peak_bytes_in_use", 0)) if pjrt else 0
    stats()


def release() -> None:
    """empty_cache(): XLA returns a buffer when its last array dies, so what can be
    released is the arrays of tensors that only a reference cycle keeps alive."""
    gc.collect()


def info() -> tuple[int, int]:
    """(free, total) bytes of the device: PJRT's limit where kept, else host memory
    (XLA:CPU's device memory is the host's)."""
    pjrt = _pjrt_stats() if backend_started() else None
    if pjrt and "bytes_limit" in pjrt:
        total = int(pjrt["bytes_limit"])
        return total - int(pjrt.get("bytes_in_use", 0)), total
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
