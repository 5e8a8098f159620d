"""Reading regular strided views of a flat storage: a static slice of the storage
reshaped to a grid (`strided.read`) against an index gather (how such views were read
before, and still are when strides do not nest), in one process.

Views as models make them: the second half of the last dim (rotary embeddings), one
part of a fused qkv projection (`chunk(3, -1)`), one of `unbind`'s parts of a
transposed (batch, seq, 2, heads, dim) tensor, a column, and overlapping windows
(`unfold`: audio frames, 3x3 image patches), read as a stack of strided slices. Needs
only JAX and numpy
(strided.py is loaded from its file, without torch), so it also runs on a TPU VM.

Run: python benchmarks/bench_views.py [--repeats N]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

_SPEC = importlib.util.spec_from_file_location(
    "strided", Path(__file__).parents[1] / "src" / "torch_tpu" / "strided.py"
)
strided = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(strided)

F32 = jnp.dtype(jnp.float32)
jax.config.update("jax_enable_x64", True)  # as torch_tpu runs JAX: 64-bit indices


def views() -> dict:
    b, h, s, d = 8, 16, 1024, 128
    n, e = b * h * s * d, h * d
    return {  # name: (storage numel, shape, strides, offset)
        "x[..., d/2:] (rotary)": (n, (b, h, s, d // 2), (h * s * d, s * d, d, 1), d // 2),
        "qkv.chunk(3, -1)[1]": (3 * n, (b, s, e), (s * 3 * e, 3 * e, 1), e),
        "kv.unbind(2)[1]": (2 * n, (b, h, s, d), (s * 2 * e, d, 2 * e, 1), e),
        "x[:, 0] column": (4096 * 1024, (4096,), (1024,), 0),
        # overlapping windows: a stack of strided slices (`strided._stacked`)
        "audio.unfold(-1, 400, 160)": (16 * 160_000, (16, 998, 400), (160_000, 160, 1), 0),
        "img.unfold(2,3,1).unfold(3,3,1)": (
            8 * 64 * 56 * 56, (8, 64, 54, 54, 3, 3), (64 * 56 * 56, 56 * 56, 56, 1, 56, 1), 0,
        ),
    }


def timed(fn, arg, repeats: int) -> float:
    jax.block_until_ready(fn(arg))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(arg))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    print(f"device: {jax.devices()[0].device_kind}")
    print(f"{'view':<24}{'grid slice ms':>15}{'gather ms':>12}{'gather / slice':>16}")
    for name, (numel, shape, strides, offset) in views().items():
        view = strided.View(shape, strides, offset, F32, numel, F32)
        flat = jnp.arange(numel, dtype=jnp.float32)
        sliced = jax.jit(lambda f, v=view: strided.read(f, v) * 2)
        gathered = jax.jit(lambda f, v=view: f[strided._indices(v)] * 2)
        assert bool(jnp.array_equal(sliced(flat), gathered(flat)))
        t_slice, t_gather = timed(sliced, flat, args.repeats), timed(gathered, flat, args.repeats)
        ratio = t_gather / t_slice
        print(f"{name:<24}{t_slice * 1e3:>15.3f}{t_gather * 1e3:>12.3f}{ratio:>15.1f}x")


if __name__ == "__main__":
    main()
