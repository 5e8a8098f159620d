"""RMSNorm as a Pallas kernel inside a small Llama-style model, trained compiled.

    python examples/pallas_rmsnorm_llama.py [--steps 10]

`rms_norm` is a `pallas_call` over blocks of rows (its backward is plain JAX,
attached with `jax.custom_vjp`: Pallas kernels have no automatic reverse
mode), made a PyTorch op by `torch.tpu.pallas.jax_op`. The model trains under
`torch.compile(backend="tpu")`, the kernel inlined into the step's program;
the same model with PyTorch's RMSNorm trains on the CPU next to it and the
losses agree. On a machine without a Pallas backend (XLA:CPU) the kernel runs
in Pallas's interpret mode (a note says so once).
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F
from jax.experimental import pallas as pl
from torch import nn

EPS = 1e-6


def _rms_kernel(x_ref, w_ref, o_ref):
    x = x_ref[...].astype(jnp.float32)
    scale = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)
    o_ref[...] = (x * scale * w_ref[...].astype(jnp.float32)).astype(o_ref.dtype)


def _rms_forward(x, w):
    rows, dim = x.shape
    block = 8 if rows % 8 == 0 else rows
    return pl.pallas_call(
        _rms_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // block,),
        in_specs=[
            pl.BlockSpec((block, dim), lambda i: (i, 0)),
            pl.BlockSpec((dim,), lambda i: (0,)),
        ],
        out_specs=pl.BlockSpec((block, dim), lambda i: (i, 0)),
    )(x, w)


@jax.custom_vjp
def _rms(x, w):
    return _rms_forward(x, w)


def _rms_fwd(x, w):
    return _rms_forward(x, w), (x, w)


def _rms_bwd(residuals, g):
    x, w = residuals
    r = jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS)
    xhat = x * r
    gw = jnp.sum(g * xhat, axis=0)
    gx_hat = g * w
    gx = r * (gx_hat - xhat * jnp.mean(gx_hat * xhat, axis=-1, keepdims=True))
    return gx, gw


_rms.defvjp(_rms_fwd, _rms_bwd)


def rms_norm(x: jax.Array, weight: jax.Array) -> jax.Array:
    return _rms(x, weight)


rms_norm_op = None  # the jax_op, defined by the first Pallas RMSNorm (it starts the device)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, pallas: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.pallas = pallas
        global rms_norm_op
        if pallas and rms_norm_op is None:
            rms_norm_op = torch.tpu.pallas.jax_op("examples::rms_norm", rms_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pallas:
            return rms_norm_op(x.reshape(-1, x.shape[-1]), self.weight).reshape(x.shape)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * self.weight


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, pallas: bool) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim, pallas), RMSNorm(dim, pallas)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.gate_up = nn.Linear(dim, 4 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class TinyLlama(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, pallas: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, pallas) for _ in range(layers))
        self.norm = RMSNorm(dim, pallas)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def train(device: str, pallas: bool, steps: int, dim: int, compile: bool) -> list[float]:
    torch.manual_seed(0)
    model = TinyLlama(vocab=64, dim=dim, layers=2, heads=2, pallas=pallas).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 64, (4, 17), generator=g).to(device)
    inputs, targets = data[:, :-1], data[:, 1:]

    def step():
        opt.zero_grad()
        logits = model(inputs)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss

    if compile:
        step = torch.compile(step, backend="tpu")
    return [step().item() for _ in range(steps)]


def main(steps: int = 10, dim: int = 32) -> tuple[list, list]:
    tpu = train("tpu", True, steps, dim, compile=True)
    cpu = train("cpu", False, steps, dim, compile=False)
    for k, (a, b) in enumerate(zip(tpu, cpu)):
        print(f"step {k}: tpu (Pallas RMSNorm, compiled) {a:.6f}   cpu (PyTorch RMSNorm) {b:.6f}")
    return tpu, cpu


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--dim", type=int, default=32)
    args = parser.parse_args()
    main(args.steps, args.dim)
