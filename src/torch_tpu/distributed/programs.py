"""The XLA collectives: one jitted SPMD program per (collective, rank group, static args).

Every program works on flat local blocks: a rank's block of a global array
whose dim 0 is split over the group's 1-D mesh (`mesh.sharding`), so a
tensor's flat storage array becomes its rank's block with no copy. The
program runs under `shard_map`, where a block sees the group as the named
axis `mesh.AXIS`: `psum`, `all_gather`, `psum_scatter`, `all_to_all`,
`ppermute` are XLA collectives (gloo on XLA:CPU, ICI on a TPU pod).

Mismatched calls. Each program's first collective is an all-gather of a
fixed-size envelope (`ENVELOPE_BYTES`, the same for every call, whatever its
shape or dtype, so ranks that called different collectives still meet in it)
carrying a 64-bit signature of the call (collective, arguments, shapes,
dtypes). Ranks that disagree get an error instead of a hang or garbage.

- A small call (payload up to `SMALL_BYTES`) carries its payload in the
  envelope too: every rank then computes the collective's result from the
  gathered rows (`ROW_BODIES`), one round trip in all (a small collective's
  cost is its round trip, not its bytes).
- A larger call runs its XLA collective after the envelope, under `lax.cond`
  on the signatures' agreement (the same decision on every rank).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import queue
import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import platform
from .mesh import AXIS, sharding

# ------------------------------------------------------------------ bodies
# A body maps the local blocks of its inputs to the local blocks of its outputs
# (a tuple); `k` is the group size, static like every other argument.


def _bits(x):
    """x as unsigned integers of the same width (bit-exact masked sums), and the inverse."""
    dtype = x.dtype
    if dtype == jnp.bool_:
        return x.astype(jnp.uint8), lambda b: b.astype(jnp.bool_)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.float32 if dtype == jnp.complex64 else jnp.float64
        pairs = jnp.stack([x.real, x.imag], -1).astype(part)
        bits, back = _bits(pairs)
        return bits, lambda b: lax.complex(*jnp.moveaxis(back(b), -1, 0)).astype(dtype)
    if jnp.issubdtype(dtype, jnp.integer):
        return x, lambda b: b
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[dtype.itemsize]
    return lax.bitcast_convert_type(x, unsigned), lambda b: lax.bitcast_convert_type(b, dtype)


def _from_rank(x, index: int):
    """x of rank `index` on every rank, bit for bit (a masked sum of its bits)."""
    bits, back = _bits(x)
    mine = lax.axis_index(AXIS) == index
    return back(lax.psum(jnp.where(mine, bits, jnp.zeros_like(bits)), AXIS))


def _reduce(x, op: str, k: int):
    """The reduction of x over the group."""
    if x.dtype == jnp.bool_:
        as_int = x.astype(jnp.uint8)
        if op in ("sum", "max", "bor", "bxor", "avg"):
            return lax.pmax(as_int, AXIS).astype(jnp.bool_)
        return lax.pmin(as_int, AXIS).astype(jnp.bool_)
    if op == "sum":
        return lax.psum(x, AXIS)
    if op == "avg":
        total = lax.psum(x, AXIS)
        if jnp.issubdtype(x.dtype, jnp.integer):
            return lax.div(total, jnp.asarray(k, x.dtype))
        return (total / k).astype(x.dtype)
    if op == "max":
        return lax.pmax(x, AXIS)
    if op == "min":
        return lax.pmin(x, AXIS)
    rows = lax.all_gather(x, AXIS)  # no XLA all-reduce for these: gather, reduce locally
    combine = {
        "product": jnp.multiply,
        "band": jnp.bitwise_and,
        "bor": jnp.bitwise_or,
        "bxor": jnp.bitwise_xor,
    }[op]
    return functools.reduce(combine, [rows[i] for i in range(k)])


def all_reduce(k: int, op: str):
    return lambda x: (_reduce(x, op, k),)


def broadcast(k: int, src: int):
    return lambda x: (_from_rank(x, src),)


def all_gather(k: int):
    return lambda x: (lax.all_gather(x, AXIS, tiled=True),)


def reduce_scatter(k: int, op: str):
    def body(x):
        if op in ("sum", "avg") and x.dtype != jnp.bool_:
            part = lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
            if op == "avg":
                part = _reduce_avg_scale(part, k)
            return (part,)
        full = _reduce(x, op, k)
        m = full.shape[0] // k
        return (lax.dynamic_slice(full, (lax.axis_index(AXIS) * m,), (m,)),)

    return body


def _reduce_avg_scale(part, k):
    if jnp.issubdtype(part.dtype, jnp.integer):
        return lax.div(part, jnp.asarray(k, part.dtype))
    return (part / k).astype(part.dtype)


def all_to_all(k: int):
    def body(x):
        rows = x.reshape(k, -1)
        return (lax.all_to_all(rows, AXIS, 0, 0, tiled=True).reshape(-1),)

    return body


def scatter(k: int, src: int):
    """Block j of src's input to rank j, bit for bit (masked reduce-scatter of bits)."""

    def body(x):
        bits, back = _bits(x)
        mine = lax.axis_index(AXIS) == src
        masked = jnp.where(mine, bits, jnp.zeros_like(bits))
        if bits.ndim > 1:  # complex: (n, 2) pairs
            masked = masked.reshape(-1)
            part = lax.psum_scatter(masked, AXIS, scatter_dimension=0, tiled=True)
            return (back(part.reshape(-1, 2)),)
        return (back(lax.psum_scatter(masked, AXIS, scatter_dimension=0, tiled=True)),)

    return body


def permute(k: int, src: int, dst: int):
    """src's block to dst (point-to-point); every other rank gets zeros."""
    return lambda x: (lax.ppermute(x, AXIS, [(src, dst)]),)


# ------------------------------------------------------------------ small calls
# A row body maps the gathered payloads (k, n) of every rank and this rank's index
# to this rank's output blocks, computed locally in rank order (the same on every rank).

SMALL_BYTES = 4096  # payloads up to this size travel inside the envelope
ENVELOPE_BYTES = 8 + SMALL_BYTES


def _reduce_rows(rows, op: str, k: int):
    if rows.dtype == jnp.bool_:
        return rows.any(0) if op in ("sum", "max", "bor", "bxor", "avg") else rows.all(0)
    combine = {
        "sum": jnp.add,
        "avg": jnp.add,
        "max": jnp.maximum,
        "min": jnp.minimum,
        "product": jnp.multiply,
        "band": jnp.bitwise_and,
        "bor": jnp.bitwise_or,
        "bxor": jnp.bitwise_xor,
    }[op]
    total = functools.reduce(combine, [rows[i] for i in range(k)])
    return _reduce_avg_scale(total, k) if op == "avg" else total


def _pick(blocks, index):
    """blocks[index] for a traced index (dim 0)."""
    return lax.dynamic_index_in_dim(blocks, index, 0, keepdims=False)


ROW_BODIES: dict[str, Callable] = {
    "all_reduce": lambda k, op: lambda rows, me: (_reduce_rows(rows, op, k),),
    "broadcast": lambda k, src: lambda rows, me: (rows[src],),
    "all_gather": lambda k: lambda rows, me: (rows.reshape(-1),),
    "reduce_scatter": lambda k, op: lambda rows, me: (
        _pick(_reduce_rows(rows, op, k).reshape(k, -1), me),
    ),
    "all_to_all": lambda k: lambda rows, me: (
        _pick(jnp.swapaxes(rows.reshape(k, k, -1), 0, 1), me).reshape(-1),
    ),
    "scatter": lambda k, src: lambda rows, me: (_pick(rows[src].reshape(k, -1), me),),
    "permute": lambda k, src, dst: lambda rows, me: (
        jnp.where(me == dst, rows[src], jnp.zeros_like(rows[src])),
    ),
}


def _to_bytes(x):
    """A flat array's bytes (uint8)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    return lax.bitcast_convert_type(x, jnp.uint8).reshape(-1)


def _from_bytes(b, dtype, n: int):
    """Rows of bytes (..., n * itemsize) as (..., n) values of dtype."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return b.astype(jnp.bool_)
    if dtype.itemsize == 1:
        return lax.bitcast_convert_type(b, dtype)
    return lax.bitcast_convert_type(b.reshape(*b.shape[:-1], n, dtype.itemsize), dtype)


def _exchange(signature, payload=None):
    """The envelope all-gather: every rank's signature (k,), and the gathered payloads
    (k, n) when this call carries one."""
    data = _to_bytes(signature)
    if payload is not None:
        data = jnp.concatenate([data, _to_bytes(payload)])
    envelope = jnp.pad(data, (0, ENVELOPE_BYTES - data.shape[0]))
    rows = lax.all_gather(envelope, AXIS)  # (k, ENVELOPE_BYTES)
    signatures = _from_bytes(rows[:, :8], jnp.int64, 1).reshape(-1)
    if payload is None:
        return signatures, None
    n = payload.shape[0]
    return signatures, _from_bytes(rows[:, 8 : 8 + n * payload.dtype.itemsize], payload.dtype, n)


def is_small(blocks: list) -> bool:
    """Whether a call travels inside the envelope (one real dtype payload that fits)."""
    return (
        len(blocks) == 1
        and blocks[0].nbytes <= SMALL_BYTES
        and not jnp.issubdtype(blocks[0].dtype, jnp.complexfloating)
    )


BODIES: dict[str, Callable] = {
    "all_reduce": all_reduce,
    "broadcast": broadcast,
    "all_gather": all_gather,
    "reduce_scatter": reduce_scatter,
    "all_to_all": all_to_all,
    "scatter": scatter,
    "permute": permute,
}

# ------------------------------------------------------------------ programs


@functools.cache
def _program(kind: str, ranks: tuple[int, ...], params: tuple, small: bool):
    from jax import shard_map
    from jax.sharding import PartitionSpec

    k = len(ranks)
    body = BODIES[kind](k, *params)
    row_body = ROW_BODIES[kind](k, *params)

    def guarded(signature, *blocks):
        shapes = jax.eval_shape(body, *blocks)

        def skipped(*_):
            return tuple(jnp.zeros(s.shape, s.dtype) for s in shapes)

        if small:
            signatures, rows = _exchange(signature, blocks[0])
            agree = jnp.all(signatures == signatures[0])
            outputs = row_body(rows, lax.axis_index(AXIS))
            return (signatures, *(jnp.where(agree, o, jnp.zeros_like(o)) for o in outputs))
        signatures, _ = _exchange(signature)
        agree = jnp.all(signatures == signatures[0])
        return (signatures, *lax.cond(agree, body, skipped, *blocks))

    spec = PartitionSpec(AXIS)
    return jax.jit(
        shard_map(
            guarded, mesh=sharding(ranks).mesh, in_specs=spec, out_specs=spec, check_vma=False
        )
    )


def signature(*parts) -> int:
    """A stable 63-bit hash of a call's description (the same in every process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


_SIGNATURE_ARRAYS: dict[int, jax.Array] = {}


def _signature_block(value: int) -> jax.Array:
    block = _SIGNATURE_ARRAYS.get(value)
    if block is None:
        if len(_SIGNATURE_ARRAYS) > 4096:
            _SIGNATURE_ARRAYS.clear()
        block = jax.device_put(np.array([value], np.int64), platform.device())
        _SIGNATURE_ARRAYS[value] = block
    return block


def run(kind: str, ranks: tuple[int, ...], params: tuple, blocks: list, described: str):
    """Dispatch one collective on this rank's flat blocks.

    Returns a future of (own signature, the group's signatures, this rank's output
    blocks): the signatures are a (k,) int64 array, all equal unless ranks disagreed, in
    which case the outputs are zeros. The dispatch runs on a thread of its own: XLA:CPU
    may execute a collective inside the dispatching call, and a peer that never joins
    would then block the caller beyond any timeout.
    """
    return _dispatcher().submit(_dispatch, kind, ranks, params, blocks, described)


class _Dispatcher:
    """One daemon thread running dispatches in order (a daemon: a collective stuck on
    a dead peer must not keep the process from exiting)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._loop, name="tpu_dist dispatch", daemon=True).start()

    def submit(self, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((future, fn, args))
        return future

    def _loop(self) -> None:
        while True:
            future, fn, args = self._queue.get()
            try:
                future.set_result(fn(*args))
            except BaseException as e:
                future.set_exception(e)


@functools.cache
def _dispatcher() -> _Dispatcher:
    return _Dispatcher()


def _dispatch(kind: str, ranks: tuple[int, ...], params: tuple, blocks: list, described: str):
    value = signature(kind, params, described)
    k = len(ranks)
    layout = sharding(ranks)
    global_inputs = [
        jax.make_array_from_single_device_arrays((k * b.shape[0],), layout, [b])
        for b in [_signature_block(value), *blocks]
    ]
    outputs = _program(kind, ranks, params, is_small(blocks))(*global_inputs)
    local = [o.addressable_shards[0].data for o in outputs]
    return value, local[0], local[1:]
