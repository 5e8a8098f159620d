"""Which local accelerator a process uses when several processes share a host.

`torchrun --nproc-per-node N` on a host with N accelerators starts N processes
that all see every accelerator; each must compute on the one of its
`LOCAL_RANK`. Two steps, both pure functions of the environment so they can be
tested anywhere:

- `visibility(...)`, before JAX's backend starts: what to set so that each
  process opens only its own accelerator. A process that opened every GPU
  would reserve memory on all of them, and libtpu lets one process own a
  chip, so hiding the others is the only correct choice there. GPU: JAX's
  `jax_cuda_visible_devices`/`jax_rocm_visible_devices` (what
  `jax.distributed.initialize(local_device_ids=...)` sets). TPU: the
  chip-visibility variables libtpu reads (`TPU_VISIBLE_CHIPS` and the
  process bounds/addresses of a host split one chip per process).
- `index(...)`, after it started: which of the devices the process sees it
  uses. One visible device (the GPU/TPU case after `visibility`): that one.
  Several (XLA:CPU with `jax_num_cpu_devices`, or visibility the user set
  up differently): the `LOCAL_RANK`-th.

Anything the user already set (`CUDA_VISIBLE_DEVICES`, any `TPU_*` variable of
the split) is left alone: they chose their own layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# libtpu's host layouts for one chip per process (chips per host -> process grid).
_TPU_PROCESS_BOUNDS = {1: "1,1,1", 4: "2,2,1", 8: "4,2,1"}
_TPU_VARIABLES = (
    "TPU_VISIBLE_CHIPS",
    "TPU_CHIPS_PER_PROCESS_BOUNDS",
    "TPU_PROCESS_BOUNDS",
    "TPU_PROCESS_ADDRESSES",
    "TPU_PROCESS_PORT",
    "CLOUD_TPU_TASK_ID",
)
TPU_BASE_PORT = 8476  # libtpu's default process port; local rank i listens on base + i


@dataclass(frozen=True)
class Visibility:
    """Settings to apply before JAX's backend starts: environment variables (libtpu reads
    them when it loads) and JAX config values (the GPU plugins read them)."""

    env: dict[str, str] = field(default_factory=dict)
    jax_config: dict[str, str] = field(default_factory=dict)


def local_rank(env: Mapping[str, str]) -> tuple[int, int]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) as torchrun sets them; (0, 1) outside torchrun."""
    rank = int(env.get("LOCAL_RANK", "0") or 0)
    size = int(env.get("LOCAL_WORLD_SIZE", "0") or 0) or max(1, rank + 1)
    if not 0 <= rank < size:
        raise ValueError(f"LOCAL_RANK={rank} is outside LOCAL_WORLD_SIZE={size}")
    return rank, size


def visibility(platform: str | None, env: Mapping[str, str]) -> Visibility:
    """What to set so this process opens only its LOCAL_RANK's accelerator.

    `platform` is TORCH_TPU_PLATFORM's choice, or None when JAX will pick the best one
    (the backend is not started yet, so which is present is unknown: the GPU and TPU
    settings are then both made; each is ignored by the other platform)."""
    rank, size = local_rank(env)
    if size == 1 or platform == "cpu":
        return Visibility()
    out_env: dict[str, str] = {}
    config: dict[str, str] = {}
    if platform in (None, "gpu") and "CUDA_VISIBLE_DEVICES" not in env:
        if "HIP_VISIBLE_DEVICES" not in env and "ROCR_VISIBLE_DEVICES" not in env:
            config = {"jax_cuda_visible_devices": str(rank), "jax_rocm_visible_devices": str(rank)}
    if platform in (None, "tpu") and not any(v in env for v in _TPU_VARIABLES):
        if int(env.get("WORLD_SIZE", size) or size) == size and size in _TPU_PROCESS_BOUNDS:
            out_env = {
                "TPU_VISIBLE_CHIPS": str(rank),
                "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
                "TPU_PROCESS_BOUNDS": _TPU_PROCESS_BOUNDS[size],
                "TPU_PROCESS_ADDRESSES": ",".join(
                    f"localhost:{TPU_BASE_PORT + i}" for i in range(size)
                ),
                "TPU_PROCESS_PORT": str(TPU_BASE_PORT + rank),
                "CLOUD_TPU_TASK_ID": str(rank),
            }
    return Visibility(out_env, config)


def index(env: Mapping[str, str], count: int) -> int:
    """Which of the `count` devices this process sees it computes on."""
    rank, size = local_rank(env)
    if count == 1:
        return 0
    if rank >= count:
        raise RuntimeError(
            f"torch_tpu: LOCAL_RANK={rank} but this process sees only {count} devices; run "
            f"at most {count} processes per host, or one device per process"
        )
    return rank
