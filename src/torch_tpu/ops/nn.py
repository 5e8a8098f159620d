"""Lowerings: neural-network ops (activations, softmax, normalization, dropout,
embedding, losses, convolution, pooling, upsampling), forward and backward.

Half-precision inputs compute in float32 and the engine casts results back, as
PyTorch's CPU kernels do with their "opmath" type. Where a backward op is the
exact derivative of a smooth forward, it is written as the VJP of the forward
lowering so the two cannot disagree; kinks (relu, hardtanh, losses) follow
PyTorch's own choice of subgradient explicitly.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from torch._prims_common import suggest_memory_format

from .. import dtypes, precision
from ..rng import draw
from .indexing import outside
from .pointwise import check_fill_value, scalar_type_name
from .registry import in_memory_format, lower

_HALF = dtypes.HALF_FLOATS


_up = dtypes.widen_half


def _vjp(fn, x, grad):
    """d(fn)/dx applied to grad: a backward op written as the derivative of its forward."""
    x = _up(x)
    out, pull = jax.vjp(fn, x)
    return pull(grad.astype(out.dtype))[0]


def _axis(x, dim):
    """PyTorch lets 0-d tensors use dim 0 or -1; JAX wants no axis at all."""
    return dim if x.ndim else None


# ----------------------------------------------------------------- activations


@lower("relu.default")
def relu(self):
    """CPU's clamp_min(x, 0): x unless x < 0, so -0.0 and NaN pass through (XLA's max
    gave 0.0 for -0.0)."""
    return jnp.where(self < 0, jnp.zeros((), self.dtype), self)


def _check_integer_threshold(values: list) -> bool:
    """CPU converts threshold and value to an integer input's type and refuses what does
    not fit (tpu wrapped a value of 300 into uint8 as 44, compared with 1j's real part):
    CPU's own conversion judges (`check_fill_value`). Depends on the numbers, so it runs
    on every call of an integer input; float inputs are not judged (beyond their range
    CPU raises and tpu gives inf, as for fill values)."""
    if not dtypes.is_integer(values[0].dtype):
        return False
    for number in values[1:3]:
        check_fill_value(number, values[0].dtype)
    return True


@lower("threshold.default", check=_check_integer_threshold)
def threshold(self, threshold, value):
    """A lowering of its own (the decomposition copied into `self`, which an expanded
    threshold_ target refuses; CPU's threshold_ accepts one: it is idempotent).
    Half inputs are compared in float32, as CPU does: in bfloat16 a threshold of 0.1
    rounds up to 0.10009765625 and would swallow inputs equal to that. An integer input
    is compared with the threshold truncated to its type, as CPU's C++ conversion does
    (-0.5 becomes 0, so a 0 is replaced)."""
    if jnp.issubdtype(self.dtype, jnp.integer):
        threshold = jnp.asarray(threshold).astype(self.dtype)
    return jnp.where(_up(self) <= threshold, jnp.asarray(value).astype(self.dtype), self)


@lower("threshold_backward.default")
def threshold_backward(grad_output, self, threshold):
    zero = jnp.zeros((), grad_output.dtype)
    return jnp.where(_up(self) <= threshold, zero, grad_output)


def _floating_only(kernel: str):
    """CPU's refusal of a non-floating input, which PyTorch's meta kernel words as a
    ValueError about the float argument instead."""

    def check(values: list) -> bool:
        if not values[0].is_floating_point():
            name = scalar_type_name(values[0].dtype)
            raise NotImplementedError(f"\"{kernel}\" not implemented for '{name}'")
        return False

    return check


@lower("leaky_relu.default", check=_floating_only("leaky_relu_cpu"))
def leaky_relu(self, negative_slope=0.01):
    x = _up(self)
    return jnp.where(x > 0, x, x * negative_slope)


def _refuse_negative_slope_in_place(name: str, slope_at: int, is_result_at: int, tail=""):
    """CPU's refusal of an in-place activation's backward with a negative slope: the
    formula from the result is wrong there (tpu returned that wrong gradient)."""

    def check(values: list) -> bool:
        if values[is_result_at] and float(values[slope_at]) < 0:
            raise RuntimeError(
                f"In-place {name} backward calculation is triggered with a negative slope "
                "which is not supported. This is caused by calling in-place forward function "
                "with a negative slope, please call out-of-place version instead." + tail
            )
        return False

    return check


@lower(
    "leaky_relu_backward.default",
    check=_refuse_negative_slope_in_place(
        "leakyReLu", slope_at=2, is_result_at=3, tail=" File an issue at "
        "https://github.com/pytorch/pytorch if you do require supporting in-place leakRelu "
        "backward calculation with negative slope",
    ),
)
def leaky_relu_backward(grad_output, self, negative_slope, self_is_result):
    g = _up(grad_output)
    return jnp.where(self > 0, g, g * negative_slope)


@lower("elu.default", check=_floating_only("elu_cpu"))
def elu(self, alpha=1, scale=1, input_scale=1):
    x = _up(self)
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@lower(
    "elu_backward.default", check=_refuse_negative_slope_in_place("elu", slope_at=1, is_result_at=4)
)
def elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result):
    g, y = _up(grad_output), _up(self_or_result)
    if is_result:  # y is elu's output: d/dx = input_scale * (y + alpha * scale)
        negative = g * input_scale * (y + alpha * scale)
    else:
        negative = g * input_scale * alpha * scale * jnp.exp(y * input_scale)
    return jnp.where(y <= 0, negative, g * scale)


def _gelu(x, approximate):
    """CPU's formulas, x (1 + erf(x / sqrt 2)) / 2 and x (1 + tanh(u)) / 2, with XLA's erf
    and tanh. In the negative tail 1 + erf cancels (CPU's too: 57% of the value at worst
    for x in [-5.5, -1]), and XLA's erf, a few ulp off where CPU's is 1, makes it up to
    142% (values below 1e-5; docs/differences.md). `erfcx.erf`, which would hold CPU's
    57%, costs XLA:CPU 3x for gelu (4.1 against 1.4 ms on 4M elements): not taken for
    an activation that runs in every layer."""
    if approximate == "tanh":
        inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)
        return 0.5 * x * (1 + jnp.tanh(inner))
    return 0.5 * x * (1 + lax.erf(x * (1 / math.sqrt(2))))


@lower("gelu.default")
def gelu(self, approximate="none"):
    return _gelu(_up(self), approximate)


@lower("gelu_backward.default")
def gelu_backward(grad_output, self, approximate="none"):
    return _vjp(lambda x: _gelu(x, approximate), self, _up(grad_output))


def _silu(x):
    return x * jax.nn.sigmoid(x)


def _mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


@lower("silu.default")
def silu(self):
    return _silu(_up(self))


@lower("mish.default")
def mish(self):
    return _mish(_up(self))


# (CompositeImplicitAutograd ops: autograd reaches these lowerings only with grad mode
# off, engine/kernels.py `_GRADLESS_BACKWARDS`; CPU's kernels compute halves in float32)
@lower("silu_backward.default")
def silu_backward(grad_output, self):
    return _vjp(_silu, self, _up(grad_output))


@lower("mish_backward.default")
def mish_backward(grad_output, self):
    return _vjp(_mish, self, _up(grad_output))


def _check_integer_hardtanh(values: list) -> bool:
    """CPU reads an integer input's bounds as int64, refuses negative ones for uint8,
    then converts them to the input's type (tpu clamped an int8 to -300..300): CPU's own
    conversions judge (`check_fill_value`). Depends on the numbers, so it runs on every
    call of an integer input."""
    dtype = values[0].dtype
    if not dtypes.is_integer(dtype):
        return False
    for number in values[1:3]:
        check_fill_value(number, torch.int64)
    bounds = [int(number) for number in values[1:3]]  # (truncated: -0.9 is 0)
    if dtype == torch.uint8 and min(bounds) < 0:
        raise RuntimeError("cannot do hardtanh on an unsigned type with negative limits")
    for bound in bounds:
        check_fill_value(bound, dtype)
    return True


@lower("hardtanh.default", check=_check_integer_hardtanh)
def hardtanh(self, min_val=-1, max_val=1):
    """CPU's clamp: x unless it lies beyond a bound, so -0.0 and NaN pass through
    (`relu6(-0.0)` is -0.0 there; XLA's clip gave 0.0)."""
    low = jnp.where(self < min_val, jnp.asarray(min_val, self.dtype), self)
    return jnp.where(self > max_val, jnp.asarray(max_val, self.dtype), low)


@lower("hardtanh_backward.default")
def hardtanh_backward(grad_output, self, min_val, max_val):
    """Bounds compared in float32 for half inputs, as CPU (see threshold)."""
    x = _up(self)
    inside = (x > min_val) & (x < max_val)
    return jnp.where(inside, grad_output, jnp.zeros((), grad_output.dtype))


def _check_softshrink(values: list) -> bool:
    """CPU's checks, with its wording: a floating dtype, and a lambda in [0, the dtype's
    max] (NaN too is refused). PyTorch's meta kernel words the range otherwise."""
    self, lambd = values[0], float(values[1])
    _floating_only("softshrink_check")(values)
    top = torch.finfo(self.dtype).max
    if not 0 <= lambd <= top:
        raise RuntimeError(
            f"lambda must be in range [0, {top:g}] for input dtype "
            f"{scalar_type_name(self.dtype)}, but found {lambd:g}"
        )
    return False


@lower("softshrink.default", static_scalars=True, check=_check_softshrink)
def softshrink(self, lambd=0.5):
    """In float32 for half inputs, as CPU: PyTorch's decomposition subtracts a lambda
    rounded to the half type (bfloat16 0.1 becomes 0.10009765625)."""
    x = _up(self)
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0))


@lower("softshrink_backward.default", "hardshrink_backward.default")
def softshrink_backward(grad_output, self, lambd):
    """Unlike the forward, CPU compares here in the input's own type: a bfloat16 input
    equal to the rounded lambda gets no gradient. (CPU's two shrink backwards are one
    kernel: 0 inside [-lambd, lambd], the incoming gradient elsewhere, NaN included.)"""
    inside = (self >= -lambd) & (self <= lambd)
    return jnp.where(inside, jnp.zeros((), grad_output.dtype), grad_output)


@lower("hardsigmoid.default")
def hardsigmoid(self):
    return jnp.clip(_up(self) + 3, 0, 6) / 6


@lower("hardsigmoid_backward.default")
def hardsigmoid_backward(grad_output, self):
    g = _up(grad_output)
    return jnp.where((self > -3) & (self < 3), g / 6, 0)


@lower("hardswish.default")
def hardswish(self):
    x = _up(self)
    return x * jnp.clip(x + 3, 0, 6) / 6


@lower("hardswish_backward.default")
def hardswish_backward(grad_output, self):
    """CPU's one-sided choice at the kinks: 0 at -3, the full gradient at 3."""
    g, x = _up(grad_output), _up(self)
    return jnp.where(x <= -3, 0, jnp.where(x < 3, g * (x / 3 + 0.5), g))


@lower("softplus.default")
def softplus(self, beta=1, threshold=20):
    x = _up(self)
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta)


@lower("softplus_backward.default")
def softplus_backward(grad_output, self, beta, threshold):
    g, x = _up(grad_output), _up(self)
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, g, g * z / (z + 1))


@lower("log_sigmoid_forward.default")
def log_sigmoid_forward(self):
    x = _up(self)
    buffer = jnp.exp(-jnp.abs(x))
    return jnp.minimum(x, 0) - jnp.log1p(buffer), buffer  # (CPU's formula: 0.0 at inf)


@lower("log_sigmoid_backward.default")
def log_sigmoid_backward(grad_output, self, buffer):
    return _up(grad_output) * jax.nn.sigmoid(-_up(self))


def _glu(x, dim):
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lower("glu.default")
def glu(self, dim=-1):
    return _glu(_up(self), dim)


@lower("glu_backward.default")
def glu_backward(grad_output, self, dim):
    return _vjp(lambda x: _glu(x, dim), self, _up(grad_output))


@lower("_prelu_kernel.default")
def prelu(self, weight):
    x = _up(self)
    return jnp.where(x > 0, x, _up(weight) * x)


@lower("_prelu_kernel_backward.default")
def prelu_backward(grad_output, self, weight):
    """Both gradients at the broadcast shape: autograd sums the weight's down itself."""
    g, x = _up(grad_output), _up(self)
    positive = x > 0
    return jnp.where(positive, g, _up(weight) * g), jnp.where(positive, 0, x * g)


# ------------------------------------------------------------------- softmax


@lower("_softmax.default")
def softmax(self, dim, half_to_float):
    return jax.nn.softmax(_up(self), axis=_axis(self, dim))


@lower("_log_softmax.default")
def log_softmax(self, dim, half_to_float):
    """CPU's last-dim kernel stores the row's sum of exponentials, and then its log, in the
    input's dtype before subtracting; for half inputs that rounding shows (a row whose sum
    is 1.0038 gives exactly 0 at its max), so it is reproduced. Other dims round once."""
    x = _up(self)
    if self.dtype not in _HALF or dim % max(self.ndim, 1) != max(self.ndim, 1) - 1:
        return jax.nn.log_softmax(x, axis=_axis(self, dim))
    axis = _axis(self, dim)
    shifted = x - jnp.max(x, axis=axis, keepdims=True, initial=-jnp.inf)
    total = jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True).astype(self.dtype)
    return shifted - jnp.log(_up(total)).astype(self.dtype).astype(jnp.float32)


@lower("_safe_softmax.default")
def safe_softmax(self, dim, dtype=None):
    """Softmax whose fully masked (all -inf) rows give zeros instead of NaN, as attention needs."""
    x = _up(self) if dtype is None else self.astype(dtypes.to_jax(dtype))
    axis = _axis(x, dim)
    masked = jnp.all(x == -jnp.inf, axis=axis, keepdims=True)
    return jnp.where(masked, 0, jax.nn.softmax(x, axis=axis))


@lower("_softmax_backward_data.default")
def softmax_backward(grad_output, output, dim, input_dtype):
    g, y = _up(grad_output), _up(output)
    return y * (g - jnp.sum(g * y, axis=_axis(y, dim), keepdims=True))


@lower("_log_softmax_backward_data.default")
def log_softmax_backward(grad_output, output, dim, input_dtype):
    g, y = _up(grad_output), _up(output)
    return g - jnp.exp(y) * jnp.sum(g, axis=_axis(y, dim), keepdims=True)


# ------------------------------------------------------------- normalization


def _inv_sqrt(v):
    """1 / sqrt(v) rounded twice, as CPU computes it; XLA would otherwise rewrite it into
    its rsqrt, which differs in the last bit (316.22775 rather than 316.22778 for 1e-5)."""
    return 1 / lax.optimization_barrier(jnp.sqrt(v))


def _affine(xhat, weight, bias, shape):
    """xhat * weight + bias, the parameters reshaped to broadcast as `shape`."""
    if weight is not None:
        xhat = xhat * _up(weight).reshape(shape)
    if bias is not None:
        xhat = xhat + _up(bias).reshape(shape)
    return xhat


def _input_grad(dxhat, xhat, rstd, axes):
    """Gradient through (x - mean(x)) * rstd, mean and variance taken over `axes`."""
    return rstd * (
        dxhat
        - jnp.mean(dxhat, axes, keepdims=True)
        - xhat * jnp.mean(dxhat * xhat, axes, keepdims=True)
    )


def _param_grads(grad, xhat, axes, output_mask):
    """Weight and bias gradients (None where autograd does not want them)."""
    weight = jnp.sum(grad * xhat, axes) if output_mask[1] else None
    bias = jnp.sum(grad, axes) if output_mask[2] else None
    return weight, bias


@lower("native_layer_norm.default")
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    x = _up(input)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(x, axes, keepdims=True)
    rstd = _inv_sqrt(jnp.mean(jnp.square(x - mean), axes, keepdims=True) + eps)
    shape = tuple(normalized_shape)
    return _affine((x - mean) * rstd, weight, bias, shape), mean, rstd


@lower("native_layer_norm_backward.default")
def native_layer_norm_backward(
    grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask
):
    """CPU's formulation, xhat = rstd * x - rstd * mean rather than (x - mean) * rstd: over
    a single element the two differ (a weight gradient of -2.4e-5 rather than 0)."""
    x, g = _up(input), _up(grad_out)
    k = x.ndim - len(normalized_shape)
    axes, batch_axes = tuple(range(k, x.ndim)), tuple(range(k))
    rstd, mean = _up(rstd), _up(mean)
    xhat = rstd * x + (-rstd * mean)
    dxhat = g if weight is None else g * _up(weight)
    grad_input = None
    if output_mask[0]:
        n = max(math.prod(x.shape[k:]), 1)
        ds, db = jnp.sum(dxhat * x, axes, keepdims=True), jnp.sum(dxhat, axes, keepdims=True)
        b = (db * mean - ds) * rstd * rstd * rstd / n
        grad_input = rstd * dxhat + b * x + (-b * mean - db * rstd / n)
    return (grad_input, *_param_grads(g, xhat, batch_axes, output_mask))


def _channel(x):
    """Shape that broadcasts a per-channel vector against an (N, C, *) tensor."""
    return (1, -1) + (1,) * (x.ndim - 2)


def _batch_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _rounding(dtype):
    """Round-trip through `dtype` when it is a half type, as storing a value in it does."""
    if dtype not in _HALF:
        return lambda v: v
    return lambda v: jnp.asarray(v, jnp.float32).astype(dtype).astype(jnp.float32)


def _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd, new running_mean, new running_var) in CPU's rounding
    order (checked bit for bit against it). The saved mean and invstd are stored in the
    parameters' dtype and out = x * alpha + beta is formed from those stored values, alpha
    and beta in float32. With bfloat16 parameters the kernel also stores its intermediates
    (mean, sum of squared deviations, var = var_sum / n, momentum) in bfloat16; with
    float16 it keeps them in float32."""
    x = _up(input)
    axes, shape = _batch_axes(x), _channel(x)
    params = [p for p in (weight, bias, running_mean, running_var) if p is not None]
    param_dtype = params[0].dtype if params else input.dtype
    store = _rounding(param_dtype)
    r = store if param_dtype == jnp.bfloat16 else _rounding(None)
    if training:
        n = x.size // x.shape[1]
        mean = jnp.mean(x, axes)
        var_sum = r(jnp.sum(jnp.square(x - mean.reshape(shape)), axes))
        mean, var = r(mean), r(var_sum / r(n))
        m = r(momentum)
        if running_mean is not None:
            running_mean = r(m * mean) + r(r(1 - m) * _up(running_mean))
        if running_var is not None:
            running_var = m * r(var_sum / r(n - 1)) + r(r(1 - m) * _up(running_var))
        mean, invstd = store(mean), store(_inv_sqrt(var + eps))
    else:
        mean, invstd = _up(running_mean), _inv_sqrt(_up(running_var) + eps)
    alpha = invstd if weight is None else invstd * _up(weight)
    beta = -mean * alpha if bias is None else _up(bias) - mean * alpha
    out = x * alpha.reshape(shape) + beta.reshape(shape)
    return out, mean, invstd, running_mean, running_var


@lower(
    "native_batch_norm.default",
    "_native_batch_norm_legit.default",
    writes=("running_mean", "running_var"),
)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)


@lower("_native_batch_norm_legit.no_stats")
def batch_norm_no_stats(input, weight, bias, training, momentum, eps):
    return _batch_norm(input, weight, bias, None, None, training, momentum, eps)[:3]


@lower("_native_batch_norm_legit_no_training.default")
def batch_norm_no_training(input, weight, bias, running_mean, running_var, momentum, eps):
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@lower("_batch_norm_with_update.default", writes=("running_mean", "running_var"))
def batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, new_mean, new_var = _batch_norm(
        input, weight, bias, running_mean, running_var, True, momentum, eps
    )
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8), new_mean, new_var


def _batch_norm_grads(grad_out, input, weight, mean, invstd, train, output_mask):
    """Input gradient always (PyTorch's meta kernel promises one whatever the mask says),
    weight and bias gradients as the mask asks."""
    x, g = _up(input), _up(grad_out)
    axes, shape = _batch_axes(x), _channel(x)
    invstd = _up(invstd).reshape(shape)
    xhat = (x - _up(mean).reshape(shape)) * invstd
    dxhat = g if weight is None else g * _up(weight).reshape(shape)
    grad_input = _input_grad(dxhat, xhat, invstd, axes) if train else dxhat * invstd
    return (grad_input, *_param_grads(g, xhat, axes, output_mask))


@lower("native_batch_norm_backward.default")
def native_batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
    output_mask,
):
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean, invstd = running_mean, _inv_sqrt(_up(running_var) + eps)
    return _batch_norm_grads(grad_out, input, weight, mean, invstd, train, output_mask)


@lower("batch_norm_backward.default")
def batch_norm_backward(
    grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
    output_mask, reserve,
):
    return native_batch_norm_backward(
        grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps,
        output_mask,
    )


@lower("native_group_norm.default")
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    # (sizes spelt out: an empty batch has no -1 to infer, and CPU returns it empty)
    x = _up(input).reshape(N, group, C // group * HxW)
    mean = jnp.mean(x, -1)
    rstd = _inv_sqrt(jnp.mean(jnp.square(x - mean[..., None]), -1) + eps)
    xhat = ((x - mean[..., None]) * rstd[..., None]).reshape(input.shape)
    return _affine(xhat, weight, bias, _channel(input)), mean, rstd


@lower("native_group_norm_backward.default")
def native_group_norm_backward(
    grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask
):
    x = _up(input).reshape(N, group, C // group * HxW)
    rstd = _up(rstd)[..., None]
    xhat = (x - _up(mean)[..., None]) * rstd
    g = _up(grad_out).reshape(N, C, HxW)
    dxhat = g if weight is None else g * _up(weight)[:, None]
    grad_input = None
    if output_mask[0]:
        grad_input = _input_grad(dxhat.reshape(x.shape), xhat, rstd, -1).reshape(input.shape)
    return (grad_input, *_param_grads(g, xhat.reshape(g.shape), (0, 2), output_mask))


# ------------------------------------------------------------------- dropout


@lower("native_dropout.default", random=True)
def native_dropout(key, input, p, train):
    if train is not None and not train:
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = draw(lambda k, shape: jax.random.bernoulli(k, 1 - p, shape), key, input.shape)
    scale = 0.0 if p == 1 else 1 / (1 - p)
    return input * keep.astype(input.dtype) * scale, keep


@lower("native_dropout_backward.default")
def native_dropout_backward(grad_output, mask, scale):
    return grad_output * (mask.astype(grad_output.dtype) * scale)


# ----------------------------------------------------------------- embedding


def _embedding_device_check(weight, indices, *rest) -> list:
    return [(outside(indices, 0, weight.shape[0]), IndexError, "index out of range in self")]


@lower("embedding.default", device_check=_embedding_device_check)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lower("embedding_renorm.default")
def embedding_renorm(self, indices, max_norm, norm_type):
    """Rows looked up by `indices` whose norm exceeds max_norm are scaled to it; CPU takes
    the norm in the weight's dtype (rounded) and divides by norm + 1e-7."""
    x = _up(self)
    used = jnp.zeros(self.shape[0], jnp.bool_).at[indices.reshape(-1)].set(True)
    norm = _up(jnp.linalg.norm(x, ord=norm_type, axis=-1).astype(self.dtype))
    scale = max_norm / (norm + 1e-7)
    return jnp.where((used & (norm > max_norm))[:, None], x * scale[:, None], x)


@lower("embedding_dense_backward.default")
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    index = indices.reshape(-1)
    grad = _up(grad_output).reshape(index.shape[0], -1)
    if padding_idx >= 0:
        grad = jnp.where((index == padding_idx)[:, None], 0, grad)
    if scale_grad_by_freq:
        counts = jnp.zeros(num_weights, grad.dtype).at[index].add(1)
        grad = grad / counts[index][:, None]
    return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[index].add(grad)


# -------------------------------------------------------------------- losses

_MEAN, _SUM = 1, 2  # PyTorch's Reduction enum; 0 is "none"


def _reduce(loss, reduction):
    if reduction == _MEAN:
        return jnp.mean(loss)
    return jnp.sum(loss) if reduction == _SUM else loss


def _reduce_grad(grad_output, loss_size, reduction):
    """The upstream gradient of each loss element."""
    g = _up(grad_output)
    return g / loss_size if reduction == _MEAN else g


def _nll_parts(self, target, weight, ignore_index):
    """Class axis, safe target indices and each element's weight (0 where ignored)."""
    class_axis = 0 if self.ndim == 1 else 1
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    w = jnp.ones(target.shape, jnp.float32) if weight is None else _up(weight)[safe]
    return class_axis, safe, jnp.where(valid, w, 0)


def _check_nll_loss(values: list) -> None:
    """CPU's checks that PyTorch's meta kernel misses: a float target (meta fails in a
    gather with another message) and a weight of another dtype than the input (meta
    accepts it; tpu computed a loss CPU refuses)."""
    self, target, weight = values[0], values[1], values[2]
    if target.dtype not in (torch.long, torch.uint8):
        raise RuntimeError(
            f"expected target dtype to be Long or Byte, but got {scalar_type_name(target.dtype)}"
        )
    if weight is not None and weight.dtype != self.dtype:
        raise RuntimeError(
            f"expected scalar type {scalar_type_name(self.dtype)} "
            f"but found {scalar_type_name(weight.dtype)}"
        )


def _nll_loss_device_check(self, target, weight, reduction, ignore_index) -> list:
    classes = self.shape[0 if self.ndim == 1 else 1]
    bad = (target != ignore_index) & ((target < 0) | (target >= classes))
    return [(jnp.any(bad), IndexError, "a target is out of bounds")]


@lower(
    "nll_loss_forward.default",
    "nll_loss2d_forward.default",
    check=_check_nll_loss,
    device_check=_nll_loss_device_check,
)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    x = _up(self)
    axis, safe, w = _nll_parts(x, target, weight, ignore_index)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, axis), axis).squeeze(axis)
    loss = -picked * w
    total = jnp.sum(w)
    if reduction == _MEAN:
        return jnp.sum(loss) / total, total
    if reduction == _SUM:
        return jnp.sum(loss), total
    return loss, jnp.zeros((), w.dtype)


@lower("nll_loss_backward.default", "nll_loss2d_backward.default")
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    """An ignored target's row is left 0, as CPU's kernel skips it: with every target
    ignored, a mean's 1 / total_weight is inf, and inf * 0 made the whole row NaN (a
    batch of padding only poisoned the weights where CPU's gradient is 0)."""
    axis, safe, w = _nll_parts(self, target, weight, ignore_index)
    g = _up(grad_output)
    if reduction == _MEAN:
        g = g / _up(total_weight)
    classes = jnp.arange(self.shape[axis]).reshape((-1,) + (1,) * (self.ndim - axis - 1))
    hit = jnp.expand_dims(safe, axis) == classes
    hit = hit & jnp.expand_dims(target != ignore_index, axis)
    return jnp.where(hit, jnp.expand_dims(-g * w, axis), 0)


def _check_margin_input(self) -> None:
    """The margin losses' input: a non-empty vector or matrix, or a 0-d tensor."""
    if not (self.dim() == 0 or (self.dim() <= 2 and self.shape[-1] != 0)):
        raise RuntimeError(
            "Expected non-empty vector or matrix with optional 0-dim batch size, "
            f"but got: {list(self.shape)}"
        )


def _check_scalar_type(t, dtype) -> None:
    if t is not None and t.dtype != dtype:
        raise RuntimeError(
            f"expected scalar type {scalar_type_name(dtype)} but found {scalar_type_name(t.dtype)}"
        )


def _check_multi_margin_loss(values: list) -> None:
    """CPU's checks, in CPU's order and words: PyTorch's meta kernel says "inconsistent
    target size" and fails a float target in a gather."""
    self, target, p, _, weight = values[:5]
    if p not in (1, 2):
        raise RuntimeError("only p == 1 and p == 2 supported")
    _check_margin_input(self)
    frames = self.shape[0] if self.dim() == 2 else 1
    if target.dim() > 1 or target.numel() != frames:
        raise RuntimeError(
            "multi_margin_loss: target tensor should be 1-D with size equal to the number of "
            f"input samples (batch size). Expected target size [{frames}], but got "
            f"{list(target.shape)}. Input has shape {list(self.shape)}."
        )
    classes = self.shape[-1] if self.dim() else 1
    if weight is not None and (weight.dim() > 1 or weight.numel() != classes):
        raise RuntimeError(
            f"inconsistent weight size, expected {classes} but got {list(weight.shape)}"
        )
    _check_scalar_type(target, torch.long)
    _check_scalar_type(weight, self.dtype)


def _class_outside(self, target, *rest) -> list:
    """CPU's refusal of a target class outside [0, classes), judged on the device."""
    classes = self.shape[-1] if self.ndim else 1
    return [(jnp.any((target < 0) | (target >= classes)), RuntimeError, "target out of range")]


@lower(
    "multi_margin_loss.default",
    static_scalars=True,
    skip_meta=True,
    check=_check_multi_margin_loss,
    device_check=_class_outside,
)
def multi_margin_loss(self, target, p=1, margin=1, weight=None, reduction=_MEAN):
    """Each sample: the mean over the other classes of max(0, margin - x[y] + x[j])^p,
    times weight[y]. The check does all of CPU's checks, so PyTorch's meta kernel is
    skipped: it gives a 0-d input and target an unreduced loss of shape (1,), CPU ()."""
    x = _up(self).reshape(-1, self.shape[-1] if self.ndim else 1)
    y = target.reshape(-1, 1)
    gap = jnp.maximum(margin - jnp.take_along_axis(x, y, 1) + x, 0)
    hinge = gap if p == 1 else gap * gap
    if weight is not None:
        hinge = hinge * jnp.take(_up(weight).reshape(-1), y)
    hinge = jnp.where(jnp.arange(x.shape[1]) == y, 0, hinge)
    loss = (jnp.sum(hinge, 1) / x.shape[1]).reshape(target.shape)
    return _reduce(loss, reduction).astype(self.dtype)


def _margin_step(x, reduction):
    """CPU's margin-loss backwards' unit gradient, in x's type: one over the classes of
    x [samples, classes], and over the samples too for a mean."""
    samples, classes = x.shape
    return x.dtype.type(1.0 / (samples * classes) if reduction == _MEAN else 1.0 / classes)


def _listed_targets(target, shape):
    """(listed, safe) for a multilabel target of `shape` [samples, classes]: which slots
    list a class (those before the first negative entry), and the slots' classes with
    the unlisted ones at 0 (safe to gather)."""
    y = target.reshape(shape)
    listed = jnp.cumprod(y >= 0, axis=1).astype(jnp.bool_)
    return listed, jnp.where(listed, y, 0)


def _margin_grad_scale(grad, grad_output, reduction):
    """CPU's margin-loss backwards: a per-element gradient already divided by the
    classes (and the samples, for a mean), times the incoming gradient, per sample when
    the loss was not reduced."""
    g = _up(grad_output)
    if reduction == 0 and g.ndim:
        return grad * g.reshape(-1, 1)
    return grad * g


@lower("multi_margin_loss_backward.default", static_scalars=True)
def multi_margin_loss_backward(
    grad_output, self, target, p, margin, weight=None, reduction=_MEAN
):
    """CPU's formula: each other class d with a positive gap z gets 1 (p = 1) or 2 z
    (p = 2), times weight[y], over the classes (and samples); the target class gets
    minus their sum."""
    x = _up(self).reshape(-1, self.shape[-1] if self.ndim else 1)
    y = target.reshape(-1, 1)
    step = _margin_step(x, reduction)
    z = margin - jnp.take_along_axis(x, y, 1) + x
    h = jnp.full(x.shape, step, x.dtype) if p == 1 else 2 * step * z
    if weight is not None:
        h = h * jnp.take(_up(weight).reshape(-1), y)
    other = jnp.arange(x.shape[1]) != y
    h = jnp.where(other & (z > 0), h, 0)
    grad = jnp.where(other, h, -jnp.sum(h, 1, keepdims=True))
    grad = _margin_grad_scale(grad, grad_output, reduction)
    return grad.reshape(self.shape).astype(self.dtype)


def _check_multilabel_margin_loss(values: list) -> None:
    """CPU's checks (the meta kernel is skipped, see the lowering)."""
    self, target = values[0], values[1]
    _check_margin_input(self)
    batched = self.dim() == 2
    fits = target.shape == self.shape if batched else target.numel() == self.numel()
    if not fits or target.dim() > (2 if batched else 1):
        raise RuntimeError(
            f"inconsistent target size: {list(target.shape)} for input of size: "
            f"{list(self.shape)}"
        )
    _check_scalar_type(target, torch.long)


def _listed_class_outside(self, target, *rest) -> list:
    """CPU's refusal of a multilabel target entry below -1 or not below the classes
    (after the first -1 too), judged on the device."""
    classes = self.shape[-1] if self.ndim else 1
    bad = jnp.any((target < -1) | (target >= classes))
    return [(bad, RuntimeError, "argument #2 'target' is out of range")]


@lower(
    "multilabel_margin_loss_forward.default",
    skip_meta=True,
    check=_check_multilabel_margin_loss,
    device_check=_listed_class_outside,
)
def multilabel_margin_loss_forward(self, target, reduction):
    """Each sample: over its listed classes t (the target's entries before the first
    negative one) and the unlisted classes d, the sum of max(0, 1 - x[t] + x[d]), over the
    number of classes. PyTorch 2.13's decomposition, which ran before, counted the slots
    after the -1 as class 0, and its meta kernel gives an unbatched unreduced loss shape
    (1,) where CPU gives ()."""
    classes = self.shape[-1] if self.ndim else 1
    x = _up(self).reshape(-1, classes)
    listed, safe = _listed_targets(target, x.shape)
    rows = jnp.arange(x.shape[0])[:, None]
    is_target = jnp.zeros(x.shape, jnp.int32).at[rows, safe].add(listed.astype(jnp.int32)) > 0
    picked = jnp.take_along_axis(x, safe, 1)
    gap = jnp.maximum(1 - picked[:, :, None] + x[:, None, :], 0)
    gap = jnp.where(listed[:, :, None] & ~is_target[:, None, :], gap, 0)
    loss = jnp.sum(gap, (1, 2)) / classes
    if reduction == 0 and target.ndim <= 1:
        loss = loss.reshape(())
    loss = _reduce(loss, reduction).astype(self.dtype)
    return loss, is_target.astype(self.dtype).reshape(target.shape)


@lower("multilabel_margin_loss_backward.default")
def multilabel_margin_loss_backward(grad_output, self, target, reduction, is_target):
    """CPU's formula: for each listed target t and each class d not a target (the given
    is_target) with 1 - x[t] + x[d] > 0, d gains and t loses one step of 1 / classes
    (of samples x classes for a mean)."""
    x = _up(self).reshape(-1, self.shape[-1] if self.ndim else 1)
    listed, safe = _listed_targets(target, x.shape)
    targets = is_target.reshape(x.shape) != 0
    picked = jnp.take_along_axis(x, safe, 1)
    active = listed[:, :, None] & ~targets[:, None, :]
    active = active & (1 - picked[:, :, None] + x[:, None, :] > 0)  # [N, listed, d]
    step = _margin_step(x, reduction)
    gained = jnp.sum(active, 1).astype(x.dtype) * step
    lost = jnp.sum(active, 2).astype(x.dtype) * step  # per listed slot
    rows = jnp.arange(x.shape[0])[:, None]
    grad = gained.at[rows, safe].add(jnp.where(listed, -lost, 0))
    grad = _margin_grad_scale(grad, grad_output, reduction)
    return grad.reshape(self.shape).astype(self.dtype)


@lower("mse_loss.default")
def mse_loss(self, target, reduction=_MEAN):
    return _reduce(jnp.square(_up(self) - _up(target)), reduction)


@lower("mse_loss_backward.default")
def mse_loss_backward(grad_output, self, target, reduction):
    diff = _up(self) - _up(target)
    return 2 * diff * _reduce_grad(grad_output, diff.size, reduction)


def _check_beta(values: list) -> bool:
    if values[3] < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    return False


@lower("smooth_l1_loss.default", check=_check_beta)
def smooth_l1_loss(self, target, reduction=_MEAN, beta=1.0):
    d = jnp.abs(_up(self) - _up(target))
    if beta == 0:
        return _reduce(d, reduction)
    return _reduce(jnp.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta), reduction)


@lower("smooth_l1_loss_backward.default")
def smooth_l1_loss_backward(grad_output, self, target, reduction, beta):
    diff = _up(self) - _up(target)
    g = _reduce_grad(grad_output, diff.size, reduction)
    inner = jnp.sign(diff) if beta == 0 else diff / beta
    return g * jnp.where(diff < -beta, -1.0, jnp.where(diff > beta, 1.0, inner))


@lower("huber_loss.default")
def huber_loss(self, target, reduction=_MEAN, delta=1.0):
    d = jnp.abs(_up(self) - _up(target))
    return _reduce(jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


@lower("huber_loss_backward.default")
def huber_loss_backward(grad_output, self, target, reduction, delta):
    diff = _up(self) - _up(target)
    g = _reduce_grad(grad_output, diff.size, reduction)
    return g * jnp.clip(diff, -delta, delta)


def outside_unit_interval(x):
    """Traced: whether any element of x lies outside [0, 1] (NaN does)."""
    return ~jnp.all((x >= 0) & (x <= 1))


def _probabilities_outside(self, target, *rest) -> list:
    """CPU's refusals of a probability or target outside [0, 1], judged on the device
    (engine/device_asserts.py)."""
    words = "all elements of {} should be between 0 and 1"
    return [
        (outside_unit_interval(self), RuntimeError, words.format("input")),
        (outside_unit_interval(target), RuntimeError, words.format("target")),
    ]


@lower("binary_cross_entropy.default", device_check=_probabilities_outside)
def binary_cross_entropy(self, target, weight=None, reduction=_MEAN):
    x, t = _up(self), _up(target)
    loss = (t - 1) * jnp.maximum(jnp.log1p(-x), -100) - t * jnp.maximum(jnp.log(x), -100)
    if weight is not None:
        loss = loss * _up(weight)
    return _reduce(loss, reduction)


@lower("binary_cross_entropy_backward.default")
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=_MEAN):
    x, t = _up(self), _up(target)
    grad = (x - t) / jnp.maximum((1 - x) * x, 1e-12) * _reduce_grad(grad_output, x.size, reduction)
    return grad if weight is None else grad * _up(weight)


@lower("binary_cross_entropy_with_logits.default")
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None, reduction=_MEAN):
    x, t = _up(self), _up(target)
    log_sigmoid_neg = jnp.log1p(jnp.exp(-jnp.abs(x))) + jnp.maximum(-x, 0)  # -log(sigmoid(x))
    if pos_weight is not None:
        log_sigmoid_neg = log_sigmoid_neg * ((_up(pos_weight) - 1) * t + 1)
    loss = (1 - t) * x + log_sigmoid_neg
    if weight is not None:
        loss = loss * _up(weight)
    return _reduce(loss, reduction)


# --------------------------------------------------------------- convolution


def _conv_precision(x):
    """Half inputs accumulate in float32 (rounded once by the engine), as CPU kernels do."""
    if x.dtype in _HALF:
        return {"preferred_element_type": jnp.float32, "precision": precision.matmul()}
    return {"precision": precision.matmul()}


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    spatial = x.ndim - 2
    # aten::convolution takes one value for every spatial dim ([0] from padding="valid")
    stride, padding, dilation, output_padding = (
        _expand(v, spatial) for v in (stride, padding, dilation, output_padding)
    )
    if x.shape[1] == 0 and not transposed:  # no input channels: PyTorch gives no output ones
        one = jax.ShapeDtypeStruct(x.shape[:1] + (1,) + x.shape[2:], x.dtype)
        kernel = jax.ShapeDtypeStruct((1, 1) + w.shape[2:], w.dtype)
        plain = jax.eval_shape(
            lambda a, b: _conv(a, b, stride, padding, dilation, False, output_padding, 1),
            one, kernel,
        )
        return jnp.zeros(x.shape[:1] + (0,) + plain.shape[2:], plain.dtype)
    names = "DHW"[3 - spatial :]  # PyTorch convolves 1, 2 or 3 spatial dimensions
    numbers = ("NC" + names, "OI" + names, "NC" + names)
    if not transposed:
        return lax.conv_general_dilated(
            x, w, tuple(stride), [(p, p) for p in padding], rhs_dilation=tuple(dilation),
            dimension_numbers=numbers, feature_group_count=groups, **_conv_precision(x),
        )
    # A transposed convolution is the input-gradient of a plain one: dilate the input by
    # the stride and convolve with the flipped kernel, its in/out channels swapped per group.
    c_in, kernel = w.shape[0], w.shape[2:]
    w = w.reshape(groups, c_in // groups, -1, *kernel).swapaxes(1, 2)
    w = jnp.flip(w.reshape(-1, c_in // groups, *kernel), tuple(range(2, 2 + spatial)))
    pads = [
        (d * (k - 1) - p, d * (k - 1) - p + extra)
        for k, p, d, extra in zip(kernel, padding, dilation, output_padding)
    ]
    return lax.conv_general_dilated(
        x, w, (1,) * spatial, pads, lhs_dilation=tuple(stride), rhs_dilation=tuple(dilation),
        dimension_numbers=numbers, feature_group_count=groups, **_conv_precision(x),
    )


def _convolution_layout(values: list, result):
    """CPU's kernels give a channels_last result when the input or the weight is
    channels_last (4-D; 5-D only in float32 and bfloat16, which oneDNN computes: its
    3-D kernel for the other dtypes leaves them contiguous); PyTorch's meta kernel does
    so only for CUDA tensors."""
    input, weight = values[0], values[1]
    if result.dim() == 5 and result.dtype not in (torch.float32, torch.bfloat16):
        return result
    if result.dim() not in (4, 5):
        return result
    channels_last = torch.channels_last if result.dim() == 4 else torch.channels_last_3d
    if channels_last in (suggest_memory_format(input), suggest_memory_format(weight)):
        return in_memory_format(result, channels_last)
    return result


def _check_channels(values: list) -> bool:
    """CPU's words for an input with the wrong number of channels, the commonest
    convolution mistake; PyTorch's meta kernel says only "Invalid channel dimensions"."""
    input, weight, transposed, groups = values[0], values[1], values[6], values[8]
    if input.dim() < 3 or weight.dim() != input.dim() or groups <= 0:
        return False
    expected = weight.shape[0] if transposed else weight.shape[1] * groups
    if input.shape[1] != expected:
        given = "transposed=1" if transposed else f"groups={groups}"
        raise RuntimeError(
            f"Given {given}, weight of size {list(weight.shape)}, expected "
            f"input{list(input.shape)} to have {expected} channels, but got "
            f"{input.shape[1]} channels instead"
        )
    return False


@lower("convolution.default", check=_check_channels, result_layout=_convolution_layout)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    out = _conv(input, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is None or out.shape[1] != bias.shape[0]:  # (no channels: the bias is unused)
        return out
    return out + _up(bias).reshape(_channel(out))


@lower("convolution_backward.default")
def convolution_backward(
    grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask,
):
    def forward(x, w):
        return _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)

    out, pull = jax.vjp(forward, input, weight)
    grad_input, grad_weight = pull(grad_output.astype(out.dtype))  # half: float32 (accumulated)
    grad_bias = None
    if output_mask[2]:
        grad_bias = jnp.sum(_up(grad_output), _batch_axes(grad_output))
        if grad_bias.shape != tuple(bias_sizes):  # (no channels: the bias was unused)
            grad_bias = jnp.zeros(tuple(bias_sizes), grad_bias.dtype)
    return (
        grad_input if output_mask[0] else None,
        grad_weight if output_mask[1] else None,
        grad_bias,
    )


# ------------------------------------------------------------------- pooling


def _expand(values, n, default=None):
    """An int[n] argument as an n-tuple: PyTorch also accepts one value, or [] for a default."""
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    if not values:
        return default
    return values * n if len(values) == 1 else values


def _pool_size(size, k, s, p, d, ceil_mode):
    """Output length of a pooling window sweep, PyTorch's rule."""
    span = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = span // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _windows(x, kernel, stride, padding, dilation, ceil_mode, fill):
    """Every kernel offset's strided view of the padded input: (..., K, *out), the flat
    input index each element came from: (K, *out), and whether it is an input element
    rather than padding: (K, *out)."""
    n = len(kernel)
    lead, sizes = x.ndim - n, x.shape[x.ndim - n :]
    outs = [_pool_size(*geo, ceil_mode) for geo in zip(sizes, kernel, stride, padding, dilation)]
    config = [(0, 0, 0)] * lead + [
        (p, (o - 1) * s + d * (k - 1) + 1 - size - p, 0)
        for size, k, s, p, d, o in zip(sizes, kernel, stride, padding, dilation, outs)
    ]
    padded = lax.pad(x, jnp.asarray(fill, x.dtype), config)
    views, flat, inside = [], [], []
    strides = np.cumprod((1,) + sizes[::-1])[-2::-1]  # row-major strides of the spatial dims
    for offset in itertools.product(*(range(k) for k in kernel)):
        start = [0] * lead + [i * d for i, d in zip(offset, dilation)]
        ends = [b + (o - 1) * s + 1 for b, o, s in zip(start[lead:], outs, stride)]
        limit = list(x.shape[:lead]) + ends
        views.append(lax.slice(padded, start, limit, [1] * lead + list(stride)))
        index, real = 0, True
        geometry = zip(offset, outs, stride, padding, dilation, sizes)
        for axis, (i, o, s, p, d, size) in enumerate(geometry):
            position = (np.arange(o) * s - p + i * d).reshape((-1,) + (1,) * (n - axis - 1))
            index = index + position * strides[axis]
            real = real & (position >= 0) & (position < size)
        flat.append(np.broadcast_to(index, outs))
        inside.append(np.broadcast_to(real, outs))
    return jnp.stack(views, lead), np.stack(flat), np.stack(inside)


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, n):
    kernel = _expand(kernel_size, n)
    stride = _expand(stride, n, kernel)
    padding, dilation = _expand(padding, n), _expand(dilation, n)
    fill = _lowest(self.dtype)
    views, flat, inside = _windows(self, kernel, stride, padding, dilation, ceil_mode, fill)
    lead = self.ndim - n
    values = jnp.max(views, axis=lead)
    best = _window_choice(views, values, inside, lead)
    indices = jnp.take_along_axis(jnp.asarray(flat), best.reshape((-1,) + best.shape[lead:]), 0)
    return values, indices.reshape(best.shape).astype(jnp.int64)


def _window_choice(views, values, inside, axis):
    """Which window element CPU's kernel reports: it scans input elements only (never
    the padding, which ties with an all -inf or all-lowest window), keeps the first
    maximum, and takes every NaN it meets, so the last NaN wins."""
    hit = jnp.logical_and(inside, views == jnp.expand_dims(values, axis))
    first = jnp.argmax(hit, axis=axis)
    if not jnp.issubdtype(views.dtype, jnp.floating):
        return first
    nan = jnp.logical_and(inside, jnp.isnan(views))
    last_nan = views.shape[axis] - 1 - jnp.argmax(jnp.flip(nan, axis), axis=axis)
    return jnp.where(jnp.any(nan, axis=axis), last_nan, first)


def _check_max_pool2d(values: list) -> None:
    """PyTorch's meta kernel indexes dim -3 before checking the rank: a 1-D or 2-D input
    raised an IndexError where CPU raises this RuntimeError."""
    if values[0].dim() not in (3, 4):
        raise RuntimeError("non-empty 3D or 4D (batch mode) tensor expected for input")


@lower("max_pool2d_with_indices.default", check=_check_max_pool2d)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 2)


def _unbatched_channels_last_3d(values: list, result):
    """CPU pools an unbatched (C, D, H, W) input as its batch of one: when that is
    channels_last_3d, so are the output and indices (squeezed back to 4-D); PyTorch's
    meta kernel leaves them contiguous."""
    if values[0].dim() != 4:
        return result
    batch = values[0].unsqueeze(0)
    if batch.is_contiguous() or not batch.is_contiguous(memory_format=torch.channels_last_3d):
        return result
    return tuple(in_memory_format(r.unsqueeze(0), torch.channels_last_3d)[0] for r in result)


@lower("max_pool3d_with_indices.default", result_layout=_unbatched_channels_last_3d)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool(self, kernel_size, stride, padding, dilation, ceil_mode, 3)


def _scatter_max_grad(grad_output, self, indices, n):
    """Route each output's gradient to the input element its max came from."""
    lead = self.shape[: self.ndim - n]
    rows = math.prod(lead)
    grad = _up(grad_output).reshape(rows, math.prod(grad_output.shape[self.ndim - n :]))
    index = indices.reshape(grad.shape)
    plane = math.prod(self.shape[self.ndim - n :])
    out = jnp.zeros((rows, plane), grad.dtype).at[jnp.arange(rows)[:, None], index].add(grad)
    return out.reshape(self.shape)


@lower("max_pool2d_with_indices_backward.default")
def max_pool2d_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _scatter_max_grad(grad_output, self, indices, 2)


@lower("max_pool3d_with_indices_backward.default")
def max_pool3d_backward(
    grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices
):
    return _scatter_max_grad(grad_output, self, indices, 3)


def _unpool_device_check(self, indices, output_size, *stride_and_padding) -> list:
    """CPU refuses an index outside the output plane; PyTorch's decomposition wrote it
    into the flattened batch, so it landed in the next channel's plane."""
    size = "x".join(str(int(s)) for s in output_size)
    words = f"Found an invalid max index (output volumes are of size {size})"
    return [(outside(indices, 0, math.prod(output_size)), RuntimeError, words)]


@lower(
    "max_unpool2d.default", "max_unpool3d.default", device_check=_unpool_device_check
)
def max_unpool(self, indices, output_size, *stride_and_padding):
    """Each value written at its index within its own (batch, channel) plane."""
    n = len(output_size)
    lead = self.shape[: self.ndim - n]
    rows, plane = math.prod(lead), math.prod(output_size)
    values = self.reshape(rows, math.prod(self.shape[self.ndim - n :]))
    index = indices.reshape(values.shape)
    out = jnp.zeros((rows, plane), self.dtype)
    out = out.at[jnp.arange(rows)[:, None], index].set(values, mode="drop")
    return out.reshape(lead + tuple(output_size))


def _avg_divisor(size, k, s, p, out, count_include_pad):
    """Per output position along one axis: how many elements its window averages."""
    start = np.arange(out) * s - p
    end = np.minimum(start + k, size + p)
    if count_include_pad:
        return end - start
    return np.minimum(end, size) - np.maximum(start, 0)


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor, n):
    kernel = _expand(kernel_size, n)
    stride, padding = _expand(stride, n, kernel), _expand(padding, n)
    x = _up(x)
    views, _, _ = _windows(x, kernel, stride, padding, (1,) * n, ceil_mode, 0)
    total = jnp.sum(views, axis=x.ndim - n)
    if divisor:
        return total / divisor
    counts = np.ones(())
    geometry = zip(x.shape[x.ndim - n :], kernel, stride, padding, total.shape[x.ndim - n :])
    for size, k, s, p, out in geometry:
        counts = np.multiply.outer(counts, _avg_divisor(size, k, s, p, out, count_include_pad))
    return total / jnp.asarray(counts, total.dtype)


@lower("avg_pool2d.default")
def avg_pool2d(
    self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
    divisor_override=None,
):
    args = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return _avg_pool(self, *args, 2)


@lower("avg_pool3d.default")
def avg_pool3d(
    self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
    divisor_override=None,
):
    args = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return _avg_pool(self, *args, 3)


@lower("avg_pool2d_backward.default")
def avg_pool2d_backward(grad_output, self, *args):
    return _vjp(lambda x: _avg_pool(x, *args, 2), self, grad_output)


@lower("avg_pool3d_backward.default")
def avg_pool3d_backward(grad_output, self, *args):
    return _vjp(lambda x: _avg_pool(x, *args, 3), self, grad_output)


def _adaptive_bounds(size, out):
    """PyTorch's adaptive windows along one axis: [floor(i*size/out), ceil((i+1)*size/out))."""
    i = np.arange(out)
    return (i * size) // out, -((-(i + 1) * size) // out)


def _adaptive_avg(x, output_size):
    x = _up(x)
    n = len(output_size)
    for axis, out in zip(range(x.ndim - n, x.ndim), output_size):
        start, end = _adaptive_bounds(x.shape[axis], out)
        j = np.arange(x.shape[axis])
        inside = (j >= start[:, None]) & (j < end[:, None])
        weights = jnp.asarray(inside / (end - start)[:, None], x.dtype)  # (out, size)
        x = jnp.moveaxis(
            jnp.tensordot(x, weights, ([axis], [1]), precision=lax.Precision.HIGHEST), -1, axis
        )
    return x


@lower("_adaptive_avg_pool2d.default", "_adaptive_avg_pool3d.default")
def adaptive_avg_pool(self, output_size):
    return _adaptive_avg(self, tuple(output_size))


def _check_grad_output_not_empty(name: str, ranks: tuple[int, int]):
    """CPU's check that an adaptive pooling backward's grad_output has no empty non-batch
    dimension, in CPU's words (PyTorch's meta kernels word it otherwise, adaptive_avg_
    pool2d's with a run of spaces in the middle)."""

    def check(values: list) -> bool:
        grad_output = values[0]
        if grad_output.dim() in ranks:
            for i in range(1, grad_output.dim()):
                if grad_output.size(i) == 0:
                    raise RuntimeError(
                        f"{name}(): Expected grad_output to have non-zero size for non-batch "
                        f"dimensions, but grad_output has sizes {list(grad_output.shape)} with "
                        f"dimension {i} being empty"
                    )
        return False

    return check


@lower(
    "_adaptive_avg_pool2d_backward.default",
    check=_check_grad_output_not_empty("adaptive_avg_pool2d_backward", (3, 4)),
)
def adaptive_avg_pool2d_backward(grad_output, self):
    return _vjp(lambda x: _adaptive_avg(x, grad_output.shape[-2:]), self, grad_output)


@lower(
    "_adaptive_avg_pool3d_backward.default",
    check=_check_grad_output_not_empty("adaptive_avg_pool3d_backward", (4, 5)),
)
def adaptive_avg_pool3d_backward(grad_output, self):
    return _vjp(lambda x: _adaptive_avg(x, grad_output.shape[-3:]), self, grad_output)


def _adaptive_max(x, output_size):
    """Gather each (variable-size) window padded to the largest by repeating its last
    element, then take max and argmax over it."""
    n = len(output_size)
    lead, sizes = x.ndim - n, x.shape[x.ndim - n :]
    if 0 in output_size or 0 in x.shape[:lead]:
        shape = x.shape[:lead] + tuple(output_size)
        return jnp.zeros(shape, x.dtype), jnp.zeros(shape, jnp.int64)
    strides = np.cumprod((1,) + sizes[::-1])[-2::-1]
    flat = np.zeros(())
    for axis, (size, out) in enumerate(zip(sizes, output_size)):
        start, end = _adaptive_bounds(size, out)
        width = int(np.max(end - start))
        positions = np.minimum(start[:, None] + np.arange(width), end[:, None] - 1)  # (out, k)
        x = jnp.take(x, positions.reshape(-1), axis=lead + 2 * axis)
        x = x.reshape(x.shape[: lead + 2 * axis] + (out, width) + x.shape[lead + 2 * axis + 1 :])
        flat = np.add.outer(flat, positions * strides[axis])
    # (..., o1, k1, o2, k2, ...) -> (..., o1, o2, ..., k1 * k2 * ...)
    order = [2 * a for a in range(n)] + [2 * a + 1 for a in range(n)]
    x = x.transpose(tuple(range(lead)) + tuple(lead + a for a in order))
    x = x.reshape(x.shape[: lead + n] + (-1,))
    flat = flat.transpose(order).reshape(tuple(output_size) + (-1,))
    values = jnp.max(x, axis=-1)
    best = _window_choice(x, values, True, x.ndim - 1)
    indices = jnp.take_along_axis(jnp.broadcast_to(flat, x.shape), best[..., None], -1)[..., 0]
    return values, indices.astype(jnp.int64)


@lower("adaptive_max_pool2d.default", "adaptive_max_pool3d.default")
def adaptive_max_pool(self, output_size):
    return _adaptive_max(self, tuple(output_size))


@lower(
    "adaptive_max_pool2d_backward.default",
    check=_check_grad_output_not_empty("adaptive_max_pool2d_backward", (3, 4)),
)
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _scatter_max_grad(grad_output, self, indices, 2)


@lower(
    "adaptive_max_pool3d_backward.default",
    check=_check_grad_output_not_empty("adaptive_max_pool3d_backward", (4, 5)),
)
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _scatter_max_grad(grad_output, self, indices, 3)


# ---------------------------------------------------------------- upsampling


def _source_scale(size, out, scale, align_corners=False, dtype=np.float32):
    """PyTorch's input-per-output step along one axis, in the dtype its kernels use:
    float32, or float64 for a float64 image (its linear and cubic kernels' opmath)."""
    if align_corners:
        return dtype((size - 1) / (out - 1)) if out > 1 else dtype(0)
    if scale is not None and scale > 0:
        return dtype(1.0 / scale)
    return dtype(size) / dtype(out)


def _nearest(x, output_size, scales, exact):
    n = len(output_size)
    for axis, out, scale in zip(range(x.ndim - n, x.ndim), output_size, scales):
        size = x.shape[axis]
        step = _source_scale(size, out, scale)
        position = np.arange(out, dtype=np.float32) + (np.float32(0.5) if exact else 0)
        source = np.minimum(np.floor(position * step).astype(np.int64), size - 1)
        x = jnp.take(x, source, axis=axis)
    return x


def _source(size, out, scale, align_corners, cubic, dtype):
    """Fractional input coordinate of each output position along one axis."""
    step = _source_scale(size, out, scale, align_corners, dtype)
    position = np.arange(out, dtype=dtype)
    if align_corners:
        return step * position
    source = step * (position + dtype(0.5)) - dtype(0.5)
    return source if cubic else np.maximum(source, 0)


def _linear_taps(size, out, scale, align_corners, dtype):
    source = _source(size, out, scale, align_corners, False, dtype)
    low = source.astype(np.int64)
    frac = source - low
    return [(low, 1 - frac), (np.minimum(low + 1, size - 1), frac)]


def _cubic_near(d, a=-0.75):
    """Keys' cubic convolution weight at distance |d| <= 1 (PyTorch's A = -0.75)."""
    return ((a + 2) * d - (a + 3)) * d * d + 1


def _cubic_far(d, a=-0.75):
    """Keys' cubic convolution weight at distance 1 < |d| < 2."""
    return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a


def cubic_weights(t) -> list:
    """The weights of the taps at -1, 0, 1, 2 from floor, t the coordinate's distance
    past floor (numpy or JAX arrays): bicubic upsampling's and grid sampling's."""
    return [_cubic_far(t + 1), _cubic_near(t), _cubic_near(1 - t), _cubic_far(2 - t)]


def _cubic_taps(size, out, scale, align_corners, dtype):
    """The 4 neighbours of each source coordinate, indices clamped to the edge."""
    source = _source(size, out, scale, align_corners, True, dtype)
    low = np.floor(source).astype(np.int64)
    weights = cubic_weights(source - low)
    return [(np.clip(low + k - 1, 0, size - 1), w) for k, w in enumerate(weights)]


def _interpolate(x, output_size, align_corners, scales, taps):
    """Separable interpolation: along each spatial axis, a weighted sum of gathered taps
    (integer images in float32, rounded and saturated back, as CPU's uint8 kernels)."""
    integer = jnp.issubdtype(x.dtype, jnp.integer)
    if integer:
        dtype, x = x.dtype, x.astype(jnp.float32)
    x = _up(x)
    # coordinates and weights in float64 for a float64 image, as CPU's kernels (float32
    # ones there lost float64's precision without a sign: 0.4 came out 0.40000003577)
    coordinates = dtypes.opmath_float(x.dtype).type
    n = len(output_size)
    passes = list(zip(range(x.ndim - n, x.ndim), output_size, scales))
    if integer:  # (CPU's uint8 kernels resize the last axis first, clamping in between)
        passes = passes[::-1]
    for axis, out, scale in passes:
        shape = (-1,) + (1,) * (x.ndim - axis - 1)
        x = sum(
            jnp.take(x, index, axis=axis) * jnp.asarray(weight.reshape(shape), x.dtype)
            for index, weight in taps(x.shape[axis], out, scale, align_corners, coordinates)
        )
        if integer:  # (each pass lands in the image's dtype)
            limits = jnp.iinfo(dtype)
            x = jnp.clip(jnp.round(x), limits.min, limits.max)
    return x.astype(dtype) if integer else x


@lower(
    "upsample_nearest1d.default", "upsample_nearest2d.default", "upsample_nearest3d.default"
)
def upsample_nearest(self, output_size, *scales):
    return _nearest(self, output_size, scales, exact=False)


@lower(
    "_upsample_nearest_exact1d.default",
    "_upsample_nearest_exact2d.default",
    "_upsample_nearest_exact3d.default",
)
def upsample_nearest_exact(self, output_size, *scales):
    return _nearest(self, output_size, scales, exact=True)


def _nearest_backward(exact: bool):
    def backward(grad_output, output_size, input_size, *scales):
        zeros = jnp.zeros(tuple(input_size), grad_output.dtype)
        return _vjp(lambda x: _nearest(x, output_size, scales, exact), zeros, grad_output)

    return backward


lower(
    "upsample_nearest1d_backward.default",
    "upsample_nearest2d_backward.default",
    "upsample_nearest3d_backward.default",
)(_nearest_backward(exact=False))
lower(
    "_upsample_nearest_exact1d_backward.default",
    "_upsample_nearest_exact2d_backward.default",
    "_upsample_nearest_exact3d_backward.default",
)(_nearest_backward(exact=True))


@lower(
    "upsample_linear1d.default", "upsample_bilinear2d.default", "upsample_trilinear3d.default"
)
def upsample_linear(self, output_size, align_corners, *scales):
    return _interpolate(self, output_size, align_corners, scales, _linear_taps)


@lower(
    "upsample_linear1d_backward.default",
    "upsample_bilinear2d_backward.default",
    "upsample_trilinear3d_backward.default",
)
def upsample_linear_backward(grad_output, output_size, input_size, align_corners, *scales):
    zeros = jnp.zeros(tuple(input_size), grad_output.dtype)
    return _vjp(
        lambda x: _interpolate(x, output_size, align_corners, scales, _linear_taps), zeros,
        grad_output,
    )


@lower("upsample_bicubic2d.default")
def upsample_bicubic2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    return _interpolate(self, output_size, align_corners, (scales_h, scales_w), _cubic_taps)


@lower("upsample_bicubic2d_backward.default")
def upsample_bicubic2d_backward(
    grad_output, output_size, input_size, align_corners, scales_h=None, scales_w=None
):
    zeros = jnp.zeros(tuple(input_size), grad_output.dtype)
    scales = (scales_h, scales_w)
    return _vjp(
        lambda x: _interpolate(x, output_size, align_corners, scales, _cubic_taps), zeros,
        grad_output,
    )
