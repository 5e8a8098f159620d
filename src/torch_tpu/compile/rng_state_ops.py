"""PyTorch's RNG-state operators on tpu tensors: what activation checkpointing
compiles a random op into.

When `torch.compile` meets `torch.utils.checkpoint` around a random op (dropout),
AOTAutograd's partitioner recomputes the op in the backward graph and, so that
the recomputed mask equals the forward's, wraps the forward op in
`run_and_save_rng_state` (returns the RNG state it ran with and the op's result)
and the backward one in `run_with_rng_state` (runs it with that state). PyTorch
gives both a kernel per device type, chosen at its BackendSelect key from a closed
table of cpu, cuda, hpu and xpu: on tpu tensors they raised
`AssertionError: Backend not supported for tpu`, and the checkpointed step could
not run. Here they take tpu's RNG state (`torch.tpu.get_rng_state`), as CUDA's
take CUDA's; the graphs holding them run op by op in tpu eager (the compiled
graph's runtime has no rule for them), with every other graph still compiled.
"""

from __future__ import annotations

import torch
from torch._C import DispatchKey
from torch._prims import rng_prims

from ..engine.fallback import DEVICE_TYPE


def _run_and_save(op, *args, **kwargs):
    return torch.tpu.get_rng_state(), op(*args, **kwargs)


def _run_with(rng_state, op, *args, **kwargs):
    current = torch.tpu.get_rng_state()
    torch.tpu.set_rng_state(rng_state.cpu())
    try:
        return op(*args, **kwargs)
    finally:
        torch.tpu.set_rng_state(current)


def register() -> None:
    """Route tpu calls of the two operators to tpu's RNG state (idempotent)."""
    # (leading: the arguments before the op's own, which say the device: the op, and
    # for run_with_rng_state first the state, a CPU tensor)
    for hop, tpu_kernel, leading in (
        (rng_prims.run_and_save_rng_state, _run_and_save, 1),
        (rng_prims.run_with_rng_state, _run_with, 2),
    ):
        original = hop.py_kernels[DispatchKey.BackendSelect]
        if getattr(original, "_torch_tpu", False):
            continue
        hop.py_kernels[DispatchKey.BackendSelect] = _select(original, tpu_kernel, leading)
        hop._dispatch_cache.clear()


def _select(original, tpu_kernel, leading: int):
    def backend_select(*args, **kwargs):
        if rng_prims.get_device(args[leading:], kwargs) == DEVICE_TYPE:
            return tpu_kernel(*args, **kwargs)
        return original(*args, **kwargs)

    backend_select._torch_tpu = True
    return backend_select
