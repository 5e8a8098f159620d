"""CTC loss (`F.ctc_loss`, speech recognition's training loss), forward and backward, as
CPU's kernels compute them: the alpha recursion over time in log space (Graves et al.,
section 4.1) with CPU's three-term log-add, the loss from the last two alphas, and a
backward that runs the beta recursion and returns CPU's gradient, `exp(lp) - exp(log
(sum of alpha beta over the label's positions) + nll - lp)` times the incoming gradient
(the gradient with respect to the logits of a log_softmax, which PyTorch's CTC backward
returns for its log_probs; autograd's log_softmax backward then gives the true one).

The lengths are int lists, static for a program; the target labels are read on the
device. Both ran on the CPU fallback, copying the log-probabilities both ways each step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .pointwise import scalar_type_name
from .registry import lower

_NEG = -np.inf


def _check_dtypes(kernel: str, at: int):
    """CPU's refusals the meta kernel words otherwise: log-probabilities (argument `at`)
    that are not float32 or float64, targets that are neither int64 nor int32."""

    def check(values: list) -> bool:
        log_probs, targets = values[at], values[at + 1]
        if log_probs.dtype not in (torch.float32, torch.float64):
            name = scalar_type_name(log_probs.dtype)
            raise NotImplementedError(f"\"{kernel}\" not implemented for '{name}'")
        if targets.dtype not in (torch.int64, torch.int32):
            legacy = torch.empty((), dtype=targets.dtype).type()  # (CPU's "torch.FloatTensor")
            raise RuntimeError(
                "Expected tensor for argument #2 'targets' to have scalar type Int; but got "
                f"{legacy} instead (while checking arguments for ctc_loss_allocate_outputs)"
            )
        return False  # (dtypes and lengths are part of the key)

    return check


def _extended_labels(targets, target_lengths: list, blank: int, positions: int):
    """[batch, positions]: blank at even positions, target label (s - 1) / 2 at odd ones
    (CPU's `get_target_prime`), from a padded [batch, max] or concatenated [sum] target
    tensor; positions past a target's own 2 L + 1 hold blank (masked by the callers)."""
    lengths = np.asarray(target_lengths, np.int64)
    count = (positions - 1) // 2
    k = np.arange(count)[None, :]
    if targets.ndim == 1:
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[:, None]
        index = np.where(k < lengths[:, None], starts + k, 0)
        labels = jnp.take(targets, jnp.asarray(index), mode="clip")
    else:
        columns = np.minimum(k, max(targets.shape[1] - 1, 0))
        columns = np.broadcast_to(columns, (len(lengths), count))
        labels = jnp.take_along_axis(targets, jnp.asarray(columns), axis=1, mode="clip")
    labels = jnp.where(jnp.asarray(k < lengths[:, None]), labels, blank).astype(jnp.int64)
    extended = jnp.full((len(lengths), positions), blank, jnp.int64)
    return extended.at[:, 1::2].set(labels)


def _logadd3(a, b, c):
    """CPU's log(exp(a) + exp(b) + exp(c)), shifted by the largest (0 when all are -inf)."""
    top = jnp.maximum(jnp.maximum(a, b), c)
    top = jnp.where(top == _NEG, 0, top)
    return jnp.log(jnp.exp(a - top) + jnp.exp(b - top) + jnp.exp(c - top)) + top


def _shift(x, by: int, fill=_NEG):
    """x[..., s - by] along the last axis (by > 0) or x[..., s + |by|] (by < 0), `fill`
    where that position does not exist."""
    pad = jnp.full(x.shape[:-1] + (abs(by),), fill, x.dtype)
    if by > 0:
        return jnp.concatenate([pad, x[..., :-by]], axis=-1)
    return jnp.concatenate([x[..., -by:], pad], axis=-1)


def _setup(log_probs, targets, input_lengths, target_lengths, blank, positions):
    """(log-probability of each extended position [T, N, S], labels [N, S], position in
    use [N, S] (s <= 2 L), input lengths, target lengths) for both directions."""
    extended = _extended_labels(targets, target_lengths, blank, positions)
    index = jnp.broadcast_to(extended, log_probs.shape[:2] + (positions,))
    along = jnp.take_along_axis(log_probs, index, axis=2, mode="clip")
    lengths = np.asarray(target_lengths, np.int64)
    used = np.arange(positions)[None, :] <= 2 * lengths[:, None]
    return along, extended, used, np.asarray(input_lengths, np.int64), lengths


@lower("_ctc_loss.default", check=_check_dtypes("ctc_loss_cpu", 0))
def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    steps, batch, _ = log_probs.shape
    positions = 2 * max(target_lengths, default=0) + 1
    along, extended, used, inputs, lengths = _setup(
        log_probs, targets, input_lengths, target_lengths, blank, positions
    )
    used = jnp.asarray(used)
    # a skip from s - 2 is allowed onto a label unlike the one two positions before
    skip = jnp.asarray(np.arange(positions) >= 2) & (extended != _shift(extended, 2, -1))
    first = jnp.full((batch, positions), _NEG, log_probs.dtype)
    first = first.at[:, 0].set(along[0, :, 0])
    if positions > 1:
        first = first.at[:, 1].set(jnp.where(jnp.asarray(lengths > 0), along[0, :, 1], _NEG))
    first = jnp.where(jnp.asarray(inputs > 0)[:, None], first, _NEG)

    def advance(previous, lp):
        from_two = jnp.where(skip, _shift(previous, 2), _NEG)
        current = _logadd3(previous, _shift(previous, 1), from_two) + lp
        return (jnp.where(used, current, _NEG),) * 2

    _, rest = jax.lax.scan(advance, first, along[1:])
    alphas = jnp.concatenate([first[None], rest])  # [T, N, S]
    live = jnp.asarray(np.arange(steps)[:, None] < inputs[None, :])[..., None]
    alphas = jnp.where(live, alphas, _NEG)
    rows = np.arange(batch)
    last = alphas[np.maximum(inputs - 1, 0), rows]  # [N, S]
    end = last[rows, 2 * lengths]
    before = last[rows, np.maximum(2 * lengths - 1, 0)]
    top = jnp.maximum(end, before)
    top = jnp.where(top == _NEG, 0, top)
    pair = jnp.log(jnp.exp(end - top) + jnp.exp(before - top)) + top
    likelihood = jnp.where(jnp.asarray(lengths == 0), last[:, 0], pair)
    empty = jnp.where(jnp.asarray(lengths == 0), 0.0, _NEG).astype(log_probs.dtype)
    likelihood = jnp.where(jnp.asarray(inputs == 0), empty, likelihood)
    return -likelihood, jnp.transpose(alphas, (1, 0, 2))


@lower("_ctc_loss_backward.default", check=_check_dtypes("ctc_loss_backward_cpu", 1))
def ctc_loss_backward(
    grad,
    log_probs,
    targets,
    input_lengths,
    target_lengths,
    neg_log_likelihood,
    log_alpha,
    blank,
    zero_infinity=False,
):
    steps, batch, classes = log_probs.shape
    positions = log_alpha.shape[2]
    along, extended, used, inputs, lengths = _setup(
        log_probs, targets, input_lengths, target_lengths, blank, positions
    )
    # a skip from s + 2 is allowed from a label unlike the one two positions after
    below_last = np.arange(positions)[None, :] < 2 * lengths[:, None] - 1
    skip = jnp.asarray(below_last) & (_shift(extended, -2, -1) != extended)
    rows = np.arange(batch)
    starts = np.zeros((steps, batch, positions), bool)  # the last step of each input
    for b in rows[inputs > 0]:
        starts[inputs[b] - 1, b, 2 * lengths[b]] = True
        if lengths[b] > 0:
            starts[inputs[b] - 1, b, 2 * lengths[b] - 1] = True
    running = np.arange(steps)[:, None] < (inputs - 1)[None, :]  # steps the recursion fills
    used_now = jnp.asarray(used)

    def retreat(following, xs):
        lp, start, run = xs
        from_two = jnp.where(skip, _shift(following, -2), _NEG)
        current = _logadd3(following, _shift(following, -1), from_two) + lp
        current = jnp.where(run[:, None] & used_now, current, _NEG)
        current = jnp.where(start, lp, current)
        return current, current

    init = jnp.full((batch, positions), _NEG, log_probs.dtype)
    _, betas = jax.lax.scan(
        retreat, init, (along, jnp.asarray(starts), jnp.asarray(running)), reverse=True
    )
    both = jnp.transpose(log_alpha, (1, 0, 2)) + betas  # [T, N, S]
    live = np.arange(steps)[:, None] < inputs[None, :]
    both = jnp.where(jnp.asarray(live[..., None] & used[None]), both, _NEG)
    # per (t, b, label): log of the sum of exp(both) over the positions holding it
    index = jnp.broadcast_to(extended[None], both.shape)
    t_index = jnp.arange(steps)[:, None, None]
    b_index = jnp.arange(batch)[None, :, None]
    top = jnp.full((steps, batch, classes), _NEG, both.dtype).at[t_index, b_index, index].max(both)
    shift = jnp.where(top == _NEG, 0, top)
    total = (
        jnp.zeros((steps, batch, classes), both.dtype)
        .at[t_index, b_index, index]
        .add(jnp.exp(both - jnp.take_along_axis(shift, index, axis=2)))
    )
    collected = jnp.log(total) + shift
    nll = neg_log_likelihood[None, :, None]
    result = (jnp.exp(log_probs) - jnp.exp(collected + nll - log_probs)) * grad[None, :, None]
    result = jnp.where(jnp.asarray(live)[..., None], result, 0)
    if zero_infinity:
        result = jnp.where(nll == np.inf, 0, result)
    return result.astype(log_probs.dtype)
