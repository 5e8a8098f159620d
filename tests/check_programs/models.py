"""Model factories for `torch-tpu check --model` tests: (model, example_inputs[, loss_fn])."""

import torch


def mlp():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    return model, (torch.randn(4, 8),)


def with_loss():
    model = torch.nn.Linear(8, 3)
    target = torch.tensor([0, 2, 1, 1])
    return model, torch.randn(4, 8), lambda out: torch.nn.functional.cross_entropy(out, target)
