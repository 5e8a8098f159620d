"""Work objects: what `async_op=True` returns, what DDP and FSDP wait on.

A collective is dispatched asynchronously, like any tpu op: the caller goes
on (computing, issuing more collectives) while it runs. `wait()` blocks
until its XLA program has finished, within the process group's timeout, and
then writes its outputs into the caller's tensors; a collective that reads
or writes a tensor an unfinished one writes waits for that one first. A
peer that died, hangs or never calls the collective becomes a Python
error here instead of a hang, and so do ranks that called mismatched
collectives (whose outputs are then never written). `get_future()` waits
the same way and returns a completed future, so callbacks chained on it
(DDP's comm hooks) run on the calling thread, never concurrently with it.
"""

from __future__ import annotations

import datetime
import os
import time
import weakref
from collections.abc import Callable

import numpy as np
import torch
from torch._C._distributed_c10d import Work

from ..tensor import storage_of
from . import runtime


class CollectiveError(torch.distributed.DistBackendError):
    """A tpu_dist collective failed on this rank, or ranks called mismatched collectives."""


class CollectiveTimeout(CollectiveError):
    """A tpu_dist collective did not complete within the process group's timeout."""


class Launch:
    """One dispatched collective: its outcome (signatures and output blocks still being
    computed, or the error XLA raised at dispatch), the tensors it writes and how
    (`deliver`, run by the wait once the ranks agreed), and the error text for ranks
    that disagreed."""

    __slots__ = ("what", "outcome", "writes", "deliver", "mismatch")

    def __init__(
        self,
        what: str,
        outcome: tuple | Exception,
        writes: list[torch.Tensor],
        deliver: Callable[[list], None],
        mismatch: Callable[[], str],
    ) -> None:
        self.what = what
        self.outcome = outcome
        self.writes = writes
        self.deliver = deliver
        self.mismatch = mismatch

    def result(self) -> tuple:
        """(own signature, the group's signatures, output blocks)."""
        if isinstance(self.outcome, Exception):  # a peer closed its connection
            raise peer_failure(self.what, self.outcome)
        return self.outcome


# Storage -> the work that will write it. A collective reading or writing a storage
# waits for it first, as collectives on one stream are ordered on an accelerator.
_unfinished: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def settle(t: torch.Tensor) -> None:
    """Wait for the unfinished collective that writes t's storage, if any."""
    work = _unfinished.get(storage_of(t))
    if work is not None:
        work.wait()


def settle_all() -> None:
    """Wait for every unfinished collective that writes a tensor."""
    for work in set(_unfinished.values()):
        work.wait()


class TpuWork(Work):
    """Dispatched collectives, waited for together. The caller goes on while they run;
    their outputs reach the caller's tensors at `wait()` (as on an accelerator, where
    reading an async collective's output before waiting is a race)."""

    def __init__(
        self,
        what: str,
        timeout: datetime.timedelta,
        launches: list[Launch],
        result: list[torch.Tensor],
    ) -> None:
        super().__init__()
        self._what = what
        self._timeout = timeout
        self._launches = launches
        self._result = result
        self._error: BaseException | None = None
        self._done = False
        self._future: torch.futures.Future | None = None
        for launch in launches:
            for t in launch.writes:
                _unfinished[storage_of(t)] = self

    def is_completed(self) -> bool:
        if self._done:
            return True
        try:
            results = [launch.result() for launch in self._launches]
        except CollectiveError:
            return True  # failed: wait() raises
        return all(a.is_ready() for a in self._arrays(results))

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

    @staticmethod
    def _arrays(results: list[tuple]) -> list:
        return [a for _, signatures, outputs in results for a in (signatures, *outputs)]

    def _finish(self, timeout) -> None:
        self._done = True
        limit = self._timeout if not timeout or timeout.total_seconds() <= 0 else timeout
        deadline = time.monotonic() + limit.total_seconds()
        launches, self._launches = self._launches, []
        try:
            results = [launch.result() for launch in launches]
            _wait_ready(self._arrays(results), deadline, limit, self._what)
            for launch, (own, signatures, _) in zip(launches, results):
                if not (np.asarray(signatures) == own).all():
                    raise CollectiveError(launch.mismatch())
            for launch, (_, _, outputs) in zip(launches, results):
                launch.deliver(outputs)
        except CollectiveError as e:
            self._error = e
        except Exception as e:  # the XLA program failed: a peer closed its connection
            self._error = peer_failure(self._what, e)
        finally:
            for launch in launches:
                for t in launch.writes:
                    if _unfinished.get(storage_of(t)) is self:
                        del _unfinished[storage_of(t)]


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


# How long a wait spins (yielding the core between polls) before it sleeps between polls:
# a small collective's round trip. Sleeping even 10 µs costs a wake-up of 50-100 µs.
_SPIN_SECONDS = 1e-3


def _wait_ready(arrays: list, deadline: float, limit: datetime.timedelta, what: str) -> None:
    """Poll until every array is computed; a clear error after the deadline.

    (A JAX wait cannot be interrupted, so the wait polls `is_ready`.) For the first
    millisecond it only yields the core between polls, so a small collective is seen
    done at once; then each pause is a tenth of the time waited so far (up to 2 ms),
    so a long one costs few polls."""
    start = time.monotonic()
    while not all(a.is_ready() for a in arrays):
        now = time.monotonic()
        if now > deadline:
            raise timed_out(what, limit)
        waited = now - start
        if waited < _SPIN_SECONDS:
            os.sched_yield()
        else:
            time.sleep(min(waited / 10, 2e-3))
    for a in arrays:
        a.block_until_ready()  # raises the XLA error of a failed collective
