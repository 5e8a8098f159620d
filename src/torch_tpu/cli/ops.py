"""`torch-tpu ops`: the registry's view of ATen coverage."""

from __future__ import annotations

from collections import Counter

from .. import init, inventory


def run(check: str | None) -> int:
    init()  # the kernel table is filled at the device's start
    if check:
        try:
            names = inventory.overloads(check)
        except ValueError as e:
            print(e)
            return 2
        native = True
        for name in names:
            status = inventory.status(name)
            native &= not status.startswith("cpu fallback")
            print(f"aten::{name}: {status}")
        return 0 if native else 1
    rows = inventory.table()
    for name, status in rows:
        print(f"{name:<55} {status}")
    counts = Counter(status.split(" (")[0] for _, status in rows)
    native = inventory.native_ops()
    print()
    print(f"overloads with a tpu kernel: {native['total']} "
          f"({native['lowered']} lowered, {native['decomposed']} decomposed, "
          f"{native['metadata']} views) across {native['operators']} operators")
    print(f"backend ops that would fall back to the CPU: {counts.get('cpu fallback', 0)}")
    return 0
