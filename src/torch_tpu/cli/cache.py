"""`torch-tpu cache info|clear`: inspect or empty the persistent compilation cache."""

from __future__ import annotations

from .. import cache


def run(action: str) -> int:
    if action == "clear":
        removed = cache.clear()
        print(f"removed {removed} entries from {cache.directory()}")
        return 0
    stats = cache.stats()
    if stats["directory"] is None:
        print("persistent compilation cache: off (TORCH_TPU_PERSISTENT_CACHE=0)")
        return 0
    if stats["problem"]:
        print(f"directory   {stats['directory']}")
        print(f"problem     {stats['problem']}")
        print("            (processes compile without a persistent cache until this is fixed)")
        return 1
    print(f"directory   {stats['directory']}")
    print(f"entries     {stats['disk_entries']}")
    print(
        f"size        {stats['disk_bytes'] / 2**20:.1f} MiB of {stats['max_bytes'] / 2**20:.0f} MiB"
    )
    return 0
