"""A mixture-of-experts layer on `torch.tpu.ops.ragged_dot` (grouped matmul).

    python examples/moe_ragged_dot.py [--steps 20] [--compile]

Tokens are routed to their top-1 expert, sorted by expert so that each
expert's tokens are consecutive rows, and every expert's matmul runs as one
`ragged_dot` (one fused kernel on TPU instead of a loop over experts). The
same layer written as a PyTorch loop over experts trains on the CPU next to
it; the losses agree step by step.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


class MoE(nn.Module):
    def __init__(self, dim: int, hidden: int, experts: int, ragged: bool) -> None:
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.w_in = nn.Parameter(torch.randn(experts, dim, hidden) / dim**0.5)
        self.w_out = nn.Parameter(torch.randn(experts, hidden, dim) / hidden**0.5)
        self.ragged = ragged

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])
        gate, expert = self.router(tokens).softmax(-1).max(-1)
        order = expert.argsort()
        sorted_tokens = tokens[order]
        counts = torch.bincount(expert, minlength=self.w_in.shape[0])
        if self.ragged:
            h = torch.tpu.ops.ragged_dot(sorted_tokens, self.w_in, counts)
            y = torch.tpu.ops.ragged_dot(torch.nn.functional.silu(h), self.w_out, counts)
        else:  # the reference: one matmul per expert
            pieces, start = [], 0
            for e, n in enumerate(counts.tolist()):
                part = sorted_tokens[start : start + n]
                pieces.append(torch.nn.functional.silu(part @ self.w_in[e]) @ self.w_out[e])
                start += n
            y = torch.cat(pieces)
        out = torch.empty_like(y).index_copy(0, order, y)
        return (out * gate[:, None]).reshape(x.shape)


def train(device: str, ragged: bool, steps: int, dim: int, compile: bool) -> list[float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(dim, dim), MoE(dim, 2 * dim, 4, ragged), nn.Linear(dim, 1))
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 16, dim, generator=g).to(device)
    target = torch.randn(8, 16, 1, generator=g).to(device)

    def step():
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        return loss

    if compile:
        step = torch.compile(step, backend="tpu")
    return [step().item() for _ in range(steps)]


def main(steps: int = 20, dim: int = 16, compile: bool = False) -> tuple[list, list]:
    tpu = train("tpu", True, steps, dim, compile)
    cpu = train("cpu", False, steps, dim, False)
    for k, (a, b) in enumerate(zip(tpu, cpu)):
        print(f"step {k}: tpu ragged_dot {a:.6f}   cpu loop {b:.6f}")
    return tpu, cpu


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    main(args.steps, args.dim, args.compile)
