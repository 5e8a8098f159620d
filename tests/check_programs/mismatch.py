"""Prints a number that differs on tpu: check must call it a mismatch."""

import os

import torch

device = os.environ.get("TORCH_TPU_CHECK_DEVICE", "cpu")
x = torch.arange(6.0, device=device)
print(f"total {(x.sum() + (0.5 if device == 'tpu' else 0.0)).item():.4f}")
