"""An op's argument values: carried to another device (meta tensors for PyTorch's
shape and argument checks in `executor`, CPU stand-ins for its dtype refusals in
`refusals`), and passed back to an overload in schema order."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .fallback import DEVICE_TYPE


def replace_tensors(value, tensor_fn: Callable[[torch.Tensor], object], device: str):
    """value with every tensor replaced by tensor_fn(tensor) and every tpu device (a
    torch.device or its name) by `device`, through lists and tuples."""
    if isinstance(value, torch.Tensor):
        return tensor_fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(replace_tensors(v, tensor_fn, device) for v in value)
    if isinstance(value, torch.device) and value.type == DEVICE_TYPE:
        return torch.device(device)
    if isinstance(value, str) and value.startswith(DEVICE_TYPE):
        return torch.device(device)
    return value


def tensors(value):
    """The tensors in value, through lists, tuples and dicts."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors(v)


def call_op(op: torch._ops.OpOverload, values: list):
    """op called with its arguments' values in schema order."""
    args, kwargs = split_args(op, values)
    return op(*args, **kwargs)


def split_args(op: torch._ops.OpOverload, values: list) -> tuple[list, dict]:
    """Values in schema order as positional arguments and kwarg-only ones by name."""
    schema = op._schema.arguments
    args = [v for a, v in zip(schema, values) if not a.kwarg_only]
    return args, {a.name: v for a, v in zip(schema, values) if a.kwarg_only}
