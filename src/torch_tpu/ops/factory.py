"""Factories: tensors made from sizes and scalars."""

from __future__ import annotations

import jax.numpy as jnp

from .. import dtypes
from .registry import lower


def _jdtype(dtype, default="float32"):
    import torch

    return dtypes.to_jax(dtype if dtype is not None else torch.get_default_dtype())


@lower("full.default")
def full(size, fill_value, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value)


@lower("fill_.Scalar")
def fill_scalar(self, value):
    return jnp.full(self.shape, value, self.dtype)


@lower("fill_.Tensor")
def fill_tensor(self, value):
    return jnp.broadcast_to(value.astype(self.dtype), self.shape)


@lower("zero_.default")
def zero_(self):
    return jnp.zeros_like(self)
