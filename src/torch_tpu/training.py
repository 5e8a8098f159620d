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
