"""DDP training on the tpu device with the tpu_dist backend.

    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py

Each process is one JAX controller of its device; gradients are averaged by
XLA collectives (gloo between processes on XLA:CPU, the interconnect on a TPU
pod). At the end rank 0 trains the same model on the global batch in one
process and checks that the parameters agree.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from torch_tpu.training import mlp


def batch(steps_seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(steps_seed)
    return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, log: bool):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if log:
            print(f"step {step}: local loss {loss.item():.4f}", flush=True)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    dist.init_process_group(backend="tpu_dist")  # before any tpu tensor: JAX starts here
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("tpu")

    torch.manual_seed(0)
    model = DDP(mlp().to(device))
    x, y = batch()
    train(
        model,
        x.chunk(world)[rank].to(device),
        y.chunk(world)[rank].to(device),
        args.steps,
        log=rank == 0,
    )

    if rank == 0:
        torch.manual_seed(0)
        single = train(mlp().to(device), x.to(device), y.to(device), args.steps, log=False)
        for p_ddp, p_single in zip(model.module.parameters(), single.parameters()):
            torch.testing.assert_close(p_ddp.cpu(), p_single.cpu(), rtol=1e-5, atol=1e-5)
        print(f"DDP on {world} processes matches single-process training", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
