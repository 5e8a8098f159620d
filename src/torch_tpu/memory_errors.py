"""XLA's out-of-memory error raised as PyTorch's `torch.OutOfMemoryError`.

Programs catch `torch.OutOfMemoryError` (`torch.cuda.OutOfMemoryError` is the same
class) to lower a batch size, skip a batch or free caches and retry; JAX raises its
own `JaxRuntimeError` ("RESOURCE_EXHAUSTED: Out of memory ..."), which no such
handler catches, so a program that recovers from OOM on CUDA died on tpu. The
places that run programs or place arrays (the eager executor, fused segments,
compiled graphs, uploads) and that wait for them (reads, synchronize) call
`raise_if_out_of_memory` on JAX's errors.
"""

from __future__ import annotations

import torch


def raise_if_out_of_memory(error: Exception) -> None:
    """Raise torch.OutOfMemoryError (XLA's message kept, the error chained) when `error`
    is XLA's out-of-memory error; return otherwise, for the caller to re-raise."""
    message = str(error)
    # (an allocation at dispatch says RESOURCE_EXHAUSTED; one in an asynchronous
    # computation surfaces at the read, as INTERNAL "... Out of memory allocating")
    if "RESOURCE_EXHAUSTED" in message or "Out of memory" in message:
        raise torch.OutOfMemoryError(
            f"tpu out of memory. {message} (torch.tpu.memory_allocated() and "
            "torch.tpu.memory_stats() show what tensors hold)"
        ) from error
