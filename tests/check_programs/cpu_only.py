"""Never touches the tpu device, whatever it is told."""

import torch

print(f"value {torch.ones(3).sum().item():.1f}")
