"""Training checks on every rank of a tpu_dist job (see worker.py): DDP and FSDP2
against single-process training on the global batch, in strict and fused eager."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from torch_tpu.training import TinyGPT, mlp

STEPS = 3


def _mlp_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)


def _mlp_params(model, rank: int, world: int, parallel: bool) -> list[list[torch.Tensor]]:
    """Parameters after each SGD step; with `parallel`, this rank trains on its slice."""
    x, y = _mlp_batch()
    if parallel:
        x, y = x.chunk(world)[rank], y.chunk(world)[rank]
    x, y = x.to("tpu"), y.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    history = []
    for _ in range(STEPS):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        history.append([p.detach().cpu().clone() for p in model.parameters()])
    return history


def _gpt_losses(model, rank: int, world: int, parallel: bool) -> list[float]:
    """Global-batch loss after each SGD step (the mean of the ranks' local losses)."""
    g = torch.Generator().manual_seed(3)
    idx = torch.randint(0, 64, (4, 9), generator=g)
    if parallel:
        idx = idx.chunk(world)[rank]
    idx = idx.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        logits = model(idx[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 64), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        loss = loss.detach()
        if parallel:
            dist.all_reduce(loss, dist.ReduceOp.AVG)
        losses.append(loss.item())
    return losses


def _gpt() -> nn.Module:
    torch.manual_seed(0)
    return TinyGPT(vocab=64, d=32, heads=2, seq=8, layers=1)


def run(check, rank: int, world: int) -> None:
    for mode in ("strict", "fused"):

        @check(f"ddp_matches_single_process_{mode}")
        def _(mode=mode):
            from torch.nn.parallel import DistributedDataParallel as DDP

            with torch.tpu.set_eager_mode(mode):
                torch.manual_seed(0)
                reference = _mlp_params(mlp().to("tpu"), rank, world, parallel=False)
                torch.manual_seed(rank)  # DDP broadcasts rank 0's initial parameters
                model = DDP(mlp().to("tpu"))
                if rank:
                    torch.manual_seed(0)  # (rank 0 drew them with seed 0)
                got = _mlp_params(model, rank, world, parallel=True)
            for step, (g, r) in enumerate(zip(got, reference)):
                for p_got, p_ref in zip(g, r):
                    torch.testing.assert_close(
                        p_got, p_ref, rtol=1e-5, atol=1e-5, msg=lambda m, s=step: f"step {s}: {m}"
                    )

        @check(f"fsdp2_gpt_matches_single_process_{mode}")
        def _(mode=mode):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            with torch.tpu.set_eager_mode(mode):
                reference = _gpt_losses(_gpt().to("tpu"), rank, world, parallel=False)
                model = _gpt().to("tpu")
                mesh = init_device_mesh("tpu", (world,))
                for block in model.blocks:
                    fully_shard(block, mesh=mesh)
                fully_shard(model, mesh=mesh)
                local = [p.to_local() for p in model.parameters()]
                assert all(t.device.type == "tpu" for t in local)
                got = _gpt_losses(model, rank, world, parallel=True)
            torch.testing.assert_close(
                torch.tensor(got), torch.tensor(reference), rtol=1e-4, atol=1e-5
            )
            assert got[-1] < got[0], got
