"""One rank of a tpu_dist test job: runs a scenario's checks and writes their results.

Usage: worker.py SCENARIO RESULT_FILE (rank, world size and rendezvous come from the
environment, as torchrun sets them, or from TPU_DIST_INIT=tcp://... for explicit init).
Each check records "ok" or its error, so one launch of the processes serves many
checks (importing torch and JAX costs seconds per process).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK") or os.environ["TPU_DIST_RANK"])
WORLD = int(os.environ.get("WORLD_SIZE") or os.environ["TPU_DIST_WORLD_SIZE"])
TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("TPU_DIST_TIMEOUT", "60")))
results: dict[str, str] = {}
seconds: dict[str, float] = {}


def check(name: str):
    def run(fn):
        begin = time.perf_counter()
        try:
            fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc(limit=6)
        seconds[name] = round(time.perf_counter() - begin, 1)
        return fn

    return run


def init() -> None:
    method = os.environ.get("TPU_DIST_INIT")
    if method:  # explicit init_method, rank and world size
        dist.init_process_group(
            "tpu_dist", init_method=method, rank=RANK, world_size=WORLD, timeout=TIMEOUT
        )
    else:  # torchrun's environment
        dist.init_process_group("tpu_dist", timeout=TIMEOUT)


def tpu(values, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).to("tpu")


def same(actual: torch.Tensor, expected: torch.Tensor, **kw) -> None:
    assert actual.device.type == "tpu", actual.device
    torch.testing.assert_close(actual.cpu(), expected, **kw)


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    start = time.perf_counter()
    try:
        SCENARIOS[scenario]()
    finally:
        results["_seconds"] = f"{time.perf_counter() - start:.1f} {seconds}"
        with open(f"{out}.{RANK}", "w") as f:
            json.dump(results, f)
    if results.pop("_abandoned", None):  # a collective that may never end: do not wait
        os._exit(0)
    if dist.is_initialized():
        dist.destroy_process_group()


def _collectives() -> None:
    import collective_checks

    init()
    collective_checks.run(check, RANK, WORLD)


def _training() -> None:
    import training_checks

    init()
    training_checks.run(check, RANK, WORLD)


def _compile() -> None:
    import compile_checks

    init()
    compile_checks.run(check, RANK, WORLD)


def _mesh4() -> None:
    import collective_checks

    init()
    collective_checks.run_subgroups(check, RANK, WORLD)


def _dies() -> None:
    """One rank (TPU_DIST_DYING_RANK, default 1) dies after the first collective; the
    other's next one must raise."""
    init()
    x = tpu([1.0, 2.0])
    dist.all_reduce(x)
    if RANK == int(os.environ.get("TPU_DIST_DYING_RANK", "1")):
        os._exit(17)
    time.sleep(1.0)

    @check("peer_died")
    def _():
        begin = time.monotonic()
        try:
            dist.all_reduce(x)
            raise AssertionError("all_reduce with a dead peer returned")
        except dist.DistBackendError as e:
            results["peer_died_error"] = str(e)
            results["peer_died_seconds"] = f"{time.monotonic() - begin:.1f}"


def _hangs() -> None:
    """Rank 1 never calls the collective; rank 0 must time out with a clear error."""
    init()
    x = tpu([1.0, 2.0])
    dist.all_reduce(x)
    if RANK == 1:
        time.sleep(TIMEOUT.total_seconds() + 10)
        os._exit(0)

    @check("peer_hangs")
    def _():
        begin = time.monotonic()
        try:
            dist.all_reduce(x)
            raise AssertionError("all_reduce without its peer returned")
        except dist.DistBackendError as e:
            results["peer_hangs_error"] = str(e)
            results["peer_hangs_seconds"] = f"{time.monotonic() - begin:.1f}"
            results["_abandoned"] = "yes"


def _never_joins() -> None:
    """Only rank 0 is launched: init_process_group must fail within the timeout."""

    @check("never_joins")
    def _():
        begin = time.monotonic()
        try:
            init()
            raise AssertionError("init_process_group returned without its peer")
        except (RuntimeError, dist.DistError) as e:
            results["never_joins_error"] = f"{type(e).__name__}: {e}"
            results["never_joins_seconds"] = f"{time.monotonic() - begin:.1f}"


SCENARIOS = {
    "collectives": _collectives,
    "training": _training,
    "compile": _compile,
    "mesh4": _mesh4,
    "dies": _dies,
    "hangs": _hangs,
    "never_joins": _never_joins,
}

if __name__ == "__main__":
    main()
