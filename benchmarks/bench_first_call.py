"""What a first call costs: compile time per new strict op shape, and cold first steps.

Every figure comes from a fresh process with an empty, private compilation
cache (a temporary TORCH_TPU_CACHE_DIR), in strict mode:

1. ~35 common ops, each called at shapes it has not seen: the wall time of each
   such call until its result exists (the call and a synchronize: strict mode
   records a first call while its compile runs on a worker thread, and runs it at
   the next read), median and p90, split into phases — PyTorch's meta kernel
   (`executor._meta_run`), the check of CPU's dtype refusals (`refusals.check`),
   JAX tracing, lowering to StableHLO, the cache key
   (program text + hash), the XLA compile, the disk write, and the rest
   (dispatch, layout, the key lookups). Timings are wall clock; CPU seconds of
   the process are shown beside them, since on a shared machine wall time
   mostly measures the neighbours.
2. The cold first training step (the step, its compiles, `.item()`, a synchronize) of a small
   CNN (`training.cnn`, batch 16, AdamW) and of gpt-small (`training.gpt_step_fn`),
   and beside gpt-small the substrate's own: the same step written in JAX, run op by
   op (a compile per primitive and shape, as strict mode's per op) and jitted whole.

Strict mode compiles first calls on `TORCH_TPU_COMPILE_THREADS` worker threads; the
phases of compiles that overlap add up to more than the wall time, and "rest" (the
wall time less the phases) can then be negative.

Targets (issue 12): median compile time per new op shape <= 20 ms (was ~113 ms);
cold first step of the small CNN / gpt-small <= 1/4 of what it was (19 s / 5.8 s).

Run: python benchmarks/bench_first_call.py [--shapes N] [--compare OTHER_SRC]
(--compare runs every child a second time against another checkout's `src`,
interleaved, so that before/after come from one run.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

PHASES = ("meta", "cpu refusals", "trace", "lower", "key", "xla compile", "disk write", "disk read")


# ------------------------------------------------------------------ child side


class PhaseClock:
    """Wraps the functions of each phase and adds up wall and CPU seconds per phase."""

    def __init__(self) -> None:
        self.wall: Counter = Counter()
        self.cpu: Counter = Counter()

    def install(self) -> None:
        from torch_tpu import cache
        from torch_tpu.engine import executor, refusals

        self._wrap(executor, "_meta_run", "meta")
        self._wrap(refusals, "check", "cpu refusals")
        for attr, phase in (
            ("_trace", "trace"),
            ("_lower", "lower"),
            ("_program_text", "key"),
            ("_key", "key"),
            ("_xla_compile", "xla compile"),
            ("_store", "disk write"),
            ("_load", "disk read"),
        ):
            if hasattr(cache, attr):
                self._wrap(cache, attr, phase)

    def _wrap(self, module, attr: str, phase: str) -> None:
        inner = getattr(module, attr)
        clock = self

        def timed(*args, **kwargs):
            w, c = time.perf_counter(), time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                clock.wall[phase] += time.perf_counter() - w
                clock.cpu[phase] += time.process_time() - c

        setattr(module, attr, timed)

    def take(self) -> tuple[dict, dict]:
        wall, cpu = dict(self.wall), dict(self.cpu)
        self.wall.clear()
        self.cpu.clear()
        return wall, cpu


def _op_cases():
    """(name, make inputs for shape index k, the call): each k gives new shapes."""
    import torch
    import torch.nn.functional as F

    def m(k):  # a fresh 2-D shape per k
        return (6 + k, 10 + 2 * k)

    def img(k):
        return (2, 3, 8 + k, 8 + k)

    def r(shape, dtype=torch.float32):
        return torch.randn(shape).to(dtype)

    return [
        ("add", lambda k: (r(m(k)), r(m(k))), lambda a, b: a + b),
        ("mul scalar", lambda k: (r(m(k)),), lambda a: a * 1.5),
        ("sub", lambda k: (r(m(k)), r(m(k))), lambda a, b: a - b),
        ("div", lambda k: (r(m(k)), r(m(k)).abs() + 1), lambda a, b: a / b),
        ("relu", lambda k: (r(m(k)),), torch.relu),
        ("gelu", lambda k: (r(m(k)),), F.gelu),
        ("exp", lambda k: (r(m(k)),), torch.exp),
        ("tanh", lambda k: (r(m(k)),), torch.tanh),
        ("sigmoid", lambda k: (r(m(k)),), torch.sigmoid),
        ("sqrt", lambda k: (r(m(k)).abs(),), torch.sqrt),
        ("pow", lambda k: (r(m(k)),), lambda a: a**2),
        ("clamp", lambda k: (r(m(k)),), lambda a: a.clamp(-0.5, 0.5)),
        ("where", lambda k: (r(m(k)), r(m(k))), lambda a, b: torch.where(a > 0, a, b)),
        ("sum dim", lambda k: (r(m(k)),), lambda a: a.sum(1)),
        ("mean", lambda k: (r(m(k)),), lambda a: a.mean()),
        ("amax", lambda k: (r(m(k)),), lambda a: a.amax(0)),
        ("argmax", lambda k: (r(m(k)),), lambda a: a.argmax(1)),
        ("cumsum", lambda k: (r(m(k)),), lambda a: a.cumsum(1)),
        ("softmax", lambda k: (r(m(k)),), lambda a: a.softmax(-1)),
        ("log_softmax", lambda k: (r(m(k)),), lambda a: a.log_softmax(-1)),
        ("mm", lambda k: (r(m(k)), r(m(k)[::-1])), torch.mm),
        ("bmm", lambda k: (r((2, *m(k))), r((2, *m(k)[::-1]))), torch.bmm),
        ("linear", lambda k: (r(m(k)), r((5, m(k)[1])), r((5,))), F.linear),
        ("conv2d", lambda k: (r(img(k)), r((4, 3, 3, 3))), lambda x, w: F.conv2d(x, w)),
        ("max_pool2d", lambda k: (r(img(k)),), lambda x: F.max_pool2d(x, 2)),
        (
            "layer_norm",
            lambda k: (r(m(k)),),
            lambda a: F.layer_norm(a, a.shape[-1:]),
        ),
        ("transpose+contiguous", lambda k: (r(m(k)),), lambda a: a.t().contiguous()),
        ("cat", lambda k: (r(m(k)), r(m(k))), lambda a, b: torch.cat([a, b], 1)),
        (
            "embedding",
            lambda k: (torch.randint(0, 20, (3, 4 + k)), r((20 + k, 8))),
            F.embedding,
        ),
        ("to float16", lambda k: (r(m(k)),), lambda a: a.half()),
        (
            "cross_entropy",
            lambda k: (r(m(k)), torch.randint(0, m(k)[1], (m(k)[0],))),
            F.cross_entropy,
        ),
        ("randn_like", lambda k: (r(m(k)),), torch.randn_like),
        ("randint_like", lambda k: (r(m(k)),), lambda a: torch.randint_like(a, 15, 100)),
        ("isclose", lambda k: (r(m(k)), r(m(k))), torch.isclose),
    ]


def child_ops(shapes: int) -> dict:
    import torch

    import torch_tpu

    # device start-up and PyTorch's one-time meta-kernel imports outside the timings
    (torch.ones(3, 3).to("tpu").neg().sum(0) * 2).cpu()
    clock = PhaseClock()
    clock.install()
    cases = _op_cases()
    calls = []
    for k in range(shapes):
        for name, make, fn in cases:
            inputs = [t.to("tpu") for t in make(k)]
            torch.tpu.synchronize()
            clock.take()
            compiles_before = torch_tpu.metrics.snapshot().get("compiles", 0)
            w, c = time.perf_counter(), time.process_time()
            out = fn(*inputs)
            # (until the result exists: a first call may be recorded while it compiles
            # on a worker thread, and run at the next read)
            torch.tpu.synchronize()
            wall, cpu = time.perf_counter() - w, time.process_time() - c
            phases_wall, phases_cpu = clock.take()
            compiles = torch_tpu.metrics.snapshot().get("compiles", 0) - compiles_before
            del out
            calls.append(
                dict(
                    name=name,
                    wall=wall,
                    cpu=cpu,
                    compiles=compiles,
                    phases_wall=phases_wall,
                    phases_cpu=phases_cpu,
                )
            )
    return dict(calls=calls)


def _cnn_step():
    import torch
    from torch import nn

    from torch_tpu.training import cnn

    torch.manual_seed(0)
    model = cnn().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, 16, 16, generator=g).to("tpu")
    y = torch.randint(0, 10, (16,), generator=g).to("tpu")

    def step():
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return step


def child_step(workload: str) -> dict:
    import torch

    import torch_tpu
    from torch_tpu.training import gpt_step_fn

    torch.zeros(1, device="tpu").cpu()
    clock = PhaseClock()
    clock.install()
    step = _cnn_step() if workload == "cnn" else gpt_step_fn("gpt_small", "tpu")[1]
    torch.tpu.synchronize()
    clock.take()
    torch_tpu.metrics.reset()
    w, c = time.perf_counter(), time.process_time()
    step().item()
    torch.tpu.synchronize()  # (the optimizer's update may still be recorded, compiling)
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    phases_wall, phases_cpu = clock.take()
    snap = torch_tpu.metrics.snapshot()
    return dict(
        wall=wall,
        cpu=cpu,
        compiles=snap.get("compiles", 0),
        ops=snap.get("ops_dispatched", 0),
        phases_wall=phases_wall,
        phases_cpu=phases_cpu,
    )


def child_jax_step(how: str) -> dict:
    """The substrate's own cold first step of gpt-small: the same model, loss and AdamW
    written in JAX (benchmarks/bench_step.py), op by op ("eager": each primitive
    compiled at its first shape, as strict mode compiles each op) or jitted whole."""
    sys.path.insert(0, str(Path(__file__).parent))
    import jax
    from bench_step import jax_train_step

    train_step, state, x, y = jax_train_step("gpt_small")
    jax.block_until_ready((state, x, y))
    fn = jax.jit(train_step) if how == "jit" else train_step
    w, c = time.perf_counter(), time.process_time()
    _, loss = fn(state, x, y)
    float(loss)
    return dict(wall=time.perf_counter() - w, cpu=time.process_time() - c)


# ----------------------------------------------------------------- parent side


def _jax_cases():
    """The substrate's own first call: the same kinds of op written in JAX, jitted at
    a shape it has not seen (the first call traces, lowers and compiles)."""
    import jax
    import jax.numpy as jnp

    return [
        ("add", 2, lambda a, b: a + b),
        ("mul scalar", 1, lambda a: a * 1.5),
        ("exp", 1, jnp.exp),
        ("tanh", 1, jnp.tanh),
        ("where", 2, lambda a, b: jnp.where(a > 0, a, b)),
        ("sum dim", 1, lambda a: a.sum(1)),
        ("softmax", 1, lambda a: jax.nn.softmax(a, -1)),
        ("transpose+contiguous", 1, lambda a: a.T.copy()),
        ("layer_norm", 1, lambda a: (a - a.mean(-1, keepdims=True)) * jax.lax.rsqrt(
            a.var(-1, keepdims=True) + 1e-5)),
    ]  # fmt: skip


def child_jax(shapes: int) -> dict:
    import jax
    import numpy as np

    jax.jit(lambda a: a + 1)(np.ones(3, np.float32)).block_until_ready()  # start-up
    calls = []
    for k in range(shapes):
        for name, arity, fn in _jax_cases():
            inputs = [np.random.randn(6 + k, 10 + 2 * k).astype(np.float32)] * arity
            w, c = time.perf_counter(), time.process_time()
            jax.jit(fn)(*inputs).block_until_ready()
            calls.append(dict(name=name, wall=time.perf_counter() - w, cpu=time.process_time() - c))
    return dict(calls=calls)


def print_jax(result: dict) -> None:
    wall = [c["wall"] * 1e3 for c in result["calls"]]
    names = list(dict.fromkeys(c["name"] for c in result["calls"]))
    print(
        f"[jax jit] the substrate's own first call at a new shape, {len(wall)} calls of "
        f"{', '.join(names)}: median {statistics.median(wall):.1f} ms, "
        f"p90 {_pct(wall, 0.9):.1f} ms"
    )


def run_child(src: str | None, what: list[str]) -> dict:
    """One child process with its own empty cache directory."""
    with tempfile.TemporaryDirectory() as cache_dir:
        os.chmod(cache_dir, 0o700)
        env = dict(os.environ, TORCH_TPU_CACHE_DIR=cache_dir, TORCH_TPU_EAGER_MODE="strict")
        root = Path(__file__).resolve().parent.parent
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (src or str(root / "src"), str(root), env.get("PYTHONPATH")) if p
        )
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.bench_first_call", "--child", *what],
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
            timeout=1800,
        )
    if out.returncode != 0:
        raise RuntimeError(f"child {what} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def print_ops(label: str, result: dict) -> None:
    calls = result["calls"]
    new = [c for c in calls if c["compiles"] > 0]
    wall = [c["wall"] * 1e3 for c in new]
    cpu = [c["cpu"] * 1e3 for c in new]
    print(
        f"[{label}] new op shapes: {len(new)} calls ({sum(c['compiles'] for c in new)} "
        f"compiles); per call median {statistics.median(wall):.1f} ms, p90 "
        f"{_pct(wall, 0.9):.1f} ms (CPU median {statistics.median(cpu):.1f} ms, "
        f"p90 {_pct(cpu, 0.9):.1f} ms)"
    )
    print_phases(new, len(new))
    # every call at a new shape, those that compiled nothing included (a shape in a
    # bucket already compiled, a data move served on the host: engine/host_moves.py)
    every = [c["wall"] * 1e3 for c in calls]
    print(
        f"  every call at a new shape: {len(calls)} calls, {len(calls) - len(new)} compiled "
        f"nothing; per call median {statistics.median(every):.1f} ms, p90 "
        f"{_pct(every, 0.9):.1f} ms"
    )
    by_op: dict[str, list[float]] = {}
    for c in calls:
        by_op.setdefault(c["name"], []).append(c["wall"] * 1e3)
    shown = ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in by_op.items())
    print(f"  per op, every call (median ms): {shown}")


def print_phases(records: list[dict], n: int) -> None:
    total_w = sum(r["wall"] for r in records)
    total_c = sum(r["cpu"] for r in records)
    parts = []
    known_w = known_c = 0.0
    for phase in PHASES:
        w = sum(r["phases_wall"].get(phase, 0.0) for r in records)
        c = sum(r["phases_cpu"].get(phase, 0.0) for r in records)
        known_w += w
        known_c += c
        parts.append(f"{phase} {w / n * 1e3:.1f} ({c / n * 1e3:.1f})")
    parts.append(f"rest {(total_w - known_w) / n * 1e3:.1f} ({(total_c - known_c) / n * 1e3:.1f})")
    print("  phases, mean ms per call, wall (CPU): " + ", ".join(parts))


def print_step(label: str, workload: str, result: dict) -> None:
    print(
        f"[{label}] cold first step, {workload}: {result['wall']:.2f} s "
        f"(CPU {result['cpu']:.2f} s), {result['compiles']} compiles, "
        f"{result['ops']} ops dispatched"
    )
    n = max(result["compiles"], 1)
    print_phases([result], n)
    print("    (phases per compile)")


HOWS = ("eager", "jit")


def print_jax_step(results: dict) -> None:
    print(
        "[jax] the substrate's own cold first step, gpt_small written in JAX: "
        + ", ".join(
            f"{how} {r['wall']:.2f} s (CPU {r['cpu']:.2f} s)" for how, r in results.items()
        )
        + " (eager: op by op, a compile per primitive and shape; jit: one program)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", type=int, default=3, help="new shapes per op")
    parser.add_argument("--compare", help="another checkout's src directory (the baseline)")
    parser.add_argument("--only", nargs="*", default=["ops", "cnn", "gpt_small"])
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        kind = args.child[0]
        if kind == "ops":
            result = child_ops(int(args.child[1]))
        elif kind == "jax":
            result = child_jax(int(args.child[1]))
        elif kind == "jax_step":
            result = child_jax_step(args.child[1])
        else:
            result = child_step(kind)
        print(json.dumps(result))
        return
    sources = [("this", None)] + ([("baseline", args.compare)] if args.compare else [])
    for what in args.only:
        for label, src in sources:
            if what == "ops":
                print_ops(label, run_child(src, ["ops", str(args.shapes)]))
                if label == "this":
                    print_jax(run_child(src, ["jax", str(max(args.shapes, 3))]))
            else:
                print_step(label, what, run_child(src, [what]))
                if what == "gpt_small" and label == "this":
                    print_jax_step({how: run_child(src, ["jax_step", how]) for how in HOWS})
    print(
        "targets: median per new op shape <= 20 ms (was ~113 ms); cold first step "
        "cnn / gpt_small <= 1/4 of before (issue: 19 s / 5.8 s)"
    )


if __name__ == "__main__":
    main()
