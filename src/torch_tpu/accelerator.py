"""torch.accelerator for the tpu device.

torch.accelerator's functions check their arguments in Python, then call C++
entry points (`torch._C._accelerator_*`) that reach the backend's device guard
and device allocator. A Python backend's guard (`torch._C._acc.DeviceGuard`)
cannot synchronize or time, and it has no allocator, so
`torch.accelerator.synchronize()` and every memory query would raise. While
tpu is the current accelerator, install() routes those entry points to
torch_tpu (streams.py, memory.py); for any other accelerator they are
PyTorch's own. The device index goes to torch.tpu too: through the guard it
would start the device (JAX and every kernel) in CPU-only programs, since the
DataLoader asks for it whenever it pins memory with workers.
"""

from __future__ import annotations

from typing import Any

import torch

from . import memory, streams


def _tpu_is_current() -> bool:
    accelerator = torch._C._accelerator_getAccelerator()
    return accelerator is not None and accelerator.type == "tpu"


def _capability(device_index: int) -> dict[str, Any]:
    from . import dtypes

    return {"supported_dtypes": set(dtypes.TORCH_TO_JAX)}


def _set_stream(stream: torch.Stream) -> None:
    streams.set_stream(stream)


def _device_index() -> int:
    from . import api

    return api.current_device()


def _set_device_index(device_index: int) -> None:
    from . import api

    api.set_device(device_index)


_ROUTES = {
    "_accelerator_getDeviceIndex": _device_index,
    "_accelerator_setDeviceIndex": _set_device_index,
    "_accelerator_synchronizeDevice": lambda device_index: streams.synchronize(),
    "_accelerator_getStream": lambda device_index: streams.current_stream(),
    "_accelerator_setStream": _set_stream,
    "_accelerator_isAllocatorInitialized": lambda: True,
    "_accelerator_getDeviceStats": lambda device_index: memory.nested_stats(),
    "_accelerator_resetPeakStats": lambda device_index: memory.reset_peak(),
    "_accelerator_resetAccumulatedStats": lambda device_index: None,  # none are kept
    "_accelerator_emptyCache": memory.release,
    "_accelerator_emptyHostCache": lambda: None,  # pinned buffers are freed with their tensor
    "_accelerator_getMemoryInfo": lambda device_index: memory.info(),
    "_accelerator_getDeviceCapability": _capability,
}
_installed = False


def _route(original, tpu_function):
    def entry(*args):
        if _tpu_is_current():
            return tpu_function(*args)
        return original(*args)

    entry.__name__ = original.__name__
    entry.__doc__ = original.__doc__
    return entry


def install() -> None:
    """Route torch.accelerator's device entry points to torch_tpu (once per process)."""
    global _installed
    if _installed:
        return
    for name, tpu_function in _ROUTES.items():
        setattr(torch._C, name, _route(getattr(torch._C, name), tpu_function))
    _installed = True
