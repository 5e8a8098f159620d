"""Lowerings: the fused recurrent cells behind nn.LSTM, nn.GRU, LSTMCell and GRUCell.

PyTorch's recurrent modules decompose (CompositeImplicitAutograd) into a loop of
cells; for a PrivateUse1 input the LSTM and GRU cells call the fused point-wise
kernels below after the two matrix products (input and hidden gates), exactly as
on CUDA. nn.RNN and RNNCell are plain matmul + tanh/relu and need nothing here.

The `workspace` output carries what the backward needs. Its shape is PyTorch's
(LSTM: PyTorch's meta kernel; GRU: the CUDA kernel's (N, 5H)); its contents are
ours, read only by the backward lowerings in this module:
LSTM: the activated gates [i, f, g, o]; GRU: [r, z, n, hx, hidden n-gate + bias].
Half-precision inputs compute in float32; the engine casts results back.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import dtypes
from .registry import lower

_up = dtypes.widen_half


def _biased(gates, bias):
    """Gate pre-activations plus an optional bias, in opmath precision."""
    return _up(gates) if bias is None else _up(gates) + _up(bias)


@lower("_thnn_fused_lstm_cell.default", skip_meta=True)
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    i, f, g, o = jnp.split(
        _biased(input_gates, input_bias) + _biased(hidden_gates, hidden_bias), 4, -1
    )
    i, f, g, o = jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)
    cy = f * _up(cx) + i * g
    hy = o * jnp.tanh(cy)
    workspace = jnp.concatenate([i, f, g, o], -1)
    # skip_meta: the engine takes dtypes from these results, so they are PyTorch's here
    return hy.astype(cx.dtype), cy.astype(cx.dtype), workspace.astype(input_gates.dtype)


@lower("_thnn_fused_lstm_cell_backward_impl.default")
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    if grad_hy is None and grad_cy is None:
        return None, None, None
    i, f, g, o = jnp.split(_up(workspace), 4, -1)
    cx, cy = _up(cx), _up(cy)
    grad_hy = jnp.zeros_like(cy) if grad_hy is None else _up(grad_hy)
    grad_cy = jnp.zeros_like(cy) if grad_cy is None else _up(grad_cy)
    tanh_cy = jnp.tanh(cy)
    grad_c = grad_cy + grad_hy * o * (1 - tanh_cy * tanh_cy)
    grad_gates = jnp.concatenate(
        [
            grad_c * g * i * (1 - i),
            grad_c * cx * f * (1 - f),
            grad_c * i * (1 - g * g),
            grad_hy * tanh_cy * o * (1 - o),
        ],
        -1,
    )
    grad_bias = jnp.sum(grad_gates, 0) if has_bias else None
    return grad_gates, grad_c * f, grad_bias


@lower("_thnn_fused_gru_cell.default")
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ir, iz, in_ = jnp.split(_biased(input_gates, input_bias), 3, -1)
    hr, hz, hn = jnp.split(_biased(hidden_gates, hidden_bias), 3, -1)
    hx = _up(hx)
    r = jax.nn.sigmoid(ir + hr)
    z = jax.nn.sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    hy = n + z * (hx - n)
    workspace = jnp.concatenate([r, z, n, hx, hn], -1)
    # no meta kernel: the engine takes dtypes from these results, so they are PyTorch's
    return hy.astype(hidden_gates.dtype), workspace.astype(input_gates.dtype)


@lower("_thnn_fused_gru_cell_backward.default")
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    dtype = grad_hy.dtype  # no meta kernel: results are cast to PyTorch's dtype here
    r, z, n, hx, hn = jnp.split(_up(workspace), 5, -1)
    grad_hy = _up(grad_hy)
    grad_n = grad_hy * (1 - z) * (1 - n * n)  # through tanh
    grad_z = grad_hy * (hx - n) * z * (1 - z)
    grad_r = grad_n * hn * r * (1 - r)
    grad_input = jnp.concatenate([grad_r, grad_z, grad_n], -1)
    grad_hidden = jnp.concatenate([grad_r, grad_z, grad_n * r], -1)
    grads = [grad_input, grad_hidden, grad_hy * z]
    if has_bias:
        grads += [jnp.sum(grad_input, 0), jnp.sum(grad_hidden, 0)]
    return tuple(g.astype(dtype) for g in grads) + (None, None) * (not has_bias)
