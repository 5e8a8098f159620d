"""`torch-tpu opinfo-report`: run the full OpInfo sweep and write the report."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .. import init, inventory
from ..testing import opinfo, report


def run(out: str, limit: int | None, only: list[str] | None, known: str | None) -> int:
    init()  # the report counts the kernel table, filled at the device's start
    limit = limit or opinfo.SAMPLES_PER_CELL
    start = time.perf_counter()
    results = report.sweep(only, limit=limit)
    seconds = time.perf_counter() - start
    report.write(results, inventory.native_ops(), seconds, Path(out))
    totals = report.totals(results)
    if known:
        path = Path(known)
        previous = json.loads(path.read_text()) if path.exists() else {}
        failing = report.known_failures(results, previous)
        path.write_text(json.dumps(failing, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(failing)} known failures to {known}")
    print(f"wrote {out}/opinfo_report.md and .json in {seconds:.0f} s: {totals}")
    return 0
