"""all_reduce bandwidth: tpu_dist (XLA collectives on tpu tensors) next to PyTorch's gloo
on CPU tensors, 2 processes, 1 MB to 256 MB float32. Ratios from one run.

    python benchmarks/bench_allreduce.py        # launches its 2 processes with torchrun
    python benchmarks/bench_allreduce.py --latency   # per-call cost of small collectives
    python benchmarks/bench_allreduce.py --overlap   # collectives in flight under compute

Algorithm bandwidth = bytes of the tensor / time of one synchronous all_reduce
(the best of a few repetitions; both backends are timed in the same processes,
alternating, so a busy machine affects both alike). A third column is the
substrate's own limit: the same all-reduce written directly in JAX (a jitted
psum over the same 2-process mesh), with no torch_tpu in the path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

SIZES_MB = (1, 4, 16, 64, 256)
REPEATS = 5
LATENCY_SIZES = (1, 1024, 65536)  # float32 elements
LATENCY_CALLS = 200


def _best(fn, barrier) -> float:
    fn()  # compile / warm up
    times = []
    for _ in range(REPEATS):
        barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def latency(gloo, barrier) -> None:
    """Median wall time of one synchronous small collective, after its first call (the
    fixed cost: the call's set-up, its mismatch check and the round trip). A synchronous
    tpu_dist call returns with its result computed (its wait polls the outputs ready), as
    gloo's does, so neither is followed by a device synchronize."""
    import statistics

    import torch
    import torch.distributed as dist

    rank = dist.get_rank()

    def median_ms(fn) -> float:
        fn()  # compile / warm up
        barrier()
        times = []
        for _ in range(LATENCY_CALLS):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    if rank == 0:
        print(f"{'collective':>26} {'tpu_dist ms':>12} {'gloo ms':>8} {'jax psum ms':>12}")
    for n in LATENCY_SIZES:
        on_tpu, on_cpu = torch.ones(n, device="tpu"), torch.ones(n)
        out_tpu = torch.empty(2 * n, device="tpu")
        cases = {
            f"all_reduce {4 * n}B": lambda t=on_tpu: dist.all_reduce(t),
            f"all_gather_into {4 * n}B": lambda o=out_tpu, t=on_tpu: (
                dist.all_gather_into_tensor(o, t)
            ),
        }
        for name, fn in cases.items():
            tpu_ms = median_ms(fn)
            gloo_ms = median_ms(lambda t=on_cpu: dist.all_reduce(t, group=gloo))
            jax_ms = median_ms(_jax_psum(n))
            if rank == 0:
                print(f"{name:>26} {tpu_ms:>12.3f} {gloo_ms:>8.3f} {jax_ms:>12.3f}", flush=True)


def overlap(barrier) -> None:
    """A compiled graph with two 16 MB all_reduces, each followed in program order by
    independent matmul chains, against its compute alone and its collectives alone
    (medians of 10 calls). Perfect overlap: graph = max(compute, collectives);
    none: their sum."""
    import statistics

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    a, b = torch.ones(2**22, device="tpu"), torch.ones(2**22, device="tpu")
    w = torch.randn(768, 768, device="tpu") / 30

    def chains():
        h, g = w, w
        for _ in range(6):
            h = torch.tanh(h @ w)
        for _ in range(6):
            g = torch.sin(g @ w)
        return h.sum() + g.sum()

    def graph():
        first = funcol.all_reduce(a * 2, "sum", group)
        h = w
        for _ in range(6):
            h = torch.tanh(h @ w)
        second = funcol.all_reduce(b * 3, "sum", group)
        g = w
        for _ in range(6):
            g = torch.sin(g @ w)
        return first.sum() + second.sum() + h.sum() + g.sum()

    def collectives():
        x, y = a * 2, b * 3
        dist.all_reduce(x)
        dist.all_reduce(y)
        return x.sum() + y.sum()

    def median_ms(fn) -> float:
        for _ in range(3):
            fn().cpu()
        times = []
        for _ in range(10):
            barrier()
            start = time.perf_counter()
            fn().cpu()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    both = median_ms(torch.compile(graph, backend="tpu"))
    compute = median_ms(torch.compile(chains, backend="tpu"))
    comm = median_ms(collectives)
    if dist.get_rank() == 0:
        print(
            f"compiled graph {both:.1f} ms; its compute alone {compute:.1f} ms; its "
            f"all_reduces alone {comm:.1f} ms; graph / (compute + all_reduces) "
            f"{both / (compute + comm):.2f} (1.0: no overlap; "
            f"{max(compute, comm) / (compute + comm):.2f}: full)"
        )


def bench() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="tpu_dist")
    gloo = dist.new_group(backend="gloo")
    rank = dist.get_rank()

    def barrier():
        dist.barrier(group=gloo)

    if "--latency" in sys.argv:
        latency(gloo, barrier)
        dist.destroy_process_group()
        return
    if "--overlap" in sys.argv:
        overlap(barrier)
        dist.destroy_process_group()
        return

    if rank == 0:
        print(
            f"{'size':>7} {'tpu_dist GB/s':>14} {'gloo GB/s':>10} {'jax psum GB/s':>14} "
            f"{'tpu_dist/gloo':>14} {'tpu_dist/jax':>13}"
        )
    for mb in SIZES_MB:
        n = mb * 2**20 // 4
        on_tpu = torch.ones(n, device="tpu")
        on_cpu = torch.ones(n)

        def tpu_step(t=on_tpu):
            dist.all_reduce(t)
            torch.tpu.synchronize()

        tpu_s = _best(tpu_step, barrier)
        gloo_s = _best(lambda t=on_cpu: dist.all_reduce(t, group=gloo), barrier)
        jax_s = _best(_jax_psum(n), barrier)
        if rank == 0:
            gb = mb / 1024
            print(
                f"{mb:>5}MB {gb / tpu_s:>14.2f} {gb / gloo_s:>10.2f} {gb / jax_s:>14.2f} "
                f"{gloo_s / tpu_s:>14.2f} {jax_s / tpu_s:>13.2f}",
                flush=True,
            )
    dist.destroy_process_group()


def _jax_psum(n: int):
    """A synchronous all-reduce of n float32 per process written directly in JAX."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    psum = jax.jit(
        jax.shard_map(lambda x: jax.lax.psum(x, "x"), mesh=mesh, in_specs=P("x"), out_specs=P("x"))
    )
    local = jax.device_put(jnp.ones((n,), jnp.float32), jax.local_devices()[0])
    x = jax.make_array_from_single_device_arrays((n * jax.process_count(),), sharding, [local])
    return lambda: psum(x).block_until_ready()


if __name__ == "__main__":
    if "RANK" in os.environ:
        bench()
    else:
        env = {**os.environ, "TORCH_TPU_PLATFORM": os.environ.get("TORCH_TPU_PLATFORM", "cpu")}
        sys.exit(
            subprocess.call(
                [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc-per-node",
                    "2",
                    __file__,
                    *sys.argv[1:],
                ],
                env=env,
            )
        )
