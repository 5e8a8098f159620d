"""Reading a view at a static storage offset against a run-time one, per call.

An eager op's program takes a view's storage offset at run time when the view
may move (`strided.geometry_may_move`), so that a loop over `x[i]` compiles one
program rather than one per i. This prints what that costs a call: the same
read (times 2) of a row, 16 rows, one element, a column and a quarter of the
columns of an n x n float32 storage, jitted with the offset static, passed as a
host scalar (a value seen for the first time) and as a device scalar (the eager
engine caches offsets seen twice as device scalars).

Needs JAX only (it loads `strided.py` by path), so it also runs on a machine
without torch: `python benchmarks/bench_offsets.py [--sizes 128 2048 4096]`.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

_PATH = Path(__file__).parent.parent / "src" / "torch_tpu" / "strided.py"
_SPEC = importlib.util.spec_from_file_location("strided", _PATH)
strided = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(strided)


def _best_us(fn, *args, calls: int = 100, rounds: int = 5) -> float:
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            result = fn(*args)
        result.block_until_ready()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def _cases(n: int) -> dict:
    return {  # name: (shape, strides, offset)
        "row x[i]": ((n,), (1,), 5 * n),
        "rows x[i:i+16]": ((16, n), (n, 1), 5 * n),
        "element": ((), (), 5 * n + 3),
        "column x[:, j]": ((n,), (n,), 7),
        "chunk x[:, a:b]": ((n, n // 4), (n, 1), n // 4),
    }


def compare(n: int) -> list[str]:
    store = jnp.arange(n * n, dtype=jnp.float32).reshape(n, n)
    rows = []
    for name, (shape, strides, offset) in _cases(n).items():
        view = strided.View(shape, strides, offset, jnp.float32, n * n, jnp.float32, (n, n))
        moving = view._replace(offset=strided.Offset(0))
        static = jax.jit(lambda x, v=view: strided.read(x, v) * 2)
        dynamic = jax.jit(lambda x, o, v=moving: strided.read_at(x, v, o) * 2)
        host, device = np.int64(offset), jax.device_put(np.int64(offset))
        assert np.array_equal(np.asarray(static(store)), np.asarray(dynamic(store, host)))
        times = (_best_us(static, store), _best_us(dynamic, store, host))
        times += (_best_us(dynamic, store, device),)
        movable = strided.geometry_may_move(shape, strides)
        rows.append(f"{name} {times[0]:.0f} / {times[1]:.0f} / {times[2]:.0f}"
                    + ("" if movable else " (kept static)"))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[128, 512, 2048, 4096])
    args = parser.parse_args()
    print(f"{jax.devices()[0].platform}; us per call: static / host-scalar offset / "
          "device-scalar offset")  # fmt: skip
    for n in args.sizes:
        print(f"n={n}: " + "; ".join(compare(n)), flush=True)


if __name__ == "__main__":
    main()
