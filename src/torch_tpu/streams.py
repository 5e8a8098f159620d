"""Streams and events of the tpu device (torch.tpu.Stream/Event, and what
torch.accelerator.current_stream returns).

XLA orders a device's programs by their data dependencies, so every tpu stream
is the same in-order queue: waiting for another stream or an event orders
nothing more, and synchronizing a stream waits for the device. The classes
subclass torch.Stream and torch.Event so that device-agnostic code
(`torch.accelerator.set_stream`, `with stream:`) accepts them. Events time on
the host after waiting for the device, so `elapsed_time` measures device work
between two records.

A bare `torch.Event(device="tpu")` is PyTorch's C++ event, whose Python
backend guard neither records nor times (elapsed_time raises); use
`torch.tpu.Event` or `torch.get_device_module("tpu").Event`.
"""

from __future__ import annotations

import contextlib
import time

import torch

from . import memory


def synchronize() -> None:
    """Run what fused mode has recorded, finish every unfinished collective (as a device
    synchronize waits for the communication streams too), then wait until every value
    dispatched to the device has been computed (nothing to wait for before JAX's backend
    starts), and report a failed device check (engine/device_asserts.py)."""
    import sys

    fuse = sys.modules.get("torch_tpu.engine.fuse")
    if fuse is not None:
        fuse.flush("synchronize()")
    collectives = sys.modules.get("torch_tpu.distributed.work")
    if collectives is not None:
        collectives.settle_all()
    if not memory.backend_started():
        return
    import jax

    from . import platform

    try:
        jax.block_until_ready(jax.live_arrays(platform.platform()))  # one batched wait
    except jax.errors.JaxRuntimeError as error:
        from . import memory_errors

        memory_errors.raise_if_out_of_memory(error)
        raise
    memory.sample()
    asserts = sys.modules.get("torch_tpu.engine.device_asserts")
    if asserts is not None:
        asserts.raise_if_failed()  # (an index out of range since the last read)


def _ready() -> bool:
    if not memory.backend_started():
        return True
    import jax

    from . import platform

    return all(a.is_ready() for a in jax.live_arrays(platform.platform()))


class Stream(torch.Stream):
    """A tpu stream: the device's single in-order queue (see the module docstring)."""

    def __new__(cls, device=None, priority: int = 0) -> Stream:
        return super().__new__(cls, device=_tpu_device(device), priority=priority)

    def __init__(self, device=None, priority: int = 0) -> None:
        self.priority = priority

    def synchronize(self) -> None:
        synchronize()

    def query(self) -> bool:
        return _ready()

    def wait_event(self, event: torch.Event) -> None:
        """Work queued after this call already runs after the event's work."""

    def wait_stream(self, stream: torch.Stream) -> None:
        """Work queued after this call already runs after the other stream's work."""

    def record_event(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def __enter__(self) -> Stream:
        self._previous = current_stream()
        set_stream(self)
        return self

    def __exit__(self, *exc) -> None:
        set_stream(self._previous)


class Event(torch.Event):
    """Marks a point in the device's work; records wait for the device, then read the
    host clock, so elapsed_time between two records is the device time between them."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess=False):
        return super().__new__(
            cls, device="tpu", enable_timing=enable_timing, blocking=blocking,
            interprocess=interprocess,
        )

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess=False):
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: torch.Stream | None = None) -> None:
        synchronize()
        self._time = time.perf_counter()

    def query(self) -> bool:
        return True  # recording waited for the device

    def synchronize(self) -> None:
        synchronize()

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Work queued after this call already runs after the event's work."""

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds between this event's record and end_event's."""
        if not (self.enable_timing and getattr(end_event, "enable_timing", False)):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or getattr(end_event, "_time", None) is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0


def _tpu_device(device) -> torch.device:
    from . import api

    return torch.device("tpu", api._index(device if device is not None else 0))


_default: Stream | None = None
_current: torch.Stream | None = None


def default_stream(device=None) -> Stream:
    global _default
    _tpu_device(device)
    if _default is None:
        _default = Stream()
    return _default


def current_stream(device=None) -> torch.Stream:
    """(Dynamo guards every compiled call of a tpu graph on it: one device check only.)"""
    if _current is not None:
        _tpu_device(device)
        return _current
    return default_stream(device)


def set_stream(stream: torch.Stream | None) -> None:
    """Make stream the current tpu stream (None: leave it as it is, like torch.cuda)."""
    global _current
    if stream is not None:
        _current = stream


@contextlib.contextmanager
def stream(s: torch.Stream | None):
    """Make s the current stream within the block."""
    previous = current_stream()
    set_stream(s)
    try:
        yield s
    finally:
        set_stream(previous)
