"""The XLA collectives: one jitted SPMD program per (collective, rank group, static args).

Every program works on flat local blocks: a rank's block of a global array
whose dim 0 is split over the group's 1-D mesh (`mesh.sharding`), so a
tensor's flat storage array becomes its rank's block with no copy. The
program runs under `shard_map`, where a block sees the group as the named
axis `mesh.AXIS`: `psum`, `all_gather`, `psum_scatter`, `all_to_all`,
`ppermute` are XLA collectives (gloo on XLA:CPU, ICI on a TPU pod).

Every program's first collective is the same on every rank: an all-gather of
a fixed-size envelope (`ENVELOPE_BYTES`) that starts with a 64-bit signature
of the call (collective, arguments, shapes, dtypes). Ranks that call
mismatched collectives therefore always meet in that all-gather, see
different signatures, and raise instead of hanging or mixing data:

- a small call (its inputs fit in the envelope after the signature) needs no
  second collective: every rank computes the collective's result from the
  gathered inputs (`jax.vmap` of the same body over the group axis), one
  round trip in all;
- a larger call runs its collective under `lax.cond` only if all signatures
  agree (the same decision on every rank). On XLA:CPU the conditional costs
  about 0.5 ms a call, which is why small calls avoid it.

Every program is dispatched from the caller's thread and returns at once:
XLA runs it asynchronously, so a peer that is late, hangs or never calls
delays only the wait (`work.py`), which polls it within the group's timeout.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

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


# Bytes of the envelope every program all-gathers first: the 8-byte signature, then
# the inputs of a small call. 1 KiB carries 254 float32 values (losses, norms,
# barriers, object sizes) and costs a large call a negligible k KiB more.
ENVELOPE_BYTES = 1024
_SIGNATURE_BYTES = 8
# permute's point-to-point ppermute has no batching rule for a partial permutation.
_NOT_IN_ENVELOPE = frozenset({"permute"})


def _nbytes(x) -> int:
    return x.size * (1 if x.dtype == jnp.bool_ else x.dtype.itemsize)


def _as_bytes(x) -> jax.Array:
    """x's bytes as a flat uint8 array (bool as one byte per value)."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    return lax.bitcast_convert_type(x, jnp.uint8).reshape(-1)


def _from_bytes(rows, start: int, like) -> jax.Array:
    """Each rank's copy of an input of `like`'s shape and dtype, from its bytes at
    `start` of the gathered (k, ENVELOPE_BYTES) rows: a (k, *like.shape) array."""
    dtype = like.dtype
    raw = rows[:, start : start + _nbytes(like)]
    if dtype == jnp.bool_:
        return (raw != 0).reshape(rows.shape[0], *like.shape)
    if dtype.itemsize > 1:
        raw = raw.reshape(rows.shape[0], -1, dtype.itemsize)
    return lax.bitcast_convert_type(raw, dtype).reshape(rows.shape[0], *like.shape)


# XLA:CPU runs a program whose cost analysis counts fewer flops than this inline, inside
# the dispatching call (PJRT's "cheap computation"), where a peer that never joins would
# block the caller beyond any timeout. Every program stays above it (`_gather_envelope`).
INLINE_FLOPS_BELOW = 1000
# No sum of the gathered envelope bytes reaches this (255 * 1 KiB * k < 2**32 - 1 for any
# group of fewer than 16,000 ranks): comparing against it keeps the sum in the program.
_UNREACHABLE_SUM = 2**32 - 1


def _gather_envelope(signature, blocks) -> tuple[jax.Array, jax.Array]:
    """The one collective every program starts with; returns the (k,) signatures and
    the (k, ENVELOPE_BYTES) gathered envelopes.

    It also sums the gathered bytes (about 3 flops a byte, k KiB): that puts every
    program over INLINE_FLOPS_BELOW, so XLA:CPU always runs it asynchronously."""
    packed = jnp.concatenate([_as_bytes(signature), *(_as_bytes(b) for b in blocks)])
    envelope = jnp.pad(packed, (0, ENVELOPE_BYTES - packed.shape[0]))
    rows = lax.all_gather(envelope, AXIS)
    signatures = lax.bitcast_convert_type(rows[:, :_SIGNATURE_BYTES], jnp.int64)
    total = jnp.sum(rows.astype(jnp.uint32), dtype=jnp.uint32)
    signatures = jnp.where(total == _UNREACHABLE_SUM, -1, signatures)
    return signatures, rows


def _fits_envelope(kind: str, blocks) -> bool:
    if kind in _NOT_IN_ENVELOPE or any(jnp.iscomplexobj(b) for b in blocks):
        return False
    return _SIGNATURE_BYTES + sum(_nbytes(b) for b in blocks) <= ENVELOPE_BYTES


@functools.lru_cache(maxsize=4096)
def _program(kind: str, ranks: tuple[int, ...], params: tuple, value: int):
    """The program of one call signature `value` (a constant in it: no input to build)."""
    from jax import shard_map
    from jax.sharding import PartitionSpec

    body = BODIES[kind](len(ranks), *params)

    signature = np.array([value], np.int64)

    def in_envelope(*blocks):
        signatures, rows = _gather_envelope(signature, blocks)
        inputs, start = [], _SIGNATURE_BYTES
        for b in blocks:
            inputs.append(_from_bytes(rows, start, b))
            start += _nbytes(b)
        every_rank = jax.vmap(body, axis_name=AXIS)(*inputs)  # the body's collectives, locally
        mine = lax.axis_index(AXIS)
        return (signatures, *(out[mine] for out in every_rank))

    def guarded(*blocks):
        signatures, _ = _gather_envelope(signature, ())
        agree = jnp.all(signatures == signatures[0])
        shapes = jax.eval_shape(body, *blocks)

        def skipped(*_):
            return tuple(jnp.zeros(s.shape, s.dtype) for s in shapes)

        return (signatures, *lax.cond(agree, body, skipped, *blocks))

    def program(*blocks):  # traced per shape: the choice is static
        return (in_envelope if _fits_envelope(kind, blocks) else guarded)(*blocks)

    spec = PartitionSpec(AXIS)
    return jax.jit(
        shard_map(
            program, mesh=sharding(ranks).mesh, in_specs=spec, out_specs=spec, check_vma=False
        ),
        keep_unused=True,  # the executable takes exactly the blocks (`run` passes them all)
    )


@functools.lru_cache(maxsize=4096)
def signature(*parts) -> int:
    """A stable 63-bit hash of a call's description (the same in every process)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def run(kind: str, ranks: tuple[int, ...], params: tuple, blocks: list, described: str):
    """Dispatch one collective on this rank's flat blocks; returns at once.

    Returns (own signature, the group's signatures, this rank's output blocks), all
    still being computed: the signatures are a (k,) int64 array, all equal unless ranks
    disagreed, in which case the outputs mean nothing (the wait raises and never writes
    them)."""
    value = signature(kind, params, described)
    shapes = tuple((b.shape[0], b.dtype) for b in blocks)
    executable = _executable(kind, ranks, params, value, shapes)
    outputs = executable.execute_sharded(blocks).disassemble_into_single_device_arrays()
    return value, outputs[0][0], [o[0] for o in outputs[1:]]


@functools.lru_cache(maxsize=4096)
def _executable(kind: str, ranks: tuple[int, ...], params: tuple, value: int, shapes: tuple):
    """XLA's executable of one call signature for blocks of `shapes` ((n, dtype) each).

    `run` calls it with this rank's blocks as they are and takes its local outputs as
    they come: going through the jitted function instead would wrap every block in a
    global array and unwrap every output, which took about 60% of a small collective's
    dispatch. Every block is a tpu storage's array, on this process's device: the
    group's device for this rank (`mesh.rank_devices`)."""
    layout = sharding(ranks)
    avals = [jax.ShapeDtypeStruct((len(ranks) * n,), dtype, sharding=layout) for n, dtype in shapes]
    compiled = _program(kind, ranks, params, value).lower(*avals).compile()
    return compiled._executable.xla_executable
