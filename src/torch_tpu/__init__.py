"""torch_tpu: PyTorch's `tpu` device, with every op executed by XLA through JAX.

`import torch` loads this package through PyTorch's device-backend autoload
(the `torch.backends` entry point); with TORCH_DEVICE_BACKEND_AUTOLOAD=0,
`import torch_tpu` does the same. Start-up has two stages, so that programs
that never use the device pay almost nothing:

- `register()`, at import: names the device `tpu` and installs what PyTorch
  must find before the first tpu use. No JAX, no engine, no environment checks.
- `init()`, at the first tpu use (PyTorch's `torch.tpu._lazy_init`, the
  PrivateUse1 fallback, the `tpu_dist` creator, torch.tpu functions that
  need the device): JAX, the op tables and the kernel registrations.
"""

from __future__ import annotations

import importlib
import threading


def _autoload() -> None:
    """Entry point PyTorch calls at the end of `import torch`.

    When this package is what imported torch (`python -m torch_tpu`), torch
    calls back here before the package has finished importing; the import
    then completes the registration itself.
    """
    if "register" in globals():
        register()


import torch  # noqa: E402, F401

from . import device  # noqa: E402

__all__ = ["api", "cache", "compile_step", "metrics", "init", "register"]
__version__ = "0.1.0"

_initialised = False
_starting = False
_init_lock = threading.RLock()  # two threads' first tpu ops must not register kernels twice
_LAZY_SUBMODULES = ("cache", "metrics")  # torch_tpu.cache etc. without importing them at autoload


def register() -> None:
    """Make `tpu` a device PyTorch knows (idempotent, cheap: runs in every `import torch`).

    The registration path: an `install()` that PyTorch must see before the
    first tpu use goes here, and must not import JAX or the engine (see
    tests/test_startup.py). Anything else belongs in `init()`.
    """
    device.register()
    from .amp import install as install_amp  # autocast: bf16 default; cast kernels at first use
    from .compile import install as install_compile  # wraps torch.compile; Dynamo stays unloaded

    install_amp()
    install_compile()


def init() -> None:
    """Start the device (idempotent): called at its first use, or explicitly.

    Reads and checks the TORCH_TPU_* environment (a bad value raises here,
    never at import), loads JAX and registers every kernel. Does not start
    JAX's backend: `jax.distributed` (tpu_dist) must initialise before it.
    """
    global _starting
    if _initialised:
        return
    with _init_lock:
        if _initialised:
            return
        if _starting:  # same thread (the lock is re-entrant): a tpu op inside start-up itself
            raise RuntimeError("torch_tpu: a tpu op ran while the device was starting")
        _starting = True
        try:
            _start()
        finally:
            _starting = False


def _start() -> None:
    global _initialised
    from . import env, platform
    from .engine import modes

    env.check_all()  # a bad TORCH_TPU_* value stops here, named, with its fix
    modes.configure()
    forced = platform.forced()

    import jax

    jax.config.update("jax_enable_x64", True)  # int64 and float64 tensors must be real
    jax.config.update("jax_default_device", forced)  # exact device set at start

    from . import distributed
    from .engine import kernels

    kernels.register_all()
    distributed.register()
    from .interop.exchange import install_dlpack

    install_dlpack()  # tpu tensors' __dlpack__: PyTorch's would pack a fake address
    _initialised = True


_LAZY_INTEROP = {"jax_op": "jax_op", "to_jax": "exchange", "from_jax": "exchange"}


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY_INTEROP:  # JAX interop (docs/kernels.md): imports JAX, so only when asked
        init()
        return getattr(importlib.import_module(f"{__name__}.interop.{_LAZY_INTEROP[name]}"), name)
    if name == "compile_step":  # whole-step compilation; its module loads at first use
        from .compile.step import compile_step

        return compile_step
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register()
