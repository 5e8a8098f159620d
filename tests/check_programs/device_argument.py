"""Picks its device from an argument: `torch-tpu check device_argument.py --device {device}`."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cpu")
device = parser.parse_args().device
torch.manual_seed(0)
w = torch.randn(5, 5).to(device).requires_grad_()  # drawn on the CPU: each device has its RNG
opt = torch.optim.Adam([w], lr=0.05)
for _ in range(3):
    loss = (w @ w.t()).diagonal().sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"loss {loss.item():.5f}")
