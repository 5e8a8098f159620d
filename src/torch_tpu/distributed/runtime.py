"""One JAX controller per process: `jax.distributed`, fed from the c10d rendezvous.

Rank 0 starts JAX's coordination service (`coordinator.py`, a process of its
own) and publishes its address in the process group's store; every rank
connects a JAX client with process id = its global rank. This must happen
before JAX's backend starts (the XLA:CPU client picks up the distributed
client and its gloo collectives when it is created), so torch_tpu starts the
backend lazily.

Faults. A JAX client terminates its process (LOG(FATAL)) when the service
declares a peer dead, when the service disappears, or when its exit barrier
fails, and jaxlib 0.10 cannot hand those events to a Python callback. A
process group must instead raise a Python error on the survivors. So:
heartbeats never time out, the service lives in its own process until every
rank has exited, and clients leave without the exit barrier. The service then
serves only the rendezvous (topology, gloo's key-value store); dead or stuck
peers are found by the collectives themselves (gloo fails at once when a
peer's connection closes; `work.py` times out a collective that does not
finish).
"""

from __future__ import annotations

import datetime
import socket
import subprocess
import sys
import threading
from pathlib import Path

import jax

from .. import platform
from . import relocate

_COORDINATOR_KEY = "tpu_dist/jax_coordinator"
_DEVICE_KEY = "tpu_dist/device/{}"  # a rank's device id (local_device.py chose it)
_NEVER = 30 * 24 * 3600  # seconds: heartbeats that never time out (see above)

_lock = threading.Lock()
_world: tuple[int, int] | None = None  # (rank, world size) once started
_presence: socket.socket | None = None  # open while this process lives (coordinator.py)
_store = None  # the default group's store: where ranks publish their devices


def started() -> bool:
    return _world is not None


def rank() -> int:
    return _world[0] if _world else 0


def start(store, rank: int, world_size: int, timeout: datetime.timedelta) -> None:
    """Make this process rank `rank` of a `world_size`-process JAX job (once per process)."""
    global _world, _store
    with _lock:
        if _world is not None:
            if _world != (rank, world_size):
                raise RuntimeError(
                    f"tpu_dist: this process already joined a JAX job as rank {_world[0]} of "
                    f"{_world[1]}; JAX cannot re-initialise it as rank {rank} of {world_size} "
                    "(one jax.distributed job per process)"
                )
            return
        held = None
        if world_size > 1:
            if platform.backend_started():
                held = _stop_backend()
            _connect(store, rank, world_size, timeout)
        _world = (rank, world_size)
        _store = store
    # start the backend now (with the distributed client, if any) and say which device
    store.set(_DEVICE_KEY.format(rank), str(platform.device().id))
    if held is not None:
        relocate.restore(held, platform.device())


def device_ids(world_size: int) -> list[int]:
    """Each global rank's device id, as the ranks published them at start()."""
    keys = [_DEVICE_KEY.format(r) for r in range(world_size)]
    _store.wait(keys)
    return [int(_store.get(k)) for k in keys]


_met: set[tuple[int, ...]] = set()  # rank sets that have met (see join_first_use)
_GLOO_CONNECT = datetime.timedelta(seconds=30)  # jaxlib's deadline for gloo's first connect


def join_first_use(ranks: tuple[int, ...], timeout: datetime.timedelta, what: str) -> None:
    """Before the first collective over a set of ranks, wait (within the group's timeout)
    until all of them have come to it.

    XLA's gloo collectives connect a set of devices at its first collective, waiting only
    30 s for the peers' addresses (jaxlib's fixed deadline); a rank that comes later
    (still compiling, loading a checkpoint, evaluating alone) would fail the job. Later
    collectives over the same set have no such limit. Never shorter than those 30 s:
    startup skew under load must not fail a job that gloo alone would have let through."""
    if len(ranks) < 2 or ranks in _met:
        return
    from .work import timed_out

    limit = max(timeout, _GLOO_CONNECT)
    key = f"tpu_dist/met/{','.join(map(str, ranks))}"
    if _store.add(key, 1) == len(ranks):
        _store.set(f"{key}/all", "1")
    try:
        _store.wait([f"{key}/all"], limit)
    except Exception:
        raise timed_out(f"{what} (waiting for its ranks' first collective)", limit) from None
    _met.add(ranks)


def _stop_backend() -> relocate.Held:
    """JAX's backend is up (tpu tensors made before init_process_group, or just a device
    query): hold the tpu tensors' values on the host and stop it, so that jax.distributed
    comes first; start() uploads them onto the new backend."""
    from jax.extend.backend import clear_backends

    held = relocate.hold()
    clear_backends()
    platform.restart()
    return held


def _connect(store, rank: int, world_size: int, timeout: datetime.timedelta) -> None:
    global _presence
    from jax._src import distributed
    from jax._src.lib import _jax

    seconds = max(1, int(timeout.total_seconds()))
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if rank == 0:
        store.set(_COORDINATOR_KEY, _start_coordinator(store, world_size, seconds))
    host, port, presence_port = store.get(_COORDINATOR_KEY).decode().split()
    address = f"{host}:{port}"
    _presence = socket.create_connection((host, int(presence_port)), timeout=seconds)
    client = _jax.get_distributed_runtime_client(
        address,
        rank,
        init_timeout=seconds,
        heartbeat_timeout=_NEVER,
        shutdown_on_destruction=False,  # no exit barrier: see the module docstring
        use_compression=True,
    )
    try:
        client.connect()
    except Exception as e:
        raise RuntimeError(
            f"tpu_dist: rank {rank} could not join the JAX job at {address} within "
            f"{timeout} (did every rank call init_process_group?): {e}"
        ) from None
    state = distributed.global_state
    state.client = client
    state.process_id = rank
    state.num_processes = world_size
    state.coordinator_address = address


def _start_coordinator(store, world_size: int, seconds: int) -> str:
    """Start coordinator.py; returns 'host service_port presence_port' for the store."""
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("coordinator.py")),
            str(world_size),
            str(seconds),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # it outlives this process if this one dies
        text=True,
    )
    line = process.stdout.readline().split()
    process.stdout.close()
    if len(line) != 3 or line[0] != "READY":
        raise RuntimeError("tpu_dist: the JAX coordination service did not start")
    return f"{_reachable_host(store)} {line[1]} {line[2]}"


def _reachable_host(store) -> str:
    """An address of this host that the other ranks can reach: the interface this host
    uses towards the TCPStore's host (loopback for a local store or a file store)."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    host = getattr(store, "host", None)
    if not host or host in ("localhost", "127.0.0.1", "::1"):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, getattr(store, "port", 1) or 1))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()
