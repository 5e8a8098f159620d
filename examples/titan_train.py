"""TorchTitan-style training on the tpu device: FSDP2 x tensor parallel, bf16, compiled.

    torchrun --standalone --nproc-per-node 4 examples/titan_train.py --dp 2 --tp 2
    torchrun ... examples/titan_train.py --dp 2 --tp 2 --save-at 5 --ckpt /tmp/ck
    torchrun ... examples/titan_train.py --dp 4 --tp 1 --resume /tmp/ck/step5

A Llama-style decoder (RMSNorm, RoPE attention, SwiGLU) built from a config, on a
2-D `DeviceMesh("tpu", (dp, tp))`: tensor parallelism with `parallelize_module`
(column/row-wise linears, sequence-parallel norms), `fully_shard` over dp with a
`MixedPrecisionPolicy`, activation checkpointing and `torch.compile` per block,
AdamW, gradient clipping over DTensors and `torch.distributed.checkpoint`
save/resume (checkpoints are written completely or not at all, see
`torch_tpu.distributed.checkpoint`). `--check` trains the same model in this
process alone on the global batch and compares the loss curves.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass
class Config:
    vocab: int = 64
    dim: int = 32
    layers: int = 2
    heads: int = 4
    hidden: int = 64
    seq: int = 16
    batch: int = 4  # global batch (split over dp)
    lr: float = 1e-2
    max_norm: float = 1.0
    seed: int = 0


# ---------------------------------------------------------------- model


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope(x, cos, sin):
    """Rotary embedding on (batch, seq, heads, head_dim), pairs (2i, 2i+1) rotated."""
    pairs = x.float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    rotated = torch.stack([a * cos - b * sin, a * sin + b * cos], -1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.head_dim = c.dim // c.heads
        self.wq = nn.Linear(c.dim, c.dim, bias=False)
        self.wk = nn.Linear(c.dim, c.dim, bias=False)
        self.wv = nn.Linear(c.dim, c.dim, bias=False)
        self.wo = nn.Linear(c.dim, c.dim, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads / tp of them
        q = rope(self.wq(x).view(b, s, -1, self.head_dim), cos, sin)
        k = rope(self.wk(x).view(b, s, -1, self.head_dim), cos, sin)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.hidden, bias=False)
        self.w2 = nn.Linear(c.hidden, c.dim, bias=False)
        self.w3 = nn.Linear(c.dim, c.hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(c.dim)
        self.attention = Attention(c)
        self.ffn_norm = RMSNorm(c.dim)
        self.feed_forward = FeedForward(c)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleDict({str(i): Block(c) for i in range(c.layers)})
        self.norm = RMSNorm(c.dim)
        self.output = nn.Linear(c.dim, c.vocab, bias=False)
        half = c.dim // c.heads // 2
        angles = torch.outer(
            torch.arange(c.seq, dtype=torch.float32),
            1.0 / 10000 ** (torch.arange(half, dtype=torch.float32) / half),
        )
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for block in self.layers.values():
            h = block(h, self.cos, self.sin)
        return self.output(self.norm(h))


def model_flops_per_token(c: Config, params: int) -> int:
    """Training FLOPs per token, as TorchTitan counts them: 6 per parameter (forward
    and backward matmuls) plus attention's 12 * layers * dim * seq (scores and values,
    forward and backward; the causal mask is not discounted)."""
    return 6 * params + 12 * c.layers * c.dim * c.seq


def batch(c: Config, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: the same on every rank and in every run."""
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, c.vocab, (c.batch, c.seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def build(c: Config) -> Transformer:
    torch.manual_seed(c.seed)
    return Transformer(c)


# ---------------------------------------------------------------- parallelism


def parallelize(model: Transformer, mesh, *, bf16: bool, compile: bool, ac: bool) -> None:
    """TorchTitan's order: tensor parallel, activation checkpointing, compile, FSDP."""
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp = mesh["tp"]
    if tp.size() > 1:
        parallelize_module(
            model,
            tp,
            {
                "tok_embeddings": RowwiseParallel(
                    input_layouts=Replicate(), output_layouts=Shard(1)
                ),
                "norm": SequenceParallel(),
                "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
            },
        )
        for block in model.layers.values():
            parallelize_module(
                block,
                tp,
                {
                    "attention_norm": SequenceParallel(),
                    "attention": PrepareModuleInput(
                        input_layouts=(Shard(1), None, None),
                        desired_input_layouts=(Replicate(), None, None),
                    ),
                    "attention.wq": ColwiseParallel(),
                    "attention.wk": ColwiseParallel(),
                    "attention.wv": ColwiseParallel(),
                    "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
                    "ffn_norm": SequenceParallel(),
                    "feed_forward": PrepareModuleInput(
                        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                    ),
                    "feed_forward.w1": ColwiseParallel(),
                    "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
                    "feed_forward.w3": ColwiseParallel(),
                },
            )
    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else torch.float32, reduce_dtype=torch.float32
    )
    for name, block in list(model.layers.items()):
        if ac:
            block = checkpoint_wrapper(block)
        if compile:
            block = torch.compile(block, backend="tpu")
        fully_shard(block, mesh=mesh["dp"], mp_policy=policy)
        model.layers[name] = block
    fully_shard(model, mesh=mesh["dp"], mp_policy=policy)


def clip_grad_norm_(params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Clip by the global norm of DTensor gradients: the norm of each rank's shards is a
    partial DTensor; its full value is the same on every rank."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, foreach=True)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach=True)
    return total


# ---------------------------------------------------------------- training


def train_parallel(
    c: Config,
    dp: int,
    tp: int,
    steps: int,
    *,
    bf16: bool = False,
    compile: bool = False,
    ac: bool = True,
    start: int = 0,
    resume: str | None = None,
    save_at: int | None = None,
    ckpt: str | None = None,
    on_step=None,
) -> list[float]:
    """Train steps [start, steps) on a (dp, tp) mesh of tpu ranks; the global batch's
    mean loss per step (the same on every rank)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from torch_tpu.distributed import checkpoint

    mesh = init_device_mesh("tpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = build(c).to("tpu")
    parallelize(model, mesh, bf16=bf16, compile=compile, ac=ac)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=c.lr, weight_decay=0.1)
    if resume:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        checkpoint.load(state, resume)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    dp_rank, dp_group = mesh["dp"].get_local_rank(), mesh["dp"].get_group()
    losses = []
    for step in range(start, steps):
        tokens, labels = batch(c, step)
        rows = slice(dp_rank * c.batch // dp, (dp_rank + 1) * c.batch // dp)
        tokens, labels = tokens[rows].to("tpu"), labels[rows].to("tpu")
        logits = model(tokens)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
        loss.backward()
        clip_grad_norm_(params, c.max_norm)
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG, group=dp_group)
        losses.append(mean.item())
        if on_step is not None:
            on_step(step, losses[-1])
        if save_at is not None and step + 1 == save_at:
            msd, osd = get_state_dict(model, opt)
            checkpoint.save({"model": msd, "optim": osd}, f"{ckpt}/step{save_at}")
    return losses


def train_single(c: Config, steps: int, on_step=None) -> list[float]:
    """The same model and batches in this process alone (fp32, eager): the reference."""
    model = build(c).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=c.lr, weight_decay=0.1)
    losses = []
    for step in range(steps):
        tokens, labels = (t.to("tpu") for t in batch(c, step))
        loss = F.cross_entropy(model(tokens).float().flatten(0, 1), labels.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c.max_norm, foreach=True)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1])
    return losses


def max_relative_error(got: list[float], want: list[float]) -> float:
    return max(abs(g - w) / max(abs(w), 1e-12) for g, w in zip(got, want, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--bf16", action="store_true", help="bf16 params, fp32 reductions")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each block (with tp > 1 PyTorch's compiled blocks give the "
        "embedding no gradient, on CPU too: --check then differs, see docs/distributed.md)",
    )
    parser.add_argument("--no-ac", action="store_true", help="no activation checkpointing")
    parser.add_argument("--ckpt", default="/tmp/titan_ckpt")
    parser.add_argument("--save-at", type=int)
    parser.add_argument("--resume", help="a checkpoint directory saved by --save-at")
    parser.add_argument("--start", type=int, default=0, help="first step (with --resume)")
    parser.add_argument("--check", action="store_true", help="compare with one process")
    args = parser.parse_args()

    dist.init_process_group(backend="tpu_dist")
    rank = dist.get_rank()
    c = Config()

    def log(step, loss):
        if rank == 0:
            print(f"step {step}: loss {loss:.6f}", flush=True)

    losses = train_parallel(
        c,
        args.dp,
        args.tp,
        args.steps,
        bf16=args.bf16,
        compile=args.compile,
        ac=not args.no_ac,
        start=args.start,
        resume=args.resume,
        save_at=args.save_at,
        ckpt=args.ckpt,
        on_step=log,
    )
    if args.check and rank == 0:
        reference = train_single(c, args.steps)[args.start :]
        error = max_relative_error(losses, reference)
        bound = 2e-2 if args.bf16 else 1e-5
        verdict = "matches" if error <= bound and math.isfinite(error) else "DIFFERS FROM"
        print(f"max relative loss error {error:.2e} (bound {bound:.0e}): {verdict} one process")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
