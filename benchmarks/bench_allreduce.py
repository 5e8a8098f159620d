"""all_reduce bandwidth: tpu_dist (XLA collectives on tpu tensors) next to PyTorch's gloo
on CPU tensors, 2 processes, 1 MB to 256 MB float32. Ratios from one run.

    python benchmarks/bench_allreduce.py        # launches its 2 processes with torchrun
    python benchmarks/bench_allreduce.py --latency   # per-call cost of small collectives

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
    fixed cost: the call's set-up, its mismatch check and the round trip)."""
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
            tpu_ms = median_ms(lambda fn=fn: (fn(), torch.tpu.synchronize()))
            gloo_ms = median_ms(lambda t=on_cpu: dist.all_reduce(t, group=gloo))
            jax_ms = median_ms(_jax_psum(n))
            if rank == 0:
                print(f"{name:>26} {tpu_ms:>12.3f} {gloo_ms:>8.3f} {jax_ms:>12.3f}", flush=True)


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
