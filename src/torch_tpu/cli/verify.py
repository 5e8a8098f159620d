"""`torch-tpu verify`: the 2x2 check from the migration guide, then a few MLP
training steps on tpu and on CPU whose losses must agree."""

from __future__ import annotations

import torch

from .. import api, platform
from ..training import mlp, train_losses


def run(steps: int = 5) -> int:
    name = api.get_device_name()  # starts the device (and checks TORCH_TPU_*) first
    print(f"platform: {platform.platform()} ({name})")
    x = torch.randn(2, 2, device="tpu")
    y = torch.randn(2, 2, device="tpu")
    z = x @ y
    print(f"device:   {z.device}")
    print(f"2x2 matmul on tpu:\n{z}")
    matmul_ok = torch.allclose(z.cpu(), x.cpu() @ y.cpu(), rtol=1e-5, atol=1e-6)
    print(f"2x2 matmul matches CPU: {matmul_ok}")

    cpu_losses = train_losses(mlp, "cpu", steps)
    tpu_losses = train_losses(mlp, "tpu", steps)
    for step, (c, t) in enumerate(zip(cpu_losses, tpu_losses)):
        print(f"step {step}: loss cpu {c:.6f}  tpu {t:.6f}")
    losses_ok = all(abs(c - t) <= 1e-4 * max(abs(c), 1e-6) for c, t in zip(cpu_losses, tpu_losses))
    print(f"MLP losses agree (1e-4 relative): {losses_ok}")
    ok = matmul_ok and losses_ok
    print("verify: OK" if ok else "verify: FAILED")
    return 0 if ok else 1
