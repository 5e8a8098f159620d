"""How near this process is to the kernel's cap on memory mappings.

Every executable XLA:CPU compiles or loads maps its code into the process (about
four mappings for a small per-op program), and Linux refuses new mappings past
`vm.max_map_count` (65,530 by default). LLVM then fails with "Cannot allocate
memory" and the process can crash with RAM to spare. A job that compiles without
end (a test suite, an OpInfo sweep, data-dependent shapes left unbucketed) gets
there after some 15,000 programs, so the compilation cache asks here every so often
and forgets its executables before the cap is near (`cache.py`).

Where /proc is missing (not Linux) there is no such cap to watch: both answers are None.
"""

from __future__ import annotations

from pathlib import Path

_CAP_FILE = Path("/proc/sys/vm/max_map_count")
_MAPS_FILE = Path("/proc/self/maps")
NEAR = 0.75  # the share of the cap at which the cache starts over


def cap() -> int | None:
    """The kernel's limit on this process's memory mappings, or None when unknown."""
    try:
        return int(_CAP_FILE.read_text())
    except (OSError, ValueError):
        return None


def in_use() -> int | None:
    """How many memory mappings this process has now (one line of /proc/self/maps
    each; about 0.2 ms per 1,000), or None when unknown."""
    try:
        return _MAPS_FILE.read_bytes().count(b"\n")
    except OSError:
        return None


def near_cap() -> tuple[int, int] | None:
    """(mappings in use, cap) when the use has passed NEAR of the cap, else None."""
    limit = cap()
    if limit is None:
        return None
    used = in_use()
    if used is None or used < NEAR * limit:
        return None
    return used, limit
