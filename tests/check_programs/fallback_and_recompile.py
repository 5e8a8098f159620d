"""Trains a little, with an op that has no tpu lowering and an input whose length changes."""

import torch

device = torch.accelerator.current_accelerator() or torch.device("cpu")
torch.manual_seed(0)
model = torch.nn.Linear(4, 4).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    x = torch.randn(3 + step, 4).to(device)  # a new length every step
    y = model(x) + torch.special.airy_ai(x)  # airy_ai has no tpu lowering: runs on the CPU
    loss = y.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"loss {loss.item():.6f}")
