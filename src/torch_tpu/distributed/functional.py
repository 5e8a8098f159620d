"""tpu kernels for the functional collectives (`torch.ops._c10d_functional`).

DTensor, FSDP2 and traced graphs call these ops: each returns its result
tensor at once and records the collective's Work against the result's
storage; `wait_tensor` waits for it (within the group's timeout).
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed.distributed_c10d as c10d

from ..tensor import storage_of
from .process_group import TpuProcessGroup
from .work import TpuWork

_pending: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Storage -> TpuWork
_lib = torch.library.Library("_c10d_functional", "IMPL")


def _group(group) -> TpuProcessGroup:
    pg = c10d._resolve_process_group(group) if isinstance(group, str) else group
    if not isinstance(pg, TpuProcessGroup):
        raise RuntimeError(f"tpu tensors need a tpu_dist process group, got {pg}")
    return pg


def _track(work: TpuWork, tensors) -> None:
    for t in tensors:
        _pending[storage_of(t)] = work


def _ready(work: TpuWork, *tensors):
    _track(work, tensors)
    return tensors[0] if len(tensors) == 1 else list(tensors)


def wait_tensor(tensor):
    work = _pending.pop(storage_of(tensor), None)
    if work is not None:
        work.wait()
    return tensor


def _opts(op: str):
    opts = c10d.AllreduceOptions()
    opts.reduceOp = getattr(c10d.ReduceOp, op.upper())
    return opts


def all_reduce_(input, reduce_op: str, group_name):
    return _ready(_group(group_name).allreduce([input], _opts(reduce_op)), input)


def all_reduce(input, reduce_op: str, group_name):
    return all_reduce_(input.clone(), reduce_op, group_name)


def all_reduce_coalesced_(inputs, reduce_op: str, group_name):
    work = _group(group_name).allreduce(list(inputs), _opts(reduce_op))
    _track(work, inputs)
    return list(inputs)


def all_reduce_coalesced(inputs, reduce_op: str, group_name):
    return all_reduce_coalesced_([t.clone() for t in inputs], reduce_op, group_name)


def _gathered(input, group_size: int):
    shape = (input.shape[0] * group_size, *input.shape[1:]) if input.dim() else (group_size,)
    return input.new_empty(shape)


def all_gather_into_tensor_out(input, group_size: int, group_name, *, out):
    return _ready(_group(group_name).all_gather_single(out, input.contiguous()), out)


def all_gather_into_tensor(input, group_size: int, group_name):
    return all_gather_into_tensor_out(
        input, group_size, group_name, out=_gathered(input, group_size)
    )


def all_gather_into_tensor_coalesced(inputs, group_size: int, group_name):
    return [all_gather_into_tensor(t, group_size, group_name) for t in inputs]


def _scattered(input, group_size: int):
    return input.new_empty((input.shape[0] // group_size, *input.shape[1:]))


def reduce_scatter_tensor_out(input, reduce_op: str, group_size: int, group_name, *, out):
    pg = _group(group_name)
    opts = c10d.ReduceScatterOptions()
    opts.reduceOp = getattr(c10d.ReduceOp, reduce_op.upper())
    return _ready(pg.reduce_scatter_single(out, input.contiguous(), opts), out)


def reduce_scatter_tensor(input, reduce_op: str, group_size: int, group_name):
    out = _scattered(input, group_size)
    return reduce_scatter_tensor_out(input, reduce_op, group_size, group_name, out=out)


def reduce_scatter_tensor_coalesced(inputs, reduce_op: str, group_size: int, group_name):
    return [reduce_scatter_tensor(t, reduce_op, group_size, group_name) for t in inputs]


def all_to_all_single(input, output_split_sizes, input_split_sizes, group_name):
    pg = _group(group_name)
    rows = sum(output_split_sizes) if output_split_sizes else input.shape[0]
    out = input.new_empty((rows, *input.shape[1:]))
    work = pg.all_to_all_single(
        out, input.contiguous(), list(output_split_sizes), list(input_split_sizes)
    )
    return _ready(work, out)


def broadcast_(input, src: int, group_name):
    opts = c10d.BroadcastOptions()
    opts.rootRank = src
    return _ready(_group(group_name).broadcast([input], opts), input)


def broadcast(input, src: int, group_name):
    return broadcast_(input.clone(), src, group_name)


KERNELS = {
    "wait_tensor": wait_tensor,
    "all_reduce": all_reduce,
    "all_reduce_": all_reduce_,
    "all_reduce_coalesced": all_reduce_coalesced,
    "all_reduce_coalesced_": all_reduce_coalesced_,
    "all_gather_into_tensor": all_gather_into_tensor,
    "all_gather_into_tensor_out": all_gather_into_tensor_out,
    "all_gather_into_tensor_coalesced": all_gather_into_tensor_coalesced,
    "reduce_scatter_tensor": reduce_scatter_tensor,
    "reduce_scatter_tensor_out": reduce_scatter_tensor_out,
    "reduce_scatter_tensor_coalesced": reduce_scatter_tensor_coalesced,
    "all_to_all_single": all_to_all_single,
    "broadcast": broadcast,
    "broadcast_": broadcast_,
}


def register() -> None:
    for name, kernel in KERNELS.items():
        _lib.impl(name, kernel, "PrivateUse1")
