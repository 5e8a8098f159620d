"""DEFER_NEVER_AND_LAUNCH_BLOCKING: run each op to completion and say exactly
which op, on which inputs, from which line of user code, failed or produced
NaN/Inf."""

from __future__ import annotations

import os
import traceback

import jax
import jax.numpy as jnp
import torch

from . import modes

_INTERNAL = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch, jax, __import__("torch_tpu"))
) + ("<frozen", os.path.dirname(traceback.__file__) + os.sep + "contextlib")


class TpuOpError(RuntimeError):
    """An op failed (or, with NaN checks on, produced NaN/Inf) in debug mode."""


_ERROR_TYPES: dict[type, type] = {}


def _error_type(original: type) -> type:
    """TpuOpError that is also the original exception's type, so `except IndexError`
    (and PyTorch's own tests) see in debug mode what they see on CPU."""
    if issubclass(original, TpuOpError) or original is RuntimeError:
        return TpuOpError
    kind = _ERROR_TYPES.get(original)
    if kind is None:
        try:
            kind = type(f"TpuOpError[{original.__name__}]", (TpuOpError, original), {})
        except TypeError:  # an exception type with its own instance layout
            kind = TpuOpError
        _ERROR_TYPES[original] = kind
    return kind


def user_line() -> str:
    """The innermost stack frame outside torch, jax and torch_tpu: the user's line."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_INTERNAL):
            code = (frame.line or "").strip()  # empty for `python -c` and the REPL
            where = f"{frame.filename}:{frame.lineno} in {frame.name}"
            return f'{where}: "{code}"' if code else where
    return "<unknown>"


def describe(values) -> str:
    parts = []
    for v in values:
        if isinstance(v, torch.Tensor):
            parts.append(f"Tensor{list(v.shape)}:{str(v.dtype).removeprefix('torch.')}:{v.device}")
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            parts.append("[" + describe(v) + "]")
        else:
            parts.append(repr(v))
    return ", ".join(parts)


def guarded(run, spec, args: tuple, kwargs: dict):
    """Run one op; re-raise any failure naming the op, its inputs and the user's line."""
    try:
        return run(spec, args, kwargs)
    except TpuOpError:
        raise
    except Exception as e:
        values = list(args) + list(kwargs.values())
        raise _error_type(type(e))(
            f"{spec.schema.name} failed on ({describe(values)}) at {user_line()}: "
            f"{type(e).__name__}: {e}"
        ) from e


def run_blocking(spec, values, fn, arrays, dynamic, key_inputs):
    """Call the executable and wait for it; with NaN checks on, inspect its outputs."""
    fresh, written = fn(arrays, dynamic, key_inputs)
    jax.block_until_ready((fresh, written))
    if modes.check_nans:
        for out in jax.tree_util.tree_leaves((fresh, written)):
            if jnp.issubdtype(out.dtype, jnp.inexact) and not bool(jnp.isfinite(out).all()):
                raise TpuOpError(
                    f"{spec.schema.name} produced NaN or Inf from ({describe(values)}) "
                    f"at {user_line()}"
                )
    return fresh, written
