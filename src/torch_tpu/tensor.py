"""The tpu tensor payload.

A tpu tensor is a genuine PrivateUse1 tensor whose sizes, strides and storage
offset are real, as on CPU; its storage carries a `Storage` holding one JAX
array: of the tensor's shape when the storage was made for a contiguous tensor,
else flat (`strided.layout_shape`). Views share the storage, so a write through any alias is seen by
all of them, and the storage is the single source of truth.
"""

from __future__ import annotations

import copy
import math
import sys
import weakref

import jax.numpy as jnp
import numpy as np
import torch

from . import cache, dtypes, platform
from .engine import fuse
from .strided import View, contiguous_strides, layout_shape, storage_span

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
# (the boxed handle itself: OpOverload.redispatch is a Python frame around it)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset._handle.redispatch_boxed
_create_empty = torch._C._acc.create_empty_tensor
_storage_at = torch._C._construct_storage_from_data_pointer
DEVICE = torch.device("privateuseone", 0)

# Storages get distinct fake addresses so that data_ptr()-based alias checks in
# PyTorch (DDP buckets, FSDP, AOTAutograd) see what they would on a real device.
# Nothing ever dereferences them: every op on these tensors goes through us.
_next_address = 1 << 44


class _AddressTable:
    """Address -> live payload. PyTorch sometimes wraps a device pointer in a new
    storage object (from_blob, e.g. when pickling a storage); the address still finds
    the payload. Plain weak references, pruned when the table doubles: every new
    storage registers here, and a WeakValueDictionary entry costs a Python-level
    KeyedRef per tensor an op returns."""

    __slots__ = ("refs", "prune_at")

    def __init__(self) -> None:
        self.refs: dict[int, weakref.ref] = {}
        self.prune_at = 1024

    def __setitem__(self, address: int, payload: Storage) -> None:
        refs = self.refs
        refs[address] = weakref.ref(payload)
        if len(refs) > self.prune_at:
            self.refs = refs = {a: r for a, r in refs.items() if r() is not None}
            self.prune_at = max(1024, 2 * len(refs))

    def get(self, address: int) -> Storage | None:
        ref = self.refs.get(address)
        return None if ref is None else ref()

    def __getitem__(self, address: int) -> Storage:
        payload = self.get(address)
        if payload is None:
            raise KeyError(address)
        return payload

    def values(self) -> list[Storage]:
        """The live payloads."""
        return [p for p in (r() for r in self.refs.values()) if p is not None]


_BY_ADDRESS = _AddressTable()


def _attach_storage(t: torch.Tensor, shape, strides, dtype: torch.dtype, value, numel) -> None:
    """Back t with a new storage of numel elements and the given geometry."""
    layout = layout_shape(shape, strides) if value is None else value.shape
    payload = Storage(value, numel, dtypes.to_jax(dtype), layout)
    _set_storage(_CPU_KEYS, t, _new_storage(numel * dtype.itemsize, payload), 0, shape, strides)


def _new_storage(nbytes: int, payload: Storage) -> torch.UntypedStorage:
    global _next_address
    storage = _storage_at(_next_address, DEVICE, nbytes)
    _next_address += (nbytes + 4095) // 4096 * 4096 + 4096
    storage._tpu = payload
    _BY_ADDRESS[storage.data_ptr()] = payload
    return storage


# How many times a storage has been given a new payload (`replace_payload`). Addresses
# are never reused, so an address names one storage for good, and its payload too while
# this count stands: compiled graphs check a step's parameters by address.
payloads_replaced = 0


def replace_payload(storage: torch.UntypedStorage, new: Storage) -> None:
    """Give an existing tpu storage another payload (a storage donated to a jax_op)."""
    global payloads_replaced
    payloads_replaced += 1
    storage._tpu = new
    _BY_ADDRESS[storage.data_ptr()] = new


def clone_storage(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """A new tpu storage with the same bytes (UntypedStorage.clone, hence deepcopy).

    PyTorch's clone allocates through a C++ allocator the Python backend does
    not have. The copy shares the source's array: arrays are immutable and a
    write replaces a storage's array, so neither copy sees the other's writes.
    """
    source = storage._tpu if hasattr(storage, "_tpu") else _BY_ADDRESS[storage.data_ptr()]
    payload = Storage(source.current(), source.numel, source.dtype, source.shape)
    return _new_storage(storage.nbytes(), payload)


class Storage:
    """The value behind one tpu storage: a JAX array (or a fused segment's Pending) of
    numel elements, or None while never written."""

    __slots__ = ("value", "numel", "dtype", "shape", "__weakref__")

    def __init__(self, value, numel: int, dtype, shape: tuple | None = None) -> None:
        self.value = value
        self.numel = numel
        self.dtype = dtype  # jnp dtype of the array
        # The array's shape, fixed for the storage's life (every write keeps it; the
        # zeros of an unwritten storage have it): flat, or the shape of the contiguous
        # tensor the storage was made for. Programs are compiled for it.
        self.shape = (numel,) if shape is None else shape

    def array(self, reason: str = "value needed"):
        """The array: materialises zeros for a storage never written, and runs the
        fused segment (naming why) if the value is still pending."""
        value = self.value
        if value is None:
            value = self.value = _zeros(self.shape, self.dtype)
        elif type(value) is fuse.Pending:
            if value.value is None:
                fuse.flush(reason)
                if value.value is None:  # (else the storage would read as never written)
                    raise RuntimeError(
                        "tpu: this tensor has no value: the recorded ops that compute it "
                        "failed when they ran (the error raised then says why)"
                    )
            value = self.value = value.value
        return value

    def current(self):
        """The value without forcing it: an array, or a Pending in fused mode."""
        value = self.value
        if value is None:
            value = self.value = _zeros(self.shape, self.dtype)
        elif type(value) is fuse.Pending and value.value is not None:
            value = self.value = value.value
        return value


_ZEROS: dict = {}  # (shape, dtype) -> the zeros executable
_SHARED_ZEROS: dict = {}  # (shape, dtype) -> one zeros array, for small storages
_SHARED_ZEROS_MAX = 1 << 16  # elements: sharing bigger arrays would pin their memory
_SHARED_ZEROS_BUDGET = 16 << 20  # bytes the table may pin on the device, then it starts over
_SHARED_ZEROS_ENTRIES = 1024  # (memory statistics look at each entry)
_shared_zeros_bytes = 0
_NUMPY_MAX_DIMS = 32  # (numpy 1's limit; PyTorch allows 64 dims)


def _clear_shared_zeros() -> None:
    global _shared_zeros_bytes
    _SHARED_ZEROS.clear()
    _shared_zeros_bytes = 0


cache.on_clear(_ZEROS.clear)
cache.on_clear(_clear_shared_zeros)


def _zeros(shape: tuple, dtype):
    """The value of a storage never written. Small ones share one array per size (JAX
    arrays are immutable and writes replace a storage's array): running the zeros
    executable per allocation would cost about as much as the op that fills it. They
    are sent from the host: a program per new size would cost a compile (15 ms on
    XLA:CPU) where a small transfer costs microseconds."""
    key = (shape, dtype)
    shared = _SHARED_ZEROS.get(key)
    if shared is not None:
        return shared
    if math.prod(shape) <= _SHARED_ZEROS_MAX and len(shape) <= _NUMPY_MAX_DIMS:
        global _shared_zeros_bytes
        zeros = np.zeros(shape, dtype)
        full = len(_SHARED_ZEROS) >= _SHARED_ZEROS_ENTRIES
        if full or _shared_zeros_bytes + zeros.nbytes > _SHARED_ZEROS_BUDGET:
            _clear_shared_zeros()
        value = _SHARED_ZEROS[key] = platform.put(zeros)
        _shared_zeros_bytes += zeros.nbytes
        return value
    make = _ZEROS.get(key)
    if make is None:
        make = _ZEROS[key] = cache.compile(
            lambda: jnp.zeros(shape, dtype), (), kind="op", name="zeros"
        )
    return make()


def cached_zeros_bytes() -> int:
    """Bytes of the shared zeros arrays that no storage holds: a cache's, as a caching
    allocator's free blocks are, so memory statistics count them reserved, not
    allocated (torch.ones of a new size left its size "allocated" after del)."""
    # held by the table, the loop and getrefcount's argument alone
    return sum(a.nbytes for a in _SHARED_ZEROS.values() if sys.getrefcount(a) <= 3)


class Fresh:
    """A fresh output's metadata, worked out once per executable: what `make` needs
    to wrap each call's result array in a tensor."""

    __slots__ = ("shape", "dtype", "strides", "numel", "nbytes", "jax_dtype", "layout")

    def __init__(self, shape, dtype: torch.dtype, strides: tuple[int, ...] | None) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype
        if strides is None:
            self.strides = contiguous_strides(self.shape)
            self.numel = math.prod(self.shape)
        else:
            self.strides = tuple(strides)
            self.numel = storage_span(self.shape, self.strides, 0)
        self.nbytes = self.numel * dtype.itemsize
        self.jax_dtype = dtypes.to_jax(dtype)
        self.layout = layout_shape(self.shape, strides)

    def with_trailing(self, extra: int) -> Fresh:
        """This output over a storage `extra` elements longer: values its program packs
        after it, to be read to the host with it."""
        out = copy.copy(self)
        out.numel += extra
        out.nbytes = out.numel * self.dtype.itemsize
        out.layout = (out.numel,)
        return out

    def make(self, value) -> torch.Tensor:
        """A new tensor with its own storage holding value (new_tensor, unrolled)."""
        global _next_address
        t = _create_empty(self.shape, self.dtype)
        payload = Storage(value, self.numel, self.jax_dtype, self.layout)
        address = _next_address
        storage = _storage_at(address, DEVICE, self.nbytes)
        _next_address = address + (self.nbytes + 4095) // 4096 * 4096 + 4096
        storage._tpu = payload
        _BY_ADDRESS[address] = payload
        _set_storage(_CPU_KEYS, t, storage, 0, self.shape, self.strides)
        return t


def new_tensor(
    shape, dtype: torch.dtype, value=None, strides: tuple[int, ...] | None = None
) -> torch.Tensor:
    """A fresh tpu tensor with its own storage; value is its storage array, flat or
    (contiguous tensors) of its shape, or None: unwritten."""
    t = _create_empty(shape, dtype)
    if strides is None:
        # (not create_empty_tensor's: it gives a 0-sized dim's neighbours stride 0,
        # CPU gives them the strides of size 1: empty(5, 0).stride() is (1, 1))
        strides = contiguous_strides(tuple(shape))
        numel = math.prod(shape)
    else:
        numel = storage_span(tuple(shape), tuple(strides), 0)
    _attach_storage(t, shape, strides, dtype, value, numel)
    return t


def storage_of(t: torch.Tensor) -> Storage:
    storage = t.untyped_storage()
    try:
        return storage._tpu
    except AttributeError:
        payload = _BY_ADDRESS.get(storage.data_ptr())
        if payload is not None:
            return payload
        raise RuntimeError(
            f"tensor on {t.device} has no tpu payload (was it made outside torch_tpu?)"
        ) from None


def view_of(t: torch.Tensor, storage: Storage | None = None) -> View:
    storage = storage or storage_of(t)
    return View(
        tuple(t.shape),
        t.stride(),
        t.storage_offset(),
        _JAX_DTYPES[t.dtype],
        storage.numel,
        storage.dtype,
        storage.shape,
        t.is_conj(),
        t.is_neg(),
    )


_JAX_DTYPES = dtypes.TORCH_TO_JAX


def is_whole(t: torch.Tensor, storage: Storage) -> bool:
    """True when t is its storage, contiguous and complete: reading it is a reshape."""
    return (
        storage.numel == t.numel()
        and t.storage_offset() == 0
        and t.is_contiguous()
        and dtypes.TORCH_TO_JAX[t.dtype] == storage.dtype
    )


def set_geometry(t: torch.Tensor, storage, offset: int, shape, strides) -> None:
    """t over `storage` (a tpu storage) at the given offset, sizes and strides: metadata
    only, through CPU's `set_` kernel, as every tpu tensor gets its storage."""
    _set_storage(_CPU_KEYS, t, storage, offset, tuple(shape), tuple(strides))


def parts(storage: torch.UntypedStorage, geometries: list) -> list[torch.Tensor]:
    """New tensors over parts of an existing tpu storage, one per (offset, shape, dtype,
    strides): compile_step's gradients, parts of one buffer, made every step (metadata
    only, no Python frame per tensor)."""
    return [
        _set_storage(_CPU_KEYS, _create_empty(shape, dtype), storage, offset, shape, strides)
        for offset, shape, dtype, strides in geometries
    ]


def replace_storage(t: torch.Tensor, shape, strides=None) -> None:
    """Give t a new, unwritten storage of the given geometry (resize_, out= resizing)."""
    shape = tuple(shape)
    if strides is None:
        strides = contiguous_strides(shape)
    _attach_storage(t, shape, tuple(strides), t.dtype, None, storage_span(shape, strides, 0))
