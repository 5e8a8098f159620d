"""Makes PrivateUse1 PyTorch's `tpu` device: rename, Python hooks, device guard, torch.tpu."""

from __future__ import annotations

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from . import accelerator, api, modules, pinned, platform, serialization


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return api.is_available()

    def has_primary_context(self, device_index: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def register() -> None:
    """Rename PrivateUse1 to tpu and install torch.tpu (once per process)."""
    if torch._C._get_privateuse1_backend_name() == "tpu":
        return
    # fail early, with a clear message, on a bad TORCH_TPU_PLATFORM (without starting JAX)
    platform.forced()
    _setup_privateuseone_for_python_backend(
        rename="tpu", backend_module=api, hook=_Hooks(), device_guard=_DeviceGuard()
    )
    serialization.install()
    modules.install()  # cpu<->tpu conversions keep Parameter objects and ties, as on CUDA
    pinned.install()  # before anything can pin: tpu is now the current accelerator
    accelerator.install()
