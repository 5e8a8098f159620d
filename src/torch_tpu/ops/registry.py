"""The one registry of ATen lowerings.

A lowering is a pure function from JAX arrays (and static Python values) to
JAX arrays. It receives the op's arguments in schema order — tensors as
arrays, Scalars as (possibly traced) numbers, everything else as the Python
value — and returns one value per schema return, followed by the new value
of each argument listed in `writes` (arguments the op mutates without saying
so in its schema, like native_batch_norm's running statistics). It knows
nothing about execution modes: strict eager, fused eager and torch.compile
all call the same function.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Lowering:
    name: str  # "add.Tensor": an aten overload, "default" for the plain name
    fn: Callable
    static_scalars: bool = False  # Scalars are compile-time constants (arange's bounds)
    random: bool = False  # fn takes a jax PRNG key as its first argument
    # a random op filling self whose every element is drawn from the key and its flat
    # index alone: a larger 1-D draw holds this one as its prefix (engine/predrawn)
    elementwise_draw: bool = False
    # output shape depends on values: runs un-jitted. A callable decides per call, from
    # the op's bound arguments (index.Tensor: only when an index is a bool mask).
    dynamic_shape: bool | Callable[[list], bool] = False
    writes: tuple[str, ...] = ()  # arguments mutated although the schema does not say so
    # fn also gets contiguous=(bool per tensor argument): for the few ops whose results
    # PyTorch defines by the input's memory layout (det's LU factors)
    contiguity: bool = False
    # PyTorch's meta kernel rejects valid calls or disagrees with the CPU kernel (2.13's
    # fused LSTM cell without biases; MHA's absent weights): output shapes come from the
    # lowering itself, as for ops with no meta kernel
    skip_meta: bool = False
    # float arguments passed at run time like Scalars (an optimizer's lr and betas, which
    # a scheduler changes every step): no recompile per value
    runtime_floats: tuple[str, ...] = ()
    # PyTorch's argument checks that its meta kernels miss (data-dependent ops, ops whose
    # meta raises the wrong type): called with the op's bound arguments before anything
    # runs, on every call, so it must be cheap and sync only where CPU would (bool masks)
    check: Callable[[list], None] | None = None
    # index values CPU refuses, judged on the device without a sync (strict and fused
    # modes; engine/device_asserts.py): called in the program with the lowering's inputs,
    # returns [(traced bool "some value is out of range", error type, CPU's message)]
    device_check: Callable[..., list] | None = None
    # called with the op's bound arguments: whether this call needs device_check at all
    # (None: every call does). A call without it carries no flag and keeps every fast
    # path: integer division checks its divisor only when that is a device tensor of
    # integers (a number is judged on the host, floats divide by zero as CPU does)
    device_check_applies: Callable[[list], bool] | None = None
    # PyTorch's meta kernel lays the result out otherwise than CPU's kernel (a
    # convolution of channels_last tensors: contiguous on meta, channels_last on CPU):
    # called with the meta arguments and the meta result, returns the result as CPU
    # lays it out (its strides become the result's)
    result_layout: Callable[[list, object], object] | None = None


LOWERINGS: dict[str, Lowering] = {}

_prefix = threading.local()


def result_prefix(array, axis: int, length: int):
    """From a lowering run unjitted (`dynamic_shape`): its result is the first `length`
    entries of `array` along `axis`. The executor makes that a view, so that `array`
    can have a bucket's size: one program for every count in the bucket, where a
    result of exactly `length` entries (a bool mask's True count) compiled per count."""
    _prefix.value = (axis, length)
    return array


def take_result_prefix() -> tuple[int, int] | None:
    """(axis, length) noted by the lowering that just ran, once."""
    value = getattr(_prefix, "value", None)
    _prefix.value = None
    return value


def in_memory_format(result, memory_format: torch.memory_format):
    """A meta result laid out as `empty(..., memory_format=)` lays it out, as CPU's
    kernels allocate: `result.contiguous(memory_format=)` keeps contiguous strides when
    a size-1 channel dim makes them channels_last too (CPU gives (HW, 1, W, 1))."""
    if memory_format is torch.contiguous_format:
        return result
    return torch.empty(
        result.shape, dtype=result.dtype, device=result.device, memory_format=memory_format
    )


def canonical(name: str) -> str:
    """'aten::relu' and 'relu' -> 'relu.default'; 'add.Tensor' stays."""
    name = name.removeprefix("aten::")
    return name if "." in name else f"{name}.default"


def lower(
    *names: str,
    static_scalars: bool = False,
    random: bool = False,
    elementwise_draw: bool = False,
    dynamic_shape: bool | Callable[[list], bool] = False,
    writes: tuple[str, ...] = (),
    contiguity: bool = False,
    skip_meta: bool = False,
    runtime_floats: tuple[str, ...] = (),
    check: Callable[[list], None] | None = None,
    device_check: Callable[..., list] | None = None,
    device_check_applies: Callable[[list], bool] | None = None,
    result_layout: Callable[[list, object], object] | None = None,
    replace: bool = False,
) -> Callable[[Callable], Callable]:
    """Register fn as the lowering of each named overload: an aten one, or
    "namespace::op" for a custom op (a jax_op; `replace=True` when it is redefined)."""

    def register(fn: Callable) -> Callable:
        for name in names:
            key = canonical(name)
            if key in LOWERINGS and not replace:
                raise ValueError(f"aten::{key} is lowered twice")
            LOWERINGS[key] = Lowering(
                key,
                fn,
                static_scalars=static_scalars,
                random=random,
                elementwise_draw=elementwise_draw,
                dynamic_shape=dynamic_shape,
                writes=writes,
                contiguity=contiguity,
                skip_meta=skip_meta,
                runtime_floats=runtime_floats,
                check=check,
                device_check=device_check,
                device_check_applies=device_check_applies,
                result_layout=result_layout,
            )
        return fn

    return register
