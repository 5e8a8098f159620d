"""torch_tpu: PyTorch's `tpu` device, with every op executed by XLA through JAX.

`import torch` loads this package through PyTorch's device-backend autoload
(the `torch.backends` entry point); with TORCH_DEVICE_BACKEND_AUTOLOAD=0,
`import torch_tpu` does the same.
"""

from __future__ import annotations


def _autoload() -> None:
    """Entry point PyTorch calls at the end of `import torch`.

    When this package is what imported torch (`python -m torch_tpu`), torch
    calls back here before the package has finished importing; the import
    then completes the registration itself.
    """
    if "init" in globals():
        init()


import jax  # noqa: E402
import torch  # noqa: E402, F401

jax.config.update("jax_enable_x64", True)  # int64 and float64 tensors must be real

from . import api, cache, device, metrics  # noqa: E402
from .engine import kernels  # noqa: E402

__all__ = ["api", "cache", "metrics", "init"]
__version__ = "0.1.0"

_initialised = False


def init() -> None:
    """Register the tpu device and its kernels (idempotent)."""
    global _initialised
    if _initialised:
        return
    from . import distributed, platform

    device.register()  # JAX's backend starts on first use, not here (tpu_dist comes first)
    from .amp import install as install_amp  # autocast: cast kernels at first use
    install_amp()
    jax.config.update("jax_default_device", platform.forced())  # exact device set at start
    kernels.register_all()
    distributed.register()
    _initialised = True
    from .compile import install as install_compile  # `tpu` registers at first torch.compile

    install_compile()


init()
