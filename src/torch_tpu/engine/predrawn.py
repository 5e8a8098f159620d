"""What an eager random op's program takes where its key goes: the key, or random
bits drawn ahead of it by one program per size bucket.

The key of `(seed, counter)` (`rng.make_key`) is made by one small executable
compiled once per process (`key`): deriving it inside every op's program cost
each one's compile 120-145 ms on XLA:CPU.

A random op's program is mostly JAX's threefry generator, which XLA:CPU compiles
in 110-250 ms even as a flat draw, against 35-45 ms for what the op does with
the bits (uniform, normal, integers in a range); tests, initialisation and
data-dependent sizes call random ops at sizes never seen before. In strict and
debug modes, an op that fills `self` element by element from the key and the
flat index alone (`Lowering.elementwise_draw`) takes its bits as an input: one
program per power-of-two size bucket draws them, shared by every such op,
dtype and argument, and the op's own program turns the prefix it needs into
values. JAX's partitionable threefry draws element i from the key and i alone,
so a bucket's prefix holds exactly the bits the op would draw itself: the
values are the same bits on either path (tests/test_ops_random.py), and fused
segments and compiled graphs, which compile whole programs, still draw inside.

The op's program sees an ordinary JAX key (`as_key`) whose `random_bits` reads
the predrawn words, so the lowerings and JAX's samplers run unchanged.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.extend.random
import jax.numpy as jnp
import numpy as np

from .. import cache, rng

# (small draws share one bucket: drawing 1024 elements costs microseconds, and every
# bucket is a generator program, and a program per sampler and dtype for the draws at
# new shapes that go through a flat tensor of their bucket's size, executor._drawn_in_bucket)
_SMALLEST_BUCKET = 1024
# beyond this many elements, the bucket's extra draws and memory (up to twice the
# target's 8 bytes per element) outweigh a compile
_LARGEST_TARGET = 1 << 20
_UINT = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32, 64: jnp.uint64}


def serves(n: int) -> bool:
    """Whether an elementwise draw of n elements takes predrawn bits."""
    return 0 < n <= _LARGEST_TARGET and jax.config.jax_threefry_partitionable


def bucket_size(n: int) -> int:
    return max(_SMALLEST_BUCKET, 1 << (n - 1).bit_length())


def key(words: np.ndarray) -> jax.Array:
    """The PRNG key of `rng.next_key_words()`'s words, `rng.make_key`'s."""
    return _key_maker()(words)


_WORDS = (jax.ShapeDtypeStruct((2,), np.uint64),)  # (seed, counter), one host array


@functools.cache
def _key_maker():
    return cache.compile(rng.key_from_words, _WORDS, kind="op", name="rng key")


cache.on_clear(_key_maker.cache_clear)


def bits(words: np.ndarray, n: int) -> jax.Array:
    """threefry's two 32-bit words per element for the key of `rng.next_key_words()`'s
    words, at the bucket's size: uint32[bucket, 2]."""
    return _drawer(bucket_size(n))(words)


@functools.cache
def _drawer(bucket: int):
    def draw(key_words):
        words = jax.random.bits(rng.key_from_words(key_words), (bucket,), jnp.uint64)
        high = (words >> np.uint64(32)).astype(jnp.uint32)
        return jnp.stack([high, words.astype(jnp.uint32)], axis=1)

    return cache.compile(draw, _WORDS, kind="op", name=f"rng bits {bucket}")


cache.on_clear(_drawer.cache_clear)


def as_key(key_input: jax.Array):
    """Inside a program: the key a random op's lowering takes, from what it was given
    (a raw threefry key, or predrawn words)."""
    if key_input.ndim == 1:
        return key_input
    return jax.random.wrap_key_data(key_input, impl=_impl(key_input.shape[0]))


@functools.cache
def _impl(bucket: int):
    def random_bits(words, bit_width: int, shape: tuple):
        """What JAX's partitionable threefry makes of its two words per element."""
        n = math.prod(shape)
        high, low = words[:n, 0], words[:n, 1]
        if bit_width == 64:
            wide = high.astype(jnp.uint64) << np.uint64(32) | low.astype(jnp.uint64)
            return wide.reshape(shape)
        return (high ^ low).astype(_UINT[bit_width]).reshape(shape)

    def one_draw_only(*_):
        raise NotImplementedError("predrawn random bits serve one draw, not a split key")

    return jax.extend.random.define_prng_impl(
        key_shape=(bucket, 2),
        seed=one_draw_only,
        split=one_draw_only,
        random_bits=random_bits,
        fold_in=one_draw_only,
        name=f"torch_tpu_predrawn_{bucket}",
        tag="tpu_predrawn",
    )
