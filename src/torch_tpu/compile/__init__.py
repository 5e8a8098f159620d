"""torch.compile for tpu: the Dynamo backend `tpu` (see backend.py).

Importing Dynamo costs about a second, so `init()` only wraps torch.compile
(`install`); the backend is registered the first time torch.compile runs, or
by `register()` for code that calls torch._dynamo directly.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["custom_compiler_options", "install", "register"]


def register() -> None:
    """Register the `tpu` backend and torch.compile's routing of tpu graphs (idempotent)."""
    from . import backend

    backend.register()


def install() -> None:
    """Make torch.compile register the tpu backend before it compiles anything."""
    original = torch.compile
    if getattr(original, "_torch_tpu_registers", False):
        return

    @functools.wraps(original)
    def compile(*args, **kwargs):
        register()
        return original(*args, **kwargs)

    compile._torch_tpu_registers = True
    torch.compile = compile


def __getattr__(name: str):
    """`custom_compiler_options` imports JAX (through cache): only when asked for, since
    `install` runs in every `import torch`."""
    if name == "custom_compiler_options":
        from .options import custom_compiler_options

        return custom_compiler_options
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
