"""Makes PrivateUse1 PyTorch's `tpu` device: rename, Python hooks, device guard, torch.tpu,
serialization, the boxed fallback and the `tpu_dist` backend name.

Everything here runs in every `import torch` (autoload), so none of it loads
JAX or the engine: the fallback and the `tpu_dist` creator start the package
(`torch_tpu.init`) on their first call.
"""

from __future__ import annotations

import functools
import sys

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from . import accelerator, api, modules, pinned, serialization, storages

# The one PrivateUse1 fallback: it outlives register() (the library unregisters when freed).
_fallback_library: torch.library.Library | None = None


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


def _fallback(op, *args, **kwargs):
    """PrivateUse1's boxed fallback. Before the device has started, an op reaching it
    starts the device (registering the real kernels) and dispatches again; after,
    it is the engine's CPU fallback for ops with no tpu kernel."""
    from .engine import fallback

    if not api.is_initialized():
        api._lazy_init()
        return op(*args, **kwargs)
    return fallback.run_on_cpu(op, args, kwargs)


def _sparse_fallback(op, *args, **kwargs):
    """The sparse tpu keys' boxed fallback: PyTorch's own message ("Could not run ...
    from the 'Sparsetpu' backend") named an internal constructor, not the limit."""
    raise NotImplementedError(
        f"{op._schema.name}: sparse tensors are not supported on tpu (tpu tensors are dense "
        "only); use dense gradients (nn.Embedding(sparse=False), gather without "
        "sparse_grad, an optimizer other than SparseAdam) or keep sparse work on the CPU"
    )


def _nested_fallback(op, *args, **kwargs):
    """The strided nested tpu key's boxed fallback: such a tensor is built without a tpu
    op (a dense buffer wrapped on the host side), so its first op is where it can be
    refused; PyTorch's own message named the 'NestedTensortpu' backend. Jagged nested
    tensors are dense tensors underneath and run."""
    raise NotImplementedError(
        f"{op._schema.name}: nested tensors of layout torch.strided are not supported on "
        "tpu; use torch.nested.nested_tensor(..., layout=torch.jagged), pad the batch, or "
        "keep nested work on the CPU"
    )


def _quantized_fallback(op, *args, **kwargs):
    """The quantized tpu key's boxed fallback: PyTorch's own message ("Could not run
    'aten::empty_quantized' ... 'Quantizedtpu' backend") named an internal constructor."""
    raise NotImplementedError(
        f"{op._schema.name}: quantized tensors are not supported on tpu; dequantize() "
        "before moving to tpu, or keep quantized work on the CPU"
    )


def _create_tpu_dist(*args, **kwargs):
    """c10d's creator for `tpu_dist` until the device starts (which re-registers the real one)."""
    sys.modules[__package__].init()
    from .distributed import create

    return create(*args, **kwargs)


def _start_before_rendezvous(original):
    """init_process_group("tpu_dist") starts the device before the ranks meet: started
    after, each rank's start-up (seconds) would eat into the JAX job's join timeout."""

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        backend = kwargs.get("backend", args[0] if args else None)
        if backend is not None and "tpu_dist" in str(backend).lower():
            sys.modules[__package__].init()
        return original(*args, **kwargs)

    return init_process_group


def _register_tpu_dist() -> None:
    import torch.distributed as dist

    if dist.is_available():
        dist.Backend.register_backend(
            "tpu_dist", _create_tpu_dist, extended_api=True, devices=["tpu"]
        )
        dist.init_process_group = _start_before_rendezvous(dist.init_process_group)


def register() -> None:
    """Rename PrivateUse1 to tpu and install torch.tpu (once per process)."""
    global _fallback_library
    if torch._C._get_privateuse1_backend_name() == "tpu":
        return
    _setup_privateuseone_for_python_backend(
        rename="tpu", backend_module=api, hook=_Hooks(), device_guard=_DeviceGuard()
    )
    serialization.install()
    storages.install()  # (PyTorch's constructor would crash on tpu)
    modules.install()  # cpu<->tpu conversions keep Parameter objects and ties, as on CUDA
    pinned.install()  # before anything can pin: tpu is now the current accelerator
    accelerator.install()
    _fallback_library = torch.library.Library("_", "IMPL")
    _fallback_library.fallback(_fallback, "PrivateUse1")
    for sparse_key in ("SparsePrivateUse1", "SparseCsrPrivateUse1"):
        _fallback_library.fallback(_sparse_fallback, sparse_key)
    _fallback_library.fallback(_quantized_fallback, "QuantizedPrivateUse1")
    _fallback_library.fallback(_nested_fallback, "NestedTensorPrivateUse1")
    _register_tpu_dist()
