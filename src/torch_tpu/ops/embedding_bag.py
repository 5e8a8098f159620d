"""Lowerings: nn.EmbeddingBag (`_embedding_bag` and its backward ops).

Bags are found on the device with a sorted search of each index position in
`offsets`, so shapes never depend on values and nothing syncs with the host.
The auxiliary outputs have the shapes PyTorch's meta kernel gives a non-CPU
device; their contents are ours, read by the backward lowerings here:
offset2bag = each position's bag (== number of bags past the last offset with
include_last_offset), bag_size = each bag's count of non-padding indices,
max_indices = the weight row that gave each (bag, feature) maximum, -1 for an
empty bag. An empty bag gives zeros in every mode, as on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .. import dtypes
from .indexing import outside
from .registry import lower

_SUM, _MEAN, _MAX = 0, 1, 2


_up = dtypes.widen_half


def _bags(indices, offsets, num_bags, padding_idx):
    """Each position's bag and whether it counts (inside a bag, not padding)."""
    position = jnp.arange(indices.shape[0], dtype=offsets.dtype)
    bag = jnp.searchsorted(offsets, position, side="right") - 1
    return bag, _counted(indices, bag, num_bags, padding_idx)


def _counted(indices, bag, num_bags, padding_idx):
    valid = (bag >= 0) & (bag < num_bags)
    return valid & (indices != padding_idx) if padding_idx >= 0 else valid


def _embedding_bag_device_check(weight, indices, offsets, *rest) -> list:
    """CPU's value checks (engine/device_asserts.py): indices within the weight's rows,
    offsets starting at 0 and not past the input."""
    rows = weight.shape[0]
    words = f"an index of input takes a value which is not in the valid range [0, {rows})"
    failures = [(outside(indices, 0, rows), RuntimeError, words)]
    if offsets is not None and offsets.ndim == 1 and offsets.shape[0] and indices.ndim == 1:
        length = indices.shape[0]
        first = "offsets[0] has to be 0, i.e., the first sequence in the mini-batch has to "
        failures.append((offsets[0] != 0, RuntimeError, first + "start from position 0"))
        last = f"offsets[-1] can not be greater than input's length {length}"
        failures.append((offsets[-1] > length, RuntimeError, last))
    return failures


def _check_embedding_bag(values: list) -> bool:
    """CPU's checks of the arguments' ranks, in its order and words (the meta kernel has
    none: the lowering failed on them); and CPU's max-mode kernel crashes the process (a
    segfault in 2.13) on indices with no bag to go to, as tpu's stand-in run of that
    kernel (engine/refusals.py) would."""
    weight, indices, offsets = values[0], values[1], values[2]
    for name, tensor, ranks, wanted in (
        ("input", indices, (1, 2), "a 1D or 2D"),
        ("offsets", offsets, (1,), "a 1D"),
        ("weight", weight, (2,), "a 2D"),
    ):
        if tensor.dim() not in ranks:
            raise RuntimeError(
                f"{name} has to be {wanted} Tensor, but got Tensor of dimension {tensor.dim()}"
            )
    if indices.dim() == 2:
        raise RuntimeError(
            "embedding_bag: 2-D indices passed to the op itself are not supported on tpu "
            "(CPU's kernel flattens them for the sum but takes bag sizes from their first "
            "dimension); F.embedding_bag and nn.EmbeddingBag flatten them first"
        )
    mode = values[4] if len(values) > 4 else _SUM
    last = values[7] if len(values) > 7 else False
    if mode == _MAX and indices.numel() and offsets.numel() <= int(bool(last)):
        raise RuntimeError(
            f"embedding_bag: {indices.numel()} indices but no bags (offsets has "
            f"{offsets.numel()} values) in mode='max'; PyTorch's CPU kernel crashes here"
        )
    return False


@lower(
    "_embedding_bag.default",
    "_embedding_bag_forward_only.default",
    check=_check_embedding_bag,
    device_check=_embedding_bag_device_check,
)
def embedding_bag(
    weight, indices, offsets, scale_grad_by_freq=False, mode=_SUM, sparse=False,
    per_sample_weights=None, include_last_offset=False, padding_idx=-1,
):
    num_bags = offsets.shape[0] - 1 if include_last_offset else offsets.shape[0]
    bag, valid = _bags(indices, offsets, num_bags, padding_idx)
    segment = jnp.where(valid, bag, num_bags)  # excluded positions go to a dropped segment
    rows = _up(weight)[indices]
    if per_sample_weights is not None:
        rows = rows * _up(per_sample_weights)[:, None]
    count = jax.ops.segment_sum(valid.astype(indices.dtype), segment, num_bags + 1)[:num_bags]
    bag_size = jnp.zeros(offsets.shape, indices.dtype).at[:num_bags].set(count)
    max_indices = jnp.zeros((0,), indices.dtype)
    if mode == _MAX and (indices.shape[0] == 0 or num_bags == 0):  # nothing to index
        out = jnp.zeros((num_bags, weight.shape[1]), rows.dtype)
        max_indices = jnp.full(out.shape, -1, indices.dtype)
    elif mode == _MAX:
        best = jax.ops.segment_max(rows, segment, num_bags + 1)[:num_bags]
        best = jnp.where(count[:, None] > 0, best, 0)
        # the first position reaching the maximum, as CPU's strict comparison keeps
        position = jnp.arange(indices.shape[0])[:, None]
        hit = valid[:, None] & (rows == best[jnp.clip(bag, 0, num_bags - 1)])
        first = jax.ops.segment_min(
            jnp.where(hit, position, indices.shape[0]), segment, num_bags + 1
        )[:num_bags]
        max_indices = jnp.where(
            count[:, None] > 0, indices[jnp.clip(first, 0, indices.shape[0] - 1)], -1
        ).astype(indices.dtype)
        out = best
    else:
        out = jax.ops.segment_sum(rows, segment, num_bags + 1)[:num_bags]
        if mode == _MEAN:
            out = out / jnp.maximum(count, 1)[:, None].astype(out.dtype)
    return out, bag.astype(indices.dtype), bag_size, max_indices


@lower("_embedding_bag_backward.default")
def embedding_bag_backward(
    grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights,
    scale_grad_by_freq, mode, sparse, per_sample_weights, padding_idx=-1,
):
    if sparse:
        raise NotImplementedError(
            "nn.EmbeddingBag(sparse=True): tpu has no sparse tensors; use sparse=False"
        )
    return embedding_bag_dense_backward(
        grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
        scale_grad_by_freq, mode, per_sample_weights, padding_idx,
    )


@lower("_embedding_bag_dense_backward.default")
def embedding_bag_dense_backward(
    grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq,
    mode, per_sample_weights, padding_idx=-1,
):
    grad = _up(grad)
    num_bags, features = grad.shape
    result = jnp.zeros((num_weights, features), grad.dtype)
    if mode == _MAX:
        found = maximum_indices >= 0
        column = jnp.broadcast_to(jnp.arange(features), maximum_indices.shape)
        row = jnp.where(found, maximum_indices, 0)
        return result.at[row, column].add(jnp.where(found, grad, 0))
    valid = _counted(indices, offset2bag, num_bags, padding_idx)
    bag = jnp.clip(offset2bag, 0, num_bags - 1)
    rows = grad[bag]
    if mode == _MEAN:
        rows = rows / jnp.maximum(bag_size[bag], 1)[:, None].astype(grad.dtype)
    if per_sample_weights is not None:
        rows = rows * _up(per_sample_weights)[:, None]
    if scale_grad_by_freq:
        counts = jnp.zeros(num_weights, grad.dtype).at[indices].add(1)
        rows = rows / counts[indices][:, None]
    return result.at[indices].add(jnp.where(valid[:, None], rows, 0))


@lower("_embedding_bag_per_sample_weights_backward.default")
def embedding_bag_per_sample_weights_backward(
    grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1
):
    grad = _up(grad)
    num_bags = grad.shape[0]
    valid = _counted(indices, offset2bag, num_bags, padding_idx)
    rows = grad[jnp.clip(offset2bag, 0, num_bags - 1)]
    return jnp.where(valid, jnp.sum(rows * _up(weight)[indices], -1), 0)
