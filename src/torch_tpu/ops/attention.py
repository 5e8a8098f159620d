"""Lowerings: the inference fast paths of nn.MultiheadAttention and
nn.TransformerEncoderLayer (`_native_multi_head_attention`,
`_transformer_encoder_layer_fwd`).

PyTorch takes these in eval mode without gradients; training runs the ordinary
ops. Both follow PyTorch's CPU kernel: the query is scaled by 1/sqrt(head dim)
before the product with the keys, a float mask is read as a boolean one (any
non-zero entry masks, as the CPU kernel's `mask.to(bool)` does) and a row whose
every key is masked gets NaN weights, so NaN outputs, as on CPU (before
2026-12-05 tpu gave zeros: the out_proj bias).

A `src_key_padding_mask` given to nn.TransformerEncoder would make PyTorch pack
the batch into a nested tensor, which tpu does not have: the engine's
`_nested_tensor_from_mask_left_aligned` (engine/kernels.py) answers False, so
the encoder keeps the dense fast path, as CPU does with enable_nested_tensor=False.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from .. import dtypes
from .linalg import matmul
from .registry import lower

_up = dtypes.widen_half


def _linear(x, weight, bias):
    out = matmul(x, _up(weight).T)  # (at PyTorch's matmul precision, as mm's)
    return out if bias is None else out + _up(bias)


def _heads(x, num_heads):
    """(B, T, D) -> (B, heads, T, D / heads)."""
    b, t, d = x.shape
    return x.reshape(b, t, num_heads, d // num_heads).transpose(0, 2, 1, 3)


def _keep(mask, mask_type, scores_shape):
    """Where attention is allowed, broadcast to the scores' (B, heads, T, S); None: all."""
    if mask is None:
        return None
    masked = mask if mask.dtype == jnp.bool_ else mask != 0
    if mask_type == 1 and masked.ndim == 2:  # key padding: (B, S)
        masked = masked[:, None, None, :]
    return jnp.broadcast_to(~masked, scores_shape)


def _attention(query, key, value, embed_dim, num_heads, qkv_weight, qkv_bias,
               proj_weight, proj_bias, mask, mask_type):
    """Projected multi-head attention: (output (B, T, D), weights (B, heads, T, S))."""
    w_q, w_k, w_v = jnp.split(_up(qkv_weight), 3, 0)
    b_q, b_k, b_v = jnp.split(_up(qkv_bias), 3, 0)
    head_dim = embed_dim // num_heads
    q = _heads(_linear(_up(query), w_q, b_q), num_heads) / math.sqrt(head_dim)
    k = _heads(_linear(_up(key), w_k, b_k), num_heads)
    v = _heads(_linear(_up(value), w_v, b_v), num_heads)
    scores = matmul(q, k.swapaxes(-1, -2))
    keep = _keep(mask, mask_type, scores.shape)
    if keep is None:
        weights = jax.nn.softmax(scores, -1)
    else:
        # a fully masked row: NaN, as CPU's kernel gives (the ordinary path's
        # scaled_dot_product_attention gives zeros there, on CPU and on tpu alike)
        weights = jax.nn.softmax(jnp.where(keep, scores, -jnp.inf), -1)
    context = matmul(weights, v).transpose(0, 2, 1, 3).reshape(query.shape[:2] + (embed_dim,))
    return _linear(context, proj_weight, proj_bias), weights


# skip_meta: without need_weights PyTorch's CPU kernel returns no weights (None), its
# meta kernel an empty tensor
@lower("_native_multi_head_attention.default", skip_meta=True)
def native_multi_head_attention(
    query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
    mask=None, need_weights=True, average_attn_weights=True, mask_type=None,
):
    out, weights = _attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                              proj_weight, proj_bias, mask, mask_type)
    out = out.astype(query.dtype)  # skip_meta: results carry PyTorch's dtype themselves
    if not need_weights:
        return out, None
    weights = jnp.mean(weights, 1) if average_attn_weights else weights
    return out, weights.astype(query.dtype)


def _layer_norm(x, weight, bias, eps):
    mean = jnp.mean(x, -1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * _up(weight) + _up(bias)


@lower("_transformer_encoder_layer_fwd.default")
def transformer_encoder_layer_fwd(
    src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
    norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
    ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None,
):
    x = _up(src)
    if src.size == 0:
        return x
    h = _layer_norm(x, norm_weight_1, norm_bias_1, eps) if norm_first else x
    h, _ = _attention(h, h, h, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                      proj_bias, mask, mask_type)
    x = x + h
    if not norm_first:
        x = _layer_norm(x, norm_weight_1, norm_bias_1, eps)
    h = _layer_norm(x, norm_weight_2, norm_bias_2, eps) if norm_first else x
    h = _linear(h, ffn_weight_1, ffn_bias_1)
    h = jax.nn.gelu(h, approximate=False) if use_gelu else jax.nn.relu(h)
    x = x + _linear(h, ffn_weight_2, ffn_bias_2)
    return x if norm_first else _layer_norm(x, norm_weight_2, norm_bias_2, eps)
