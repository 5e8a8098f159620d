"""`torch.tpu.compiler`: XLA compiler options for the compiles inside a block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .. import cache


@contextlib.contextmanager
def custom_compiler_options(**options: object) -> Iterator[None]:
    """XLA compiler options (e.g. `xla_cpu_enable_fast_math=False`) for every compile
    inside the block: compiled graphs compile on their first call, so run the first
    call inside it. The options are part of the cache key; XLA rejects unknown ones
    with an error naming the graph and the options."""
    with cache.compiler_options(**options):
        yield
