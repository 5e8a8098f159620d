"""Calling a JAX library function from a PyTorch training loop.

    python examples/jax_library_in_loop.py [--steps 30]

`jax.scipy.linalg.expm` (the matrix exponential) becomes a PyTorch op with
one decorator; its gradient comes from `jax.vjp`, so the loop below trains a
generator matrix A so that expm(A) maps a batch of states onto targets, with
a PyTorch optimizer, on tpu. The same loop with `torch.linalg.matrix_exp`
runs on the CPU next to it; the losses agree.
"""

from __future__ import annotations

import argparse

import jax
import jax.scipy.linalg
import torch

expm = None  # the jax_op, defined at first use (it starts the tpu device)


def _expm(a: jax.Array) -> jax.Array:
    return jax.scipy.linalg.expm(a)


def train(device: str, steps: int, n: int) -> list[float]:
    global expm
    if device == "tpu" and expm is None:
        expm = torch.tpu.pallas.jax_op("examples::expm", _expm)
    matrix_exp = expm if device == "tpu" else torch.linalg.matrix_exp
    g = torch.Generator().manual_seed(0)
    true_a = 0.3 * torch.randn(n, n, generator=g, dtype=torch.float64)
    states = torch.randn(n, 16, generator=g, dtype=torch.float64)
    targets = torch.linalg.matrix_exp(true_a) @ states
    a = torch.zeros(n, n, dtype=torch.float64, device=device, requires_grad=True)
    states, targets = states.to(device), targets.to(device)
    opt = torch.optim.Adam([a], lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = (matrix_exp(a) @ states - targets).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(steps: int = 30, n: int = 6) -> tuple[list, list]:
    tpu = train("tpu", steps, n)
    cpu = train("cpu", steps, n)
    for k, (a, b) in enumerate(zip(tpu, cpu)):
        print(f"step {k}: tpu jax.scipy expm {a:.8f}   cpu torch.linalg.matrix_exp {b:.8f}")
    return tpu, cpu


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--n", type=int, default=6)
    args = parser.parse_args()
    main(args.steps, args.n)
