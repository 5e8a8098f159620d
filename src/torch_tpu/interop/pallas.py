"""`torch.tpu.pallas`: custom kernels written in JAX or Pallas (see docs/kernels.md)."""

from .jax_op import jax_op

__all__ = ["jax_op"]
