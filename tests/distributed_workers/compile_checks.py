"""torch.compile with functional collectives inside the graph, on every rank (see worker.py).

Each compiled function is compared with the same function run eagerly on the same
ranks (and, where short, with a CPU reference), and `torch_tpu.metrics` must show
that its graphs ran as compiled segments with the collectives between them, never
op by op in eager."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn

from torch_tpu import metrics


def _data(rank: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(200 + rank))


def _counted(run) -> dict:
    """Run `run` with fresh metrics; its counters, once no graph ran op by op."""
    metrics.reset()
    run()
    counts = metrics.snapshot()
    assert counts.get("compiled_graphs_run_eagerly", 0) == 0, counts
    return counts


def _close(compiled, eager, **kw) -> None:
    assert compiled.device.type == "tpu", compiled.device
    torch.testing.assert_close(compiled.detach().cpu(), eager.detach().cpu(), **kw)


def _matches_on_every_rank(
    compiled: list[torch.Tensor], eager: list[torch.Tensor], world: int
) -> None:
    for c, e in zip(compiled, eager):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6)
    # every rank ends with the same parameters: the gradients were averaged
    gathered = [torch.zeros_like(eager[0]).to("tpu") for _ in range(world)]
    dist.all_gather(gathered, compiled[0].to("tpu"))
    for other in gathered:
        torch.testing.assert_close(other.cpu(), compiled[0])


def run(check, rank: int, world: int) -> None:
    group = dist.group.WORLD
    everyone = [_data(r, 6, 4) for r in range(world)]
    weight = _data(99, 4, 5)

    @check("compiled_compute_all_reduce_compute")
    def _():
        def f(x, w):
            y = torch.relu(x @ w)
            y = funcol.all_reduce(y, "sum", group)
            return (y * 2).sum(0) + x.sum()

        x, w = everyone[rank].to("tpu"), weight.to("tpu")
        eager = f(x, w)
        compiled = torch.compile(f, backend="tpu")
        counts = _counted(lambda: _close(compiled(x, w), eager))
        # compute, then the all_reduce, then compute: two segments per call
        assert counts["compiled_graph_calls"] == 2, counts
        assert counts["compiled_graph_collectives"] == 1, counts
        total = sum(torch.relu(e @ weight) for e in everyone)
        _close(eager, (total * 2).sum(0) + everyone[rank].sum())
        counts = _counted(lambda: _close(compiled(x + 1, w), f(x + 1, w)))
        assert counts.get("compiles: graph", 0) == 0, counts  # the executables are reused
        # a new shape: Dynamo's dynamic graph, specialised and split per shape
        counts = _counted(lambda: _close(compiled(x[:4], w), f(x[:4], w)))
        assert counts["compiled_graph_calls"] == 2, counts

    @check("compiled_collective_mix")
    def _():
        def f(x):
            gathered = funcol.all_gather_single(x * 2, 1, group)  # dim 1: compute after
            scattered = funcol.reduce_scatter_single(x.exp(), "sum", 0, group)
            averaged = funcol.all_reduce(x.t(), "avg", group)  # a view of the input
            sent = funcol.broadcast(gathered.sin(), 1, group)  # after compute on a result
            swapped = funcol.all_to_all_single(x + 1, None, None, group)
            return gathered.sum(1), scattered * 3, averaged.cos(), sent + 1, swapped

        x = everyone[rank].to("tpu")
        eager = f(x)
        compiled = torch.compile(f, backend="tpu")
        counts = _counted(
            lambda: [_close(c, e, rtol=1e-5, atol=1e-5) for c, e in zip(compiled(x), eager)]
        )
        assert counts["compiled_graph_collectives"] == 5, counts
        # x*2, exp, x+1 | all_gather, reduce_scatter, all_reduce, all_to_all | sin ...
        # | broadcast | +1: three segments (light compute is not held back to overlap
        # a collective; see split._heavy)
        assert counts["compiled_graph_calls"] == 3, counts
        full = torch.cat(everyone)
        _close(eager[0], torch.cat([2 * e for e in everyone], 1).sum(1))
        _close(eager[1], sum(e.exp() for e in everyone)[3 * rank : 3 * rank + 3] * 3)
        _close(eager[2], (full.reshape(world, 6, 4).mean(0).t()).cos())
        _close(eager[4], torch.cat([e[3 * rank : 3 * rank + 3] + 1 for e in everyone]))

    @check("compiled_backward_through_all_reduce")
    def _():
        def loss_fn(x, w):  # a row-parallel layer: each rank holds a slice of the weight
            y = funcol.all_reduce(x @ w, "sum", group)
            return (y.tanh() ** 2).sum()

        x = everyone[rank].to("tpu")
        w_eager = _data(10 + rank, 4, 3).to("tpu").requires_grad_()
        loss_fn(x, w_eager).backward()
        w = w_eager.detach().clone().requires_grad_()
        compiled = torch.compile(loss_fn, backend="tpu")

        def step():
            loss = compiled(x, w)
            loss.backward()
            _close(loss, loss_fn(x, w_eager.detach()))

        counts = _counted(step)
        _close(w.grad, w_eager.grad, rtol=1e-5, atol=1e-5)
        # forward: x@w | all_reduce | tanh...; backward: ... | all_reduce | mm
        assert counts["compiled_graph_calls"] == 4, counts
        assert counts["compiled_graph_collectives"] == 2, counts

    @check("compiled_ddp_like_training_step")
    def _():
        def train(compiled: bool) -> list[torch.Tensor]:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)).to("tpu")
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
            x, y = everyone[rank].to("tpu"), everyone[rank][:, :2].to("tpu")

            def loss_fn():
                return nn.functional.mse_loss(model(x), y)

            def sync_and_step():  # DDP's gradient averaging, then the optimizer
                for p in model.parameters():
                    p.grad.copy_(funcol.all_reduce(p.grad, "avg", group))
                opt.step()

            if compiled:
                loss_fn = torch.compile(loss_fn, backend="tpu")
                sync_and_step = torch.compile(sync_and_step, backend="tpu")
            for _ in range(3):
                opt.zero_grad()
                loss_fn().backward()
                sync_and_step()
            return [p.detach().cpu() for p in model.parameters()]

        eager = train(compiled=False)
        counts = _counted(lambda: _matches_on_every_rank(train(compiled=True), eager, world))
        # one all_reduce per parameter and step, inside the compiled step
        assert counts["compiled_graph_collectives"] == 3 * 4, counts

    @check("compute_written_after_a_collective_runs_while_it_is_in_flight")
    def _():
        def f(x, w):
            first = funcol.all_reduce(torch.tanh(x @ w), "sum", group)
            second = funcol.all_reduce(torch.sin(x @ (w * 2)), "sum", group)  # independent
            return first + second

        x, w = everyone[rank].to("tpu"), weight.to("tpu")
        eager = f(x, w)
        compiled = torch.compile(f, backend="tpu")
        counts = _counted(lambda: _close(compiled(x, w), eager))
        # x@w, tanh | first issued | x@(2w), sin | second issued | add: the second
        # matmul runs while the first all_reduce is in flight, not before it (which
        # would be 2 segments, both all_reduces issued after both matmuls)
        assert counts["compiled_graph_calls"] == 3, counts
        assert counts["compiled_graph_collectives"] == 2, counts
        expected = sum(torch.tanh(e @ weight) + torch.sin(e @ (weight * 2)) for e in everyone)
        _close(eager, expected)

    @check("compiled_tensor_parallel_block")
    def _():
        """A DTensor column/row-parallel MLP under torch.compile: its graphs take the
        DeviceMesh as an opaque input (passed through to rebuild DTensors) and run
        compiled, with the collectives between segments; loss and gradients equal the
        same parallelized model run eagerly."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh("tpu", (world,))

        def model() -> nn.Module:
            torch.manual_seed(0)
            mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4)).to("tpu")
            return parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})

        x = everyone[0].to("tpu")  # tensor parallelism: every rank sees the same batch
        eager, compiled = model(), model()
        step = torch.compile(lambda m: (m(x) ** 2).mean(), backend="tpu")
        want = (eager(x) ** 2).mean()
        want.backward()

        def run_compiled():
            got = step(compiled)
            got.backward()
            _close(got, want, rtol=1e-5, atol=1e-6)

        counts = _counted(run_compiled)
        # the row-parallel output's all_reduce, in the forward graph's middle (x needs
        # no gradient, so the backward needs none); none of the graphs ran op by op
        assert counts["compiled_graph_collectives"] == 1, counts
        assert counts["compiled_graph_calls"] == 3, counts
        for p, q in zip(compiled.parameters(), eager.parameters()):
            _close(p.grad.full_tensor(), q.grad.full_tensor(), rtol=1e-5, atol=1e-6)
