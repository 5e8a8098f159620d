"""Work objects: what `async_op=True` returns, what DDP and FSDP wait on.

A collective is dispatched asynchronously, like any tpu op. `wait()` blocks
until its XLA program has finished, within the process group's timeout:
a peer that died, hangs or never calls the collective becomes a Python
error here instead of a hang, and so do ranks that called mismatched
collectives. `get_future()` waits the same way and returns a completed
future, so callbacks chained on it (DDP's comm hooks) run on the calling
thread, never concurrently with it.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable

import numpy as np
import torch
from torch._C._distributed_c10d import Work

from . import runtime


class CollectiveError(torch.distributed.DistBackendError):
    """A tpu_dist collective failed on this rank, or ranks called mismatched collectives."""


class CollectiveTimeout(CollectiveError):
    """A tpu_dist collective did not complete within the process group's timeout."""


class TpuWork(Work):
    """One dispatched collective (or several, waited for together)."""

    def __init__(
        self,
        what: str,
        timeout: datetime.timedelta,
        arrays: list,
        checks: list[tuple[int, object, Callable[[], str]]],
        result: list[torch.Tensor],
    ) -> None:
        super().__init__()
        self._what = what
        self._timeout = timeout
        self._arrays = arrays  # JAX arrays whose readiness means the collective is done
        self._checks = checks  # (own signature, group's signatures, describe mismatch)
        self._result = result
        self._error: BaseException | None = None
        self._done = False
        self._future: torch.futures.Future | None = None

    def is_completed(self) -> bool:
        return self._done or all(a.is_ready() for a in self._arrays)

    def is_success(self) -> bool:
        return self._done and self._error is None

    def exception(self):
        return self._error

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._result

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._done:
            self._finish(timeout)
        if self._error is not None:
            raise self._error
        return True

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            future = torch.futures.Future()
            try:
                self.wait()
                future.set_result(self._result)
            except Exception as e:
                future.set_exception(e)
            self._future = future
        return self._future

    def _finish(self, timeout) -> None:
        self._done = True
        limit = self._timeout if not timeout or timeout.total_seconds() <= 0 else timeout
        try:
            _wait_ready(self._arrays, limit, self._what)
            for own, signatures, describe in self._checks:
                signatures = np.asarray(signatures)
                if not (signatures == own).all():
                    raise CollectiveError(describe())
        except CollectiveError as e:
            self._error = e
        except Exception as e:  # the XLA program failed: a peer closed its connection
            self._error = peer_failure(self._what, e)
        finally:
            self._arrays = []


def peer_failure(what: str, error: Exception) -> CollectiveError:
    """The error for a collective whose XLA program failed (a peer closed its connection)."""
    return CollectiveError(
        f"tpu_dist: {what} failed on rank {runtime.rank()}: a peer process died or left the "
        f"job: {error}"
    )


def timed_out(what: str, limit: datetime.timedelta) -> CollectiveTimeout:
    return CollectiveTimeout(
        f"tpu_dist: {what} did not complete within the process group timeout ({limit}) on "
        f"rank {runtime.rank()}: a rank died, hangs, or did not call this collective"
    )


def _wait_ready(arrays: list, limit: datetime.timedelta, what: str) -> None:
    """Poll until every array is computed; a clear error after `limit`.

    (A JAX wait cannot be interrupted, so the wait polls `is_ready`.)"""
    deadline = time.monotonic() + limit.total_seconds()
    pause = 0.0
    while not all(a.is_ready() for a in arrays):
        if time.monotonic() > deadline:
            raise timed_out(what, limit)
        time.sleep(pause)
        pause = min(pause * 2 or 2e-5, 2e-3)
    for a in arrays:
        a.block_until_ready()  # raises the XLA error of a failed collective


def completed(result: list[torch.Tensor]) -> TpuWork:
    """A Work for a call that needed no communication (a group of one)."""
    return TpuWork("noop", datetime.timedelta(seconds=1), [], [], result)
