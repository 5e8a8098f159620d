"""Where the host's time goes: cProfile of strict `a + b` (64x64) and of compile_step's
gpt_small step, the functions that cost most by their own time, per call; and that
step in parts (its executable, our Python, the loss's read).

For a machine where a figure is far from its floor for reasons this repo's machine does
not show (a TPU VM's host: docs/on_tpu.md), so one run there says which part of the
Python or which JAX entry point is slow.

Before the profiles, the parts of one strict `a + b` timed alone (no profiler): PyTorch's
dispatch to a Python kernel, the executor's fast-path steps, its executable called
directly, making the result tensor, and JAX's own jitted and ahead-of-time add beside
them, so the sum of the parts shows which one a slow host pays for.

Run: python benchmarks/profile_host.py [--top 20]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import jax
import torch

import torch_tpu
from torch_tpu.engine import executor, fastpath
from torch_tpu.engine.executor import device_value
from torch_tpu.tensor import Fresh

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its siblings
from bench_strict import best_per_call  # noqa: E402  (and its passthrough op)


def _profile(label: str, fn, calls: int, top: int) -> None:
    for _ in range(20):  # compiled, cached, fast paths built
        fn()
    torch.tpu.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        fn()
    torch.tpu.synchronize()
    profile.disable()
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    print(f"== {label}: {stats.total_tt / calls * 1e6:.1f} us per call under the profiler")
    stats.sort_stats("tottime").print_stats(top)
    for line in out.getvalue().splitlines():
        if line.strip() and not line.startswith(("   Ordered", "   List reduced")):
            print(line)


def _parts(a: torch.Tensor, b: torch.Tensor) -> None:
    """Microseconds of each part of a repeat strict `a + b`, each timed alone."""
    with torch.tpu.set_eager_mode("strict"):
        for _ in range(20):
            a + b
        torch.tpu.synchronize()
        spec, entry = next(
            (key[0], e)
            for key, e in fastpath._FAST.items()
            if key[0].schema.name == "aten::add.Tensor"
        )
        values = spec.schema.bind((a, b), {})
        _, storages, dynamic = fastpath.signature(spec, values)
        arrays = tuple(s.array() for s in storages)
        ja, jb = device_value(a), device_value(b)
        jadd = jax.jit(lambda x, y: x + y)
        aot = jadd.lower(ja, jb).compile()
        fresh = Fresh((64, 64), torch.float32, None)
        passthrough = torch.ops.torch_tpu_bench.passthrough  # (bench_strict defines it)
        parts = {
            "a + b (all of it)": lambda: a + b,
            "PyTorch's dispatch to a Python kernel": lambda: passthrough(a, b),
            "executor.run": lambda: executor.run(spec, (a, b), {}),
            "  schema.bind": lambda: spec.schema.bind((a, b), {}),
            "  fastpath.signature": lambda: fastpath.signature(spec, values),
            "  the plain call (executable + result tensor)": lambda: entry.plain(storages, dynamic),
            "    our executable, called alone": lambda: entry.fn(arrays, (), ()),
            "    making the result tensor": lambda: fresh.make(ja),
            "floor: JAX's add, its result made a tensor": lambda: fresh.make(jadd(ja, jb)),
            "JAX: jax.jit(add)(x, y)": lambda: jadd(ja, jb),
            "JAX: the same, compiled ahead of time": lambda: aot(ja, jb),
        }
        times = {name: best_per_call(fn, 5, 2000) * 1e6 for name, fn in parts.items()}
        torch.tpu.synchronize()
    print("== strict a + b, 64x64: each part alone, us per call (best of 5)")
    for name, us in times.items():
        print(f"  {name:48s} {us:8.1f}")


def _host_per_step(label: str, step, steps: int = 100) -> None:
    """Wall and calling-thread CPU time per step (each step waits for its loss): where
    the thread time is most of the wall time, the step is bound by the host."""
    for _ in range(5):
        step()
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        step()
    wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
    per_step = f"{wall / steps * 1e3:.2f} ms per step"
    print(f"== {label}: {per_step}, {cpu / steps * 1e3:.2f} ms of it the host thread's CPU")


def _step_parts(step, inputs, targets) -> None:
    """compile_step's step in parts, ms (best of rounds): all of it, waited for by its
    loss's `.item()`; its executable's call and wait alone; our Python alone (the
    executable replaced by one returning its last results, written buffers passed
    through: nothing computes, nothing is donated); `.item()` of a loss already
    computed. On a host where the executable's part equals JAX's step, the rest is ours."""
    from torch_tpu.engine import device_asserts
    from torch_tpu.tensor import storage_of

    graph = list(step._programs.values())[-1].graph
    key = next(iter(graph.executables))
    executable, written_slots, donated_slots = graph.executables[key]
    last = {}

    def waited(*arrays):
        start = time.perf_counter()
        result = executable(*arrays)
        jax.block_until_ready(result)
        last["call"] = min(last.get("call", 1.0), time.perf_counter() - start)
        last["result"] = result
        return result

    def replayed(*arrays):  # (the written buffers: this call's own, as the real one's)
        return tuple([arrays[slot] for slot in written_slots]), last["result"][1]

    def item_alone():
        loss = step(inputs, targets)
        jax.block_until_ready((storage_of(loss).value, device_asserts.flag_storage().value))
        start = time.perf_counter()
        loss.item()
        return time.perf_counter() - start

    whole = best_per_call(lambda: step(inputs, targets).item(), 7, 20)
    item = min(item_alone() for _ in range(50))
    graph.executables[key] = (waited, written_slots, donated_slots)
    for _ in range(50):
        step(inputs, targets).item()
    graph.executables[key] = (replayed, written_slots, donated_slots)
    python = best_per_call(lambda: step(inputs, targets), 7, 100)
    graph.executables[key] = (executable, written_slots, donated_slots)
    print("== compile_step, gpt_small, in parts, ms")
    for name, seconds in [
        ("the whole step, waited for by .item()", whole),
        ("its executable's call and wait", last["call"]),
        ("our Python around the call (nothing computed)", python),
        (".item() of a computed loss (device-check flag included)", item),
    ]:
        print(f"  {name:58s} {seconds * 1e3:8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    print(f"platform: {torch_tpu.platform.platform()}")
    a, b = torch.randn(64, 64, device="tpu"), torch.randn(64, 64, device="tpu")
    _parts(a, b)
    with torch.tpu.set_eager_mode("strict"):
        _profile("strict a + b, 64x64", lambda: a + b, 3000, args.top)

    from bench_step import gpt_parts

    model, opt, inputs, targets, loss_fn = gpt_parts("gpt_small", "tpu")
    step = torch_tpu.compile_step(model, opt, loss_fn)
    _host_per_step("compile_step, gpt_small", lambda: step(inputs, targets).item())
    from bench_step import jax_step

    _host_per_step("the same step in JAX, jitted whole, state donated", jax_step("gpt_small", []))
    _step_parts(step, inputs, targets)
    _profile("compile_step, gpt_small", lambda: step(inputs, targets), 200, args.top)


if __name__ == "__main__":
    main()
