"""Repeat calls in strict and fused mode: one dictionary lookup from how a call looks to
what runs it (strict executes it, fused records it into the pending segment).

The general path (`executor._run`) describes every argument as a `View`,
builds a nested cache key and, for a key it has not seen, runs PyTorch's meta
kernel and the lowering's checks. A call that looks exactly like an earlier
successful one -- same overload, argument kinds, shapes, strides, offsets,
dtypes, storage sizes and dtypes, storage sharing between arguments, static
values -- needs none of that: its signature, a flat tuple that is cheap to
hash and compare, maps straight to the executable and its output metadata.
Anything new (and any op whose checks depend on values, or that resizes an
`out=` argument) takes the general path, so PyTorch's error checks run
there exactly as before.

Python numbers an op takes at run time (alpha, an optimizer's lr) are passed
as device scalars once a value repeats: a host scalar costs the executable
call a conversion each time (about 175 us on a TPU host), a cached device
scalar nearly nothing.
"""

from __future__ import annotations

import jax
import numpy as np
import torch

from .. import cache, dtypes, platform, strided
from . import device_asserts
from .schema import Kind

_FAST: dict[tuple, object] = {}  # signature -> the general path's _Executable
cache.on_clear(_FAST.clear)

_TENSOR = Kind.TENSOR
_OPT_TENSOR = Kind.OPT_TENSOR
_TENSOR_LIST = Kind.TENSOR_LIST
_SCALAR = Kind.SCALAR
_SCALAR_LIST = Kind.SCALAR_LIST
_STATIC = Kind.STATIC


def signature(spec, values: list):
    """(signature, storages, dynamic scalars) of a call, or None when the call holds
    something only the general path handles (host tensors, generators, index lists).

    The signature is flat and still unambiguous: a tensor adds its storage slot (an
    int) and six more items, a number its type, an absent argument None."""
    if spec.sees_bits and _any_bits(spec, values):
        return None  # a conjugate / negative view: the general path's View holds the bits
    key = [spec]
    storages: list = []
    slots: dict = {}
    dynamic: list = []
    for kind, value, default in zip(spec.kinds, values, spec.scalar_defaults):
        if kind is _TENSOR or kind is _OPT_TENSOR:
            if value is None:
                key.append(None)
            elif isinstance(value, torch.Tensor):
                try:
                    storage = value.untyped_storage()._tpu
                except AttributeError:  # a CPU or meta tensor, or a storage PyTorch re-wrapped
                    return None
                add_tensor(value, storage, key, storages, slots, dynamic)
            else:  # a Python number PyTorch wrapped as a tensor: a run-time scalar
                key.append(type(value))
                dynamic.append(value)
        elif kind is _SCALAR:
            if value is None:
                key.append(None)
            elif type(value) is type(default) and value == default:
                key.append(_AT_DEFAULT)  # (a constant of the program: executor._layout)
            else:
                key.append(type(value))
                dynamic.append(value)
        elif kind is _STATIC:
            if isinstance(value, (list, torch.Generator)):
                if type(value) is not list:
                    return None
                value = _frozen(value)
                if value is None:
                    return None
            key.append(type(value))
            key.append(value)
        elif kind is _TENSOR_LIST:
            key.append(len(value))
            for t in value:
                if not _tensor(t, key, storages, slots, dynamic):
                    return None
        elif kind is _SCALAR_LIST:
            key.append(len(value))
            for v in value:
                key.append(type(v))
                dynamic.append(v)
        else:  # index lists: CPU indices and None entries, the general path's job
            return None
    if spec.lowering.device_check is not None and device_asserts.checks(spec.lowering, values):
        storages.append(device_asserts.flag_storage())  # (as the general path: last)
    return tuple(key), storages, dynamic


def _any_bits(spec, values: list) -> bool:
    for kind, value in zip(spec.kinds, values):
        if kind is _TENSOR_LIST:
            if any(t.is_conj() or t.is_neg() for t in value):
                return True
        elif (kind is _TENSOR or kind is _OPT_TENSOR) and isinstance(value, torch.Tensor):
            if value.is_conj() or value.is_neg():
                return True
    return False


def _tensor(t: torch.Tensor, key: list, storages: list, slots: dict, dynamic: list) -> bool:
    try:
        storage = t.untyped_storage()._tpu
    except AttributeError:  # a CPU or meta tensor, or a storage PyTorch re-wrapped
        return False
    add_tensor(t, storage, key, storages, slots, dynamic)
    return True


_AT_DEFAULT = object()  # in a signature, a scalar passed as its schema default
_VARYING = object()  # in a signature, in place of an offset passed at run time


def add_tensor(
    t: torch.Tensor, storage, key: list, storages: list, slots: dict, dynamic=None
) -> None:
    """Append tpu tensor t (over `storage`) to a flat signature: its storage's slot (the
    order storages first appear in; `storages` and `slots` collect them) and six more
    items, its geometry, its storage array's shape and the dtypes. Compiled graphs key
    their executables the same way. Given `dynamic` (eager ops), an offset the general
    path passes at run time (`strided.offset_may_vary`) goes there instead."""
    slot = slots.get(id(storage))
    if slot is None:
        slot = slots[id(storage)] = len(storages)
        storages.append(storage)
    offset = t.storage_offset()
    if (
        offset
        and dynamic is not None
        and dtypes.TORCH_TO_JAX[t.dtype] == storage.dtype
        and strided.geometry_may_move(t.shape, t.stride())
    ):
        dynamic.append(offset)
        offset = _VARYING
    key += (slot, t.shape, t.stride(), offset, t.dtype, storage.shape, storage.dtype)


def _frozen(value: list):
    """A static list as a hashable tuple, or None when it holds what only the general
    path judges (nested lists, tensors)."""
    out = []
    for v in value:
        if isinstance(v, (list, torch.Tensor, torch.Generator)):
            return None
        out.append((type(v), v))
    return tuple(out)


lookup = _FAST.get  # (signature -> entry or None; no Python frame of its own)


def remember(key: tuple, entry) -> None:
    """Route later calls with this signature straight to entry: only for entries whose
    checks need no values and that resize no out= argument."""
    if entry.resize or entry.recheck:
        return
    if len(_FAST) > 65536:  # (a program sweeping shapes: start over rather than grow)
        _FAST.clear()
    _FAST[key] = entry


# ------------------------------------------------------------ device scalars

_SCALARS: dict = {}  # (type, value) -> a device scalar, for values seen twice
_SEEN: set = set()
_CACHED_TYPES = (int, float, bool)
_MAX_SCALARS = 4096
def device_scalars(values: list) -> tuple:
    """The run-time scalars as the executable takes them cheapest: a cached device
    scalar for a value seen before (same dtype and weak type as the Python number),
    else the number itself."""
    out = []
    for v in values:
        t = type(v)
        if t not in _CACHED_TYPES or (
            # (0.0 == -0.0 and NaN != NaN: keyed by value, they would mix)
            (t is float and (v == 0.0 or v != v)) or (t is int and not dtypes.fits_int64(v))
        ):
            out.append(v)
            continue
        key = (t, v)
        array = _SCALARS.get(key)
        if array is None:
            if key not in _SEEN:
                if len(_SEEN) > _MAX_SCALARS:
                    _SEEN.clear()
                _SEEN.add(key)
                out.append(v)
                continue
            if len(_SCALARS) > _MAX_SCALARS:
                _SCALARS.clear()
            array = _SCALARS[key] = jax.device_put(v, platform.device())
        out.append(array)
    return tuple(out)


def int64_scalar(value: int) -> jax.Array:
    """value as a strongly typed int64 device scalar, cached in the same table: a
    compiled graph's run-time storage offsets (an executable compiled for numpy int64
    inputs), which repeat from step to step."""
    key = (np.int64, value)
    array = _SCALARS.get(key)
    if array is None:
        if len(_SCALARS) > _MAX_SCALARS:
            _SCALARS.clear()
        array = _SCALARS[key] = jax.device_put(np.int64(value), platform.device())
    return array


def _clear_scalars() -> None:
    _SCALARS.clear()
    _SEEN.clear()


cache.on_clear(_clear_scalars)
