"""Pad a varying size up to one of a few bucket sizes, so XLA compiles a few programs.

Every new shape is a new XLA program, in eager modes as under torch.compile. For
compiled code the bucket options of torch.compile do the padding and slicing
themselves (`docs/serving.md`). Eager code (strict or fused) has no graph to
check, so bucketing there is explicit: the caller pads with these helpers and
makes its own computation ignore the padding (an attention mask, a gather at
the real last position). Nothing here changes an op's result behind the
caller's back.

The padding of a tpu tensor goes through the host (device -> host, numpy pad,
host -> device): a device program would itself be compiled once per unpadded
length, which is what bucketing avoids. It costs a transfer of the tensor:
right for token ids, positions and masks; costly for large activations.
"""

from __future__ import annotations

import torch

from .compile.buckets import BucketingError, BucketPolicy

__all__ = ["BucketPolicy", "BucketingError", "bucket_for", "pad_sequences", "pad_to_bucket"]


def _policy(bucket_size, num_dynamic_buckets, dynamic_buckets) -> BucketPolicy:
    if bucket_size is None and num_dynamic_buckets is None and dynamic_buckets is None:
        raise ValueError("give bucket_size, num_dynamic_buckets or dynamic_buckets")
    return BucketPolicy(
        bucket_size,
        num_dynamic_buckets,
        tuple(dynamic_buckets) if dynamic_buckets is not None else None,
    )


def bucket_for(
    n: int,
    *,
    bucket_size: int | None = None,
    num_dynamic_buckets: int | None = None,
    dynamic_buckets=None,
) -> int:
    """The bucket a length n lands in, under torch.compile's bucket options' rules."""
    return _policy(bucket_size, num_dynamic_buckets, dynamic_buckets).bucket(n)


def pad_to_bucket(
    x: torch.Tensor,
    dim: int = -1,
    *,
    bucket_size: int | None = None,
    num_dynamic_buckets: int | None = None,
    dynamic_buckets=None,
    value: float | None = None,
    side: str = "right",
) -> tuple[torch.Tensor, int]:
    """(x padded along dim to its bucket, the real length). `value=None` repeats the edge
    row (pad rows hold valid data: in-range indices, no zero division); a number fills.
    The caller masks or slices the padding away: this function cannot know which later
    ops would mix it into real results."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    dim = dim % x.dim()
    n = x.shape[dim]
    size = _policy(bucket_size, num_dynamic_buckets, dynamic_buckets).bucket(n)
    return pad_to_size(x, {dim: size}, value=value, side=side), n


def pad_to_size(
    x: torch.Tensor, sizes: dict[int, int], *, value: float | None = None, side: str = "right"
) -> torch.Tensor:
    """x padded to sizes[dim] along each given dim (see pad_to_bucket); a tpu tensor is
    padded on the host, so no device program depends on its unpadded shape."""
    import numpy as np

    widths = [(0, 0)] * x.dim()
    for dim, size in sizes.items():
        extra = size - x.shape[dim]
        if extra < 0:
            raise ValueError(f"dimension {dim} of size {x.shape[dim]} exceeds its bucket {size}")
        if extra and x.shape[dim] == 0 and value is None:
            raise ValueError(f"cannot repeat the edge of the empty dimension {dim}; give value=")
        widths[dim] = (extra, 0) if side == "left" else (0, extra)
    if all(w == (0, 0) for w in widths):
        return x
    host = _host_array(x)
    if value is None:
        padded = np.pad(host, widths, mode="edge")
    else:
        padded = np.pad(host, widths, mode="constant", constant_values=value)
    if x.device.type == "cpu":
        return torch.from_numpy(np.ascontiguousarray(padded)).to(x.dtype)
    return _upload(padded, x)


def _host_array(x: torch.Tensor):
    """x's value as a numpy array, without a device program that depends on its shape."""
    import numpy as np

    if x.device.type == "cpu":
        return x.detach().resolve_conj().resolve_neg().numpy(force=True)
    from .tensor import storage_of, view_of

    storage = storage_of(x)
    view = view_of(x, storage)
    flat = np.asarray(storage.array("bucket padding")).reshape(-1)
    if flat.dtype != view.dtype:  # a dtype-reinterpreting view: read it on the device
        from .engine.executor import download

        return download(x, "bucket padding")
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(
        flat[view.offset :],
        shape=view.shape,
        strides=tuple(s * item for s in view.strides),
        writeable=False,
    )


def _upload(array, like: torch.Tensor) -> torch.Tensor:
    """The padded host array (np.pad's own, so the device may keep it) as a tpu tensor."""
    import numpy as np

    from . import platform
    from .tensor import new_tensor

    # of its own shape, as uploads are: a padded input and one that needed no padding
    # then reach the bucket's executable alike (a storage's shape is in its key)
    array = np.ascontiguousarray(array)
    return new_tensor(tuple(array.shape), like.dtype, platform.put(array))


def pad_sequences(
    sequences,
    *,
    pad_value: int = 0,
    side: str = "left",
    bucket_size: int | None = None,
    num_dynamic_buckets: int | None = None,
    dynamic_buckets=None,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of token sequences of mixed lengths -> (ids, attention_mask), both of shape
    (batch, bucket of the longest), padded on `side` (left for decoder-only generation),
    mask 1 on real tokens. Built on the host, then moved to `device` once."""
    if side not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right', got {side!r}")
    rows = [torch.as_tensor(s, dtype=torch.long, device="cpu").reshape(-1) for s in sequences]
    if not rows:
        raise ValueError("pad_sequences needs at least one sequence")
    longest = max(r.numel() for r in rows)
    size = _policy(bucket_size, num_dynamic_buckets, dynamic_buckets).bucket(longest)
    ids = torch.full((len(rows), size), pad_value, dtype=torch.long, device="cpu")
    mask = torch.zeros((len(rows), size), dtype=torch.long, device="cpu")
    for k, row in enumerate(rows):
        where = slice(size - row.numel(), size) if side == "left" else slice(0, row.numel())
        ids[k, where] = row
        mask[k, where] = 1
    return ids.to(device), mask.to(device)
