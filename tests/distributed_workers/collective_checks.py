"""Collective checks run on every rank of a tpu_dist job (see worker.py).

Every expected value is computed on the CPU from what each rank contributes:
rank r contributes `_data(r, shape)`."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def _data(rank: int, shape, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-5, 6, shape, generator=g).to(dtype)


def _same(actual, expected, **kw) -> None:
    assert actual.device.type == "tpu", actual.device
    torch.testing.assert_close(actual.cpu(), expected, **kw)


def run(check, rank: int, world: int) -> None:
    everyone = [_data(r, (3, 4)) for r in range(world)]
    mine = everyone[rank]

    reductions = {
        "SUM": lambda ts: torch.stack(ts).sum(0),
        "AVG": lambda ts: torch.stack(ts).mean(0),
        "MAX": lambda ts: torch.stack(ts).amax(0),
        "MIN": lambda ts: torch.stack(ts).amin(0),
        "PRODUCT": lambda ts: torch.stack(ts).prod(0),
    }
    for name, reference in reductions.items():

        @check(f"all_reduce_{name}")
        def _(name=name, reference=reference):
            x = mine.to("tpu")
            dist.all_reduce(x, getattr(dist.ReduceOp, name))
            _same(x, reference(everyone))

    for dtype in (torch.int64, torch.bfloat16, torch.bool, torch.float64):

        @check(f"all_reduce_{dtype}")
        def _(dtype=dtype):
            values = [_data(r, (5,), dtype) for r in range(world)]
            x = values[rank].to("tpu")
            dist.all_reduce(x, dist.ReduceOp.MAX)
            expected = torch.stack([v.to(torch.float64) for v in values]).amax(0).to(dtype)
            _same(x, expected)

    @check("all_reduce_async_and_view")
    def _():
        base = torch.zeros(4, 3).to("tpu")
        view = base.t()  # not contiguous: written back through its strides
        view.copy_(mine.to("tpu"))
        work = dist.all_reduce(view, async_op=True)
        assert work.wait()
        assert work.is_completed()
        _same(view, sum(everyone))
        _same(base, sum(everyone).t())
        assert work.get_future().value()[0] is view

    @check("broadcast_bit_exact")
    def _():
        src = world - 1
        special = torch.tensor([float("nan"), -0.0, float("inf"), 1e-45])
        x = (special if rank == src else torch.zeros(4)).to("tpu")
        dist.broadcast(x, src)
        got = x.cpu()
        assert got.view(torch.int32).tolist() == special.view(torch.int32).tolist(), got

    @check("broadcast_complex")
    def _():
        value = torch.tensor([1 + 2j, -3.5j], dtype=torch.complex64)
        x = (value if rank == 0 else torch.zeros(2, dtype=torch.complex64)).to("tpu")
        dist.broadcast(x, 0)
        _same(x, value)

    @check("reduce")
    def _():
        x = mine.to("tpu")
        dist.reduce(x, dst=0, op=dist.ReduceOp.SUM)
        _same(x, sum(everyone) if rank == 0 else mine)

    @check("all_gather")
    def _():
        outs = [torch.empty(3, 4).to("tpu") for _ in range(world)]
        dist.all_gather(outs, mine.to("tpu"))
        for o, e in zip(outs, everyone):
            _same(o, e)

    @check("all_gather_into_tensor")
    def _():
        out = torch.empty(world * 3, 4).to("tpu")
        dist.all_gather_into_tensor(out, mine.to("tpu"))
        _same(out, torch.cat(everyone))

    @check("reduce_scatter")
    def _():
        inputs = [e.to("tpu") for e in _data(rank, (world, 2, 2)).unbind(0)]
        out = torch.empty(2, 2).to("tpu")
        dist.reduce_scatter(out, inputs, op=dist.ReduceOp.SUM)
        expected = sum(_data(r, (world, 2, 2)) for r in range(world))[rank]
        _same(out, expected)

    for name in ("SUM", "AVG", "MAX"):

        @check(f"reduce_scatter_tensor_{name}")
        def _(name=name):
            out = torch.empty(2, 4).to("tpu")
            contributions = [_data(r, (2 * world, 4)) for r in range(world)]
            dist.reduce_scatter_tensor(
                out, contributions[rank].to("tpu"), op=getattr(dist.ReduceOp, name)
            )
            full = reductions[name](contributions)
            _same(out, full[2 * rank : 2 * rank + 2])

    @check("all_to_all_single_even")
    def _():
        x = torch.arange(world * 2, dtype=torch.float32) + 100 * rank
        out = torch.empty(world * 2).to("tpu")
        dist.all_to_all_single(out, x.to("tpu"))
        expected = torch.cat(
            [(torch.arange(world * 2) + 100 * r)[2 * rank : 2 * rank + 2] for r in range(world)]
        )
        _same(out, expected.float())

    @check("all_to_all_single_uneven")
    def _():
        # rank r sends r + j + 1 rows (of 3) to rank j
        def rows(r, j):
            return torch.full((r + j + 1, 3), float(10 * r + j))

        x = torch.cat([rows(rank, j) for j in range(world)])
        recv = [r + rank + 1 for r in range(world)]
        out = torch.empty(sum(recv), 3).to("tpu")
        dist.all_to_all_single(
            out,
            x.to("tpu"),
            output_split_sizes=recv,
            input_split_sizes=[rank + j + 1 for j in range(world)],
        )
        _same(out, torch.cat([rows(r, rank) for r in range(world)]))

    @check("all_to_all_list")
    def _():
        inputs = [torch.full((j + 1,), float(rank * 10 + j)).to("tpu") for j in range(world)]
        outputs = [torch.empty(rank + 1).to("tpu") for _ in range(world)]
        dist.all_to_all(outputs, inputs)
        for r, o in enumerate(outputs):
            _same(o, torch.full((rank + 1,), float(r * 10 + rank)))

    @check("gather")
    def _():
        outs = [torch.empty(3, 4).to("tpu") for _ in range(world)] if rank == 0 else None
        dist.gather(mine.to("tpu"), outs, dst=0)
        if rank == 0:
            for o, e in zip(outs, everyone):
                _same(o, e)

    @check("scatter")
    def _():
        chunks = [torch.full((2,), float(j) + 0.5) for j in range(world)]
        out = torch.empty(2).to("tpu")
        dist.scatter(out, [c.to("tpu") for c in chunks] if rank == 1 else None, src=1)
        _same(out, chunks[rank])

    @check("send_recv")
    def _():
        value = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        if rank == 0:
            dist.send(value.to("tpu"), dst=1)
            back = torch.empty(2, 3).to("tpu")
            dist.recv(back, src=1)
            _same(back, value * 2)
        elif rank == 1:
            got = torch.empty(2, 3).to("tpu")
            dist.recv(got, src=0)
            dist.send(got * 2, dst=0)

    @check("barrier_and_objects")
    def _():
        dist.barrier()
        gathered = [None] * world
        dist.all_gather_object(gathered, {"rank": rank})
        assert gathered == [{"rank": r} for r in range(world)], gathered
        objects = [f"from {rank}"]
        dist.broadcast_object_list(objects, src=0)
        assert objects == ["from 0"], objects

    @check("mismatched_shapes_raise_then_group_works")
    def _():
        try:
            dist.all_reduce(torch.ones(3 + rank).to("tpu"))
            raise AssertionError("mismatched shapes did not raise")
        except dist.DistBackendError as e:
            assert "mismatched" in str(e) and "float32[3]" in str(e) and "float32[4]" in str(e)
        x = mine.to("tpu")
        dist.all_reduce(x)
        _same(x, sum(everyone))

    @check("mismatched_dtypes_raise")
    def _():
        dtype = torch.float32 if rank == 0 else torch.int32
        try:
            dist.all_reduce(torch.ones(4, dtype=dtype).to("tpu"))
            raise AssertionError("mismatched dtypes did not raise")
        except dist.DistBackendError as e:
            assert "int32[4]" in str(e) and "float32[4]" in str(e), e

    # Calls whose inputs fit programs.ENVELOPE_BYTES travel with their signature in one
    # all-gather; larger ones run a second, guarded collective. These cross the line.
    @check("collectives_on_both_sides_of_the_envelope")
    def _():
        from torch_tpu.distributed import programs

        fits = (programs.ENVELOPE_BYTES - 8) // 4  # float32 values beside the signature
        for n in (fits, fits + 1, 4 * fits):
            values = [_data(r, (world * n,)) for r in range(world)]
            x = values[rank].to("tpu")
            dist.all_reduce(x)
            _same(x, sum(values), msg=f"all_reduce of {n * world}")
            x = values[rank][:n].to("tpu")
            dist.all_reduce(x, dist.ReduceOp.MAX)
            _same(x, torch.stack([v[:n] for v in values]).amax(0), msg=f"max of {n}")
            out = torch.empty(world * n).to("tpu")
            dist.all_gather_into_tensor(out, values[rank][:n].to("tpu"))
            _same(out, torch.cat([v[:n] for v in values]), msg=f"all_gather of {n}")
            out = torch.empty(n).to("tpu")
            dist.reduce_scatter_tensor(out, values[rank].to("tpu"))
            _same(out, sum(values)[rank * n : (rank + 1) * n], msg=f"reduce_scatter {n}")
            x = values[rank][:n].to("tpu")
            dist.broadcast(x, world - 1)
            _same(x, values[world - 1][:n], msg=f"broadcast of {n}")
            flags = [_data(r, (n,), torch.bool) for r in range(world)]
            x = flags[rank].to("tpu")
            dist.all_reduce(x, dist.ReduceOp.MAX)
            _same(x, torch.stack(flags).any(0), msg=f"bool max of {n}")

    @check("mismatch_across_the_envelope_raises_then_group_works")
    def _():
        from torch_tpu.distributed import programs

        n = 3 if rank == 0 else programs.ENVELOPE_BYTES  # one fits, the other does not
        try:
            dist.all_reduce(torch.ones(n).to("tpu"))
            raise AssertionError("mismatched sizes did not raise")
        except dist.DistBackendError as e:
            assert "mismatched" in str(e) and "float32[3]" in str(e), e
        x = mine.to("tpu")
        dist.all_reduce(x)
        _same(x, sum(everyone))

    @check("async_collectives_do_not_wait_for_late_peers")
    def _():
        from torch_tpu.distributed import programs

        big = [_data(r, (programs.ENVELOPE_BYTES,)) for r in range(world)]  # not in the envelope
        for values in (everyone, big):
            x = values[rank].to("tpu")
            dist.barrier()
            if rank == world - 1:
                time.sleep(4)  # the others issue theirs while this rank is away
            start = time.monotonic()
            work = dist.all_reduce(x, async_op=True)
            issued = time.monotonic() - start
            work.wait()
            _same(x, sum(values))
            if rank != world - 1:
                # (a wait would be the peer's 4 s; the issue itself, a first compile on
                # a loaded 2-core machine, took 1.05 s once)
                assert issued < 2.0, f"all_reduce{list(x.shape)} waited {issued:.2f} s for a peer"

    @check("every_program_is_above_xla_cpus_inline_threshold")
    def _():
        # XLA:CPU runs a program under INLINE_FLOPS_BELOW inside the dispatching call, where
        # a peer that never joins would block the caller past the timeout.
        import jax
        import jax.numpy as jnp

        from torch_tpu.distributed import programs
        from torch_tpu.distributed.mesh import sharding

        ranks = tuple(range(world))
        params = {
            "all_reduce": ("max",),
            "broadcast": (0,),
            "reduce_scatter": ("sum",),
            "scatter": (0,),
            "permute": (0, 1),
        }
        for kind in programs.BODIES:
            for n, dtype in ((world, jnp.int8), (world * 4096, jnp.float32)):
                spec = jax.ShapeDtypeStruct((world * n,), dtype, sharding=sharding(ranks))
                program = programs._program(kind, ranks, params.get(kind, ()), 1)
                flops = program.lower(spec).compile().cost_analysis()["flops"]
                assert flops >= programs.INLINE_FLOPS_BELOW, (kind, n, dtype, flops)

    @check("collectives_on_one_tensor_keep_their_order")
    def _():
        x = mine.to("tpu")
        first = dist.all_reduce(x, async_op=True)
        second = dist.all_reduce(x, async_op=True)  # reads the first's result
        out = torch.empty(world * 12).to("tpu")
        third = dist.all_gather_into_tensor(out, x.reshape(-1), async_op=True)
        third.wait()
        second.wait()
        first.wait()
        _same(x, world * sum(everyone))
        _same(out, torch.cat([world * sum(everyone).reshape(-1)] * world))

    @check("wrong_device_raises")
    def _():
        try:
            dist.all_reduce(torch.ones(2))
            raise AssertionError("a CPU tensor was accepted")
        except RuntimeError as e:
            assert "No backend type associated with device type cpu" in str(e), e

    @check("functional_collectives")
    def _():
        import torch.distributed._functional_collectives as funcol

        group = dist.group.WORLD
        x = mine.to("tpu")
        _same(funcol.all_reduce(x, "sum", group).wait(), sum(everyone))
        _same(funcol.all_gather_tensor(x, 0, group).wait(), torch.cat(everyone))
        big = torch.cat(everyone).to("tpu")
        _same(
            funcol.reduce_scatter_tensor(big, "sum", 0, group).wait(),
            (torch.cat(everyone) * world)[3 * rank : 3 * rank + 3],
        )
        y = torch.ops._c10d_functional.all_reduce(x, "max", group.group_name)
        y = torch.ops._c10d_functional.wait_tensor(y)
        _same(y, torch.stack(everyone).amax(0))
        _same(x, mine)  # the functional op left its input alone

    @check("dtensor")
    def _():
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        mesh = init_device_mesh("tpu", (world,))
        full = torch.arange(world * 8, dtype=torch.float32).reshape(world * 2, 4)
        d = distribute_tensor(full.to("tpu"), mesh, [Shard(0)])
        assert d.to_local().shape == (2, 4)
        _same(d.to_local(), full[2 * rank : 2 * rank + 2])
        _same(d.redistribute(mesh, [Replicate()]).to_local(), full)
        _same((d @ d.T.redistribute(mesh, [Replicate()])).full_tensor(), full @ full.T)


def run_subgroups(check, rank: int, world: int) -> None:
    """On 4 ranks: new_group subgroups and a 2x2 device mesh."""
    evens, odds = dist.new_group([0, 2]), dist.new_group([1, 3])

    @check("new_group_all_reduce")
    def _():
        group = evens if rank % 2 == 0 else odds
        x = torch.tensor([float(rank)]).to("tpu")
        dist.all_reduce(x, group=group)
        _same(x, torch.tensor([float(rank % 2 + rank % 2 + 2)]))

    @check("new_group_broadcast_group_src")
    def _():
        group = evens if rank % 2 == 0 else odds
        x = torch.tensor([float(rank)]).to("tpu")
        dist.broadcast(x, group_src=1, group=group)
        _same(x, torch.tensor([float(rank % 2 + 2)]))

    @check("device_mesh_2x2")
    def _():
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("tpu", (2, 2), mesh_dim_names=("dp", "tp"))
        row = torch.tensor([float(rank)]).to("tpu")
        dist.all_reduce(row, group=mesh.get_group("tp"))  # ranks {0,1} and {2,3}
        _same(row, torch.tensor([float(2 * (rank // 2) * 2 + 1)]))
        col = torch.tensor([float(rank)]).to("tpu")
        dist.all_reduce(col, group=mesh.get_group("dp"))  # ranks {0,2} and {1,3}
        _same(col, torch.tensor([float(2 * (rank % 2) + 2)]))

    @check("world_all_reduce_4")
    def _():
        x = torch.tensor([float(rank + 1)]).to("tpu")
        dist.all_reduce(x)
        _same(x, torch.tensor([10.0]))
