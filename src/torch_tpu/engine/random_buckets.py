"""A random op called at many sizes draws from one program per size bucket.

A random op's program is mostly JAX's threefry generator, which XLA compiles
slowly (80-185 ms on XLA:CPU, against ~30 ms for an add), and tests, model
initialisation and data-dependent sizes call random ops at sizes never seen
before. Ops whose every element is drawn from the key and the element's flat
index alone (`Lowering.elementwise_draw`: jax's partitionable threefry) give,
drawn at a larger 1-D size, the same values as a prefix. So from the second
geometry an op (with its dtype and static arguments) meets in one power-of-two
size bucket on, each new geometry there draws at the bucket's size and copies
the prefix into the target: only the copy is compiled per size. The first
geometry keeps its own program (a loop at one shape runs as before: one
dispatch, no extra compile), and one served from the bucket stays served from
it (no compile appears in a later, steady step). The
values are the same bits either way: which path ran never changes the random
stream (tests/test_ops_random.py).
"""

from __future__ import annotations

import jax
import torch

from .. import cache
from . import arguments, modes

_SMALLEST_BUCKET = 64
# beyond this many elements, the bucket's extra draws and memory (up to twice the
# target) outweigh a compile
_LARGEST_TARGET = 1 << 20
_VARYING = "varying"

# (op, dtype, bucket, other arguments) -> the executable key of its first geometry,
# or _VARYING once a second geometry came
_families: dict = {}
_served: set = set()  # executable keys served from their bucket
cache.on_clear(_families.clear)
cache.on_clear(_served.clear)


def serves(spec, values: list, key: tuple) -> bool:
    """Whether this call, whose executable (`key`) is not built, draws from a bucket."""
    if not spec.lowering.elementwise_draw or modes.current is modes.EagerMode.DEFER_AND_FUSE:
        return False  # (fused mode compiles whole segments: a bucket would not be shared)
    if key in _served:
        return True
    target = values[0]
    n = target.numel()
    if not 0 < n <= _LARGEST_TARGET or not target.is_contiguous():
        return False
    if target.shape == (bucket_size(n),) or not jax.config.jax_threefry_partitionable:
        return False  # (the bucket's own call; without partitionable draws, no prefix)
    family = (spec, target.dtype, bucket_size(n), key[1][1:])
    first = _families.setdefault(family, key)
    if first == key:
        return False
    _families[family] = _VARYING
    _served.add(key)
    return True


def bucket_size(n: int) -> int:
    return max(_SMALLEST_BUCKET, 1 << (n - 1).bit_length())


def draw(spec, values: list) -> torch.Tensor:
    """The op on a fresh 1-D tensor of the bucket's size, its prefix copied into self:
    one key drawn, as the op's own program draws it."""
    target = values[0]
    n = target.numel()
    drawn = torch.empty(bucket_size(n), dtype=target.dtype, device=target.device)
    arguments.call_op(spec.schema.op, [drawn, *values[1:]])
    return target.copy_(drawn[:n].view(target.shape))
