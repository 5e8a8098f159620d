"""Fused optimizer steps: `_fused_adam(w)_`, `_fused_sgd_`, `_fused_adagrad_`.

Each step is one lowering returning the new value of every list it updates.
It serves the in-place op eager runs (`writes` names the lists) and the
functional op AOTAutograd puts into compiled graphs. The arithmetic follows
PyTorch's CPU kernels: step-dependent factors in float64, the update in the
op-math dtype (float32 for half types), stored in each tensor's own dtype;
a branch on a hyperparameter being zero becomes a `where`, since the
hyperparameters are run-time values (a scheduler changes lr, betas and
momentum every step without a recompile).

GradScaler (`grad_scale`, `found_inf`): gradients are divided by the scale
and written back unscaled; `found_inf == 1` leaves every tensor as it was,
as the CPU kernel returns before touching anything. That choice is made on
the device: no host sync.
"""

from __future__ import annotations

import jax.numpy as jnp

from ..dtypes import opmath_float
from .registry import lower


def _f64(value):
    """A hyperparameter (Python float, run-time scalar or tensor lr) as a float64 scalar."""
    return jnp.asarray(value).reshape(()).astype(jnp.float64)


def _first(tensor):
    """The element the CPU kernel reads (`*data_ptr<float>()`) from grad_scale/found_inf."""
    return tensor.reshape(-1)[0].astype(jnp.float32)


def _check_lengths(what: str, n: int, **lists) -> None:
    for name, values in lists.items():
        if len(values) != n:
            raise RuntimeError(f"{what}: expected {n} {name}, got {len(values)}")


def _gradient(grad, param, grad_scale, weight_decay, maximize: bool, opmath):
    """(unscaled gradient to store, gradient to step with) in op-math precision."""
    g = grad.astype(opmath)
    if grad_scale is not None:
        g = g / _first(grad_scale).astype(opmath)
    stored = g
    if maximize:
        g = -g
    if weight_decay is not None:
        g = jnp.where(weight_decay != 0, g + param * weight_decay.astype(opmath), g)
    return stored, g


def _finish(found_inf, old: tuple, new: tuple) -> tuple:
    """Each new list cast to its tensors' dtypes; the old values where found_inf == 1."""
    out = []
    for old_list, new_list in zip(old, new):
        values = [n.astype(o.dtype) for o, n in zip(old_list, new_list)]
        if found_inf is not None:
            skip = _first(found_inf) == 1
            values = [jnp.where(skip, o, n) for o, n in zip(old_list, values)]
        out.append(values)
    return tuple(out)


# ------------------------------------------------------------------ Adam(W)


def _adam(decoupled: bool):
    def step(
        self,
        grads,
        exp_avgs,
        exp_avg_sqs,
        max_exp_avg_sqs,
        state_steps,
        lr,
        beta1,
        beta2,
        weight_decay,
        eps,
        amsgrad,
        maximize,
        grad_scale=None,
        found_inf=None,
    ):
        n = len(self)
        what = "_fused_adamw_" if decoupled else "_fused_adam_"
        _check_lengths(what, n, grads=grads, exp_avgs=exp_avgs, exp_avg_sqs=exp_avg_sqs)
        _check_lengths(what, n, state_steps=state_steps)
        _check_lengths(what, n if amsgrad else 0, max_exp_avg_sqs=max_exp_avg_sqs)
        lr, beta1, beta2 = _f64(lr), _f64(beta1), _f64(beta2)
        weight_decay, eps = _f64(weight_decay), _f64(eps)
        new = ([], [], [], [], [])
        for i in range(n):
            m = opmath_float(self[i].dtype)
            # the CPU kernel reads the step as a float, then computes in double
            t = state_steps[i].reshape(()).astype(jnp.float32).astype(jnp.float64)
            bias_correction1 = 1 - beta1**t
            bias_correction2_sqrt = jnp.sqrt(1 - beta2**t)
            param = self[i].astype(m)
            if decoupled:
                param = jnp.where(
                    weight_decay != 0, param * (1 - lr * weight_decay).astype(m), param
                )
            stored, g = _gradient(
                grads[i], param, grad_scale, None if decoupled else weight_decay, maximize, m
            )
            # exp_avg.lerp_(grad, 1 - beta1), with lerp's two formulas
            w = (1 - beta1).astype(m)
            avg = exp_avgs[i].astype(m)
            avg = jnp.where(jnp.abs(w) < 0.5, avg + w * (g - avg), g - (g - avg) * (1 - w))
            avg_sq = exp_avg_sqs[i].astype(m) * beta2.astype(m) + (1 - beta2).astype(m) * g * g
            second = avg_sq
            if amsgrad:
                second = jnp.maximum(max_exp_avg_sqs[i].astype(m), avg_sq)
                new[4].append(second)
            denom = jnp.sqrt(second) / bias_correction2_sqrt.astype(m) + eps.astype(m)
            new[0].append(param - (lr / bias_correction1).astype(m) * avg / denom)
            new[1].append(stored)
            new[2].append(avg)
            new[3].append(avg_sq)
        old = (self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs)
        if grad_scale is None:  # gradients are left as they are
            new = (new[0], list(grads), *new[2:])
        return _finish(found_inf, old, new)

    step.__name__ = "fused_adamw" if decoupled else "fused_adam"
    return step


_ADAM_FLOATS = ("lr", "beta1", "beta2", "weight_decay", "eps")
_ADAM_WRITES = ("self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs")
for _name, _decoupled in (("_fused_adam", False), ("_fused_adamw", True)):
    _step = _adam(_decoupled)
    lower(
        f"{_name}_.default",
        f"{_name}_.tensor_lr",
        writes=_ADAM_WRITES,
        runtime_floats=_ADAM_FLOATS,
    )(_step)
    lower(f"{_name}.default", f"{_name}.tensor_lr", runtime_floats=_ADAM_FLOATS)(_step)


# --------------------------------------------------------------------- SGD


def fused_sgd(
    self,
    grads,
    momentum_buffer_list,
    weight_decay,
    momentum,
    lr,
    dampening,
    nesterov,
    maximize,
    is_first_step,
    grad_scale=None,
    found_inf=None,
):
    """With momentum the buffers are updated (set to the gradient on the first step);
    without it PyTorch passes no buffers, and the list's emptiness says which: momentum
    is a run-time value (OneCycleLR cycles it every step), so the CPU kernel's refusal
    of a non-zero momentum without buffers cannot be repeated here."""
    n = len(self)
    has_buffers = len(momentum_buffer_list) > 0
    _check_lengths("_fused_sgd_", n, grads=grads)
    buffers = momentum_buffer_list
    _check_lengths("_fused_sgd_", n if has_buffers else 0, momentum_buffer_list=buffers)
    weight_decay, momentum, lr, dampening = map(_f64, (weight_decay, momentum, lr, dampening))
    new = ([], [], [])
    for i in range(n):
        m = opmath_float(self[i].dtype)
        param = self[i].astype(m)
        stored, g = _gradient(grads[i], param, grad_scale, weight_decay, maximize, m)
        if has_buffers:
            if is_first_step:
                buf = g
            else:
                buf = momentum_buffer_list[i].astype(m) * momentum.astype(m) + g * (
                    1 - dampening
                ).astype(m)
            g = g + buf * momentum.astype(m) if nesterov else buf
            new[2].append(buf)
        new[0].append(param - g * lr.astype(m))
        new[1].append(stored)
    if grad_scale is None:
        new = (new[0], list(grads), new[2])
    return _finish(found_inf, (self, grads, momentum_buffer_list), new)


_SGD_FLOATS = ("weight_decay", "momentum", "lr", "dampening")
lower(
    "_fused_sgd_.default",
    "_fused_sgd_.tensor_lr",
    writes=("self", "grads", "momentum_buffer_list"),
    runtime_floats=_SGD_FLOATS,
)(fused_sgd)
lower("_fused_sgd.default", "_fused_sgd.tensor_lr", runtime_floats=_SGD_FLOATS)(fused_sgd)


# ----------------------------------------------------------------- Adagrad


def fused_adagrad(
    self,
    grads,
    state_sums,
    state_steps,
    lr,
    lr_decay,
    weight_decay,
    eps,
    maximize,
    grad_scale=None,
    found_inf=None,
):
    """The step counters are read, not written (the optimizer increments them)."""
    n = len(self)
    _check_lengths("_fused_adagrad_", n, grads=grads, state_sums=state_sums)
    _check_lengths("_fused_adagrad_", n, state_steps=state_steps)
    lr, lr_decay, weight_decay, eps = map(_f64, (lr, lr_decay, weight_decay, eps))
    new = ([], [], [])
    for i in range(n):
        m = opmath_float(self[i].dtype)
        t = state_steps[i].reshape(()).astype(jnp.float32).astype(jnp.float64)
        clr = (lr / (1 + (t - 1) * lr_decay)).astype(m)
        param = self[i].astype(m)
        stored, g = _gradient(grads[i], param, grad_scale, weight_decay, maximize, m)
        total = state_sums[i].astype(m) + g * g
        new[0].append(param - clr * g / (jnp.sqrt(total) + eps.astype(m)))
        new[1].append(stored)
        new[2].append(total)
    if grad_scale is None:
        new = (new[0], list(grads), new[2])
    return _finish(found_inf, (self, grads, state_sums), new)


@lower("_fused_adagrad.default", runtime_floats=("lr", "lr_decay", "weight_decay", "eps"))
def fused_adagrad_functional(self, grads, state_sums, state_steps, *args, **kwargs):
    """The functional overload also returns the (unchanged) step counters."""
    return (*fused_adagrad(self, grads, state_sums, state_steps, *args, **kwargs), state_steps)


_ADAGRAD_FLOATS = ("lr", "lr_decay", "weight_decay", "eps")
lower(
    "_fused_adagrad_.default",
    "_fused_adagrad_.tensor_lr",
    writes=("self", "grads", "state_sums"),
    runtime_floats=_ADAGRAD_FLOATS,
)(fused_adagrad)
lower("_fused_adagrad.tensor_lr", runtime_floats=_ADAGRAD_FLOATS)(fused_adagrad)
