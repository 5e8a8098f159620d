"""`torch.tpu.ops`: TPU-minded ops, each a jax_op (so: every mode, compile, autograd).

- `ragged_dot(lhs, rhs, group_sizes)`: grouped matmul for mixture-of-experts
  layers: rows of lhs [m, k] are split into consecutive groups of
  `group_sizes` [g] rows; group i is multiplied by rhs[i] [k, n]. Rows past
  sum(group_sizes) give zeros. `jax.lax.ragged_dot` (a fused kernel on TPU).
- `optimization_barrier(tensors)`: the same values, but XLA may not move
  computation across it (keeps rematerialisation and scheduling where put).
- `attention(q, k, v, mask=None, is_causal=False, scale=None)`: PyTorch's
  scaled_dot_product_attention layout ([batch, heads, seq, head_dim]) through
  `jax.nn.dot_product_attention`, which picks the platform's fused attention
  (cuDNN on GPU) and XLA's reference otherwise. A bool mask keeps True
  positions; a float mask is added to the scores.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .jax_op import jax_op

__all__ = ["ragged_dot", "optimization_barrier", "attention"]


def _ragged_dot(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array) -> jax.Array:
    return jax.lax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32))


def _optimization_barrier(tensors: list[jax.Array]) -> list[jax.Array]:
    return list(jax.lax.optimization_barrier(tuple(tensors)))


def _attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None = None,
    is_causal: bool = False,
    scale: float | None = None,
) -> jax.Array:
    bias = boolean = None
    if mask is not None:
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        if mask.dtype == jnp.bool_:
            boolean = mask
        else:
            bias = mask.astype(q.dtype)
    out = jax.nn.dot_product_attention(
        q.swapaxes(1, 2),  # JAX's layout is [batch, seq, heads, head_dim]
        k.swapaxes(1, 2),
        v.swapaxes(1, 2),
        bias=bias,
        mask=boolean,
        scale=scale,
        is_causal=is_causal,
    )
    return out.swapaxes(1, 2)


ragged_dot = jax_op("torch_tpu::ragged_dot", _ragged_dot)
optimization_barrier = jax_op("torch_tpu::optimization_barrier", _optimization_barrier)
attention = jax_op("torch_tpu::attention", _attention)
