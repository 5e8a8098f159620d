"""Small reference models and a deterministic training loop, shared by
`torch-tpu verify`, the training-parity tests and the benchmarks."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def mlp(width: int = 64, depth: int = 3, classes: int = 10) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def cnn(classes: int = 10) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, classes),
    )


def _batch(model_fn: Callable, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One fixed batch: training on it must lower the loss (memorisation)."""
    g = torch.Generator().manual_seed(1000)
    if model_fn is cnn:
        x = torch.randn(batch, 3, 16, 16, generator=g)
    else:
        x = torch.randn(batch, 64, generator=g)
    return x, torch.randint(0, 10, (batch,), generator=g)


def train_losses(
    model_fn: Callable[[], nn.Module],
    device: str,
    steps: int,
    optimizer: str = "sgd",
    batch: int = 16,
    seed: int = 0,
    foreach: bool | None = None,
) -> list[float]:
    """Loss at each step of training model_fn() on fixed data; the same seed gives
    the same initial weights on every device."""
    torch.manual_seed(seed)
    model = model_fn().to(device)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=foreach)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=foreach)
    losses = []
    for _ in range(steps):
        x, y = _batch(model_fn, batch)
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


class _Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT-style decoder: embeddings, causal self-attention blocks, LM head."""

    def __init__(self, vocab: int, d: int, heads: int, seq: int, layers: int = 2) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.Sequential(*[_Block(d, heads) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(positions))))


GPT_SIZES = {
    "gpt": dict(vocab=1024, d=256, heads=4, seq=128, batch=8),
    "gpt_small": dict(vocab=256, d=64, heads=4, seq=32, batch=4),
}


def gpt_parts(size: str, device: str, seed: int = 0) -> tuple:
    """(model, AdamW(foreach=False), inputs, targets, loss_fn) of the GPT training step,
    with the same seed, weights and fixed batch on every device."""
    cfg = GPT_SIZES[size]
    torch.manual_seed(seed)
    model = TinyGPT(cfg["vocab"], cfg["d"], cfg["heads"], cfg["seq"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g).to(device)

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab"]), targets.reshape(-1))

    return model, opt, idx[:, :-1], idx[:, 1:], loss_fn


def gpt_step_fn(size: str, device: str, seed: int = 0):
    """(model, step function returning the loss tensor) for a GPT training step with
    AdamW(foreach=False) on a fixed batch."""
    model, opt, inputs, targets, loss_fn = gpt_parts(size, device, seed)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        opt.step()
        return loss

    return model, step


def wide_mlp_step_fn(device: str):
    """(model, step function returning the loss tensor) for the benchmarks' MLP:
    3 x Linear(1024) + ReLU, batch 128, SGD, MSE on a fixed batch."""
    torch.manual_seed(0)
    layers = [nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(1024, 1024)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(128, 1024).to(device), torch.randn(128, 1024).to(device)

    def step() -> torch.Tensor:
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return model, step


def gpt_example() -> tuple[nn.Module, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The bundled model for `torch-tpu check --model torch_tpu.training:gpt_example`:
    (model, example inputs, loss_fn), as check's --model form expects."""
    cfg = GPT_SIZES["gpt_small"]
    model = TinyGPT(cfg["vocab"], cfg["d"], cfg["heads"], cfg["seq"])
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=g)
    targets = idx[:, 1:]

    def loss_fn(logits: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(
            logits.reshape(-1, cfg["vocab"]), targets.to(logits.device).reshape(-1)
        )

    return model, idx[:, :-1], loss_fn
