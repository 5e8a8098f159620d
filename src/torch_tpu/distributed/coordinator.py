"""The JAX coordination service of a tpu_dist job, in a process of its own.

Run as a script by rank 0 (`python coordinator.py WORLD_SIZE TIMEOUT_S`); it
imports only jaxlib. It prints "READY <service port> <presence port>" and
lives until every rank has connected to its presence port and every such
connection has closed (a rank's exit, clean or not, closes it), or until
TIMEOUT_S passes with ranks missing.

Why a process of its own: a JAX client terminates its process (LOG(FATAL))
when its coordination service disappears, so the service must outlive every
rank, including rank 0 when rank 0 dies first.
"""

from __future__ import annotations

import selectors
import socket
import sys
import time

NEVER = 30 * 24 * 3600  # heartbeats never declare a rank dead (see runtime.py)


def main() -> None:
    world_size, timeout = int(sys.argv[1]), float(sys.argv[2])
    from jax._src.lib import _jax

    with socket.socket() as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    service = _jax.get_distributed_runtime_service(
        f"[::]:{port}", world_size, heartbeat_timeout=NEVER, shutdown_timeout=int(timeout)
    )
    presence = socket.create_server(("", 0))
    print(f"READY {port} {presence.getsockname()[1]}", flush=True)
    sys.stdout.close()
    _wait_for_ranks(presence, world_size, timeout)
    service.shutdown()


def _wait_for_ranks(presence: socket.socket, world_size: int, timeout: float) -> None:
    selector = selectors.DefaultSelector()
    selector.register(presence, selectors.EVENT_READ)
    joined, open_connections = 0, 0
    deadline = time.monotonic() + timeout
    while joined < world_size or open_connections:
        if joined < world_size and time.monotonic() > deadline:
            return
        for key, _ in selector.select(timeout=1.0):
            if key.fileobj is presence:
                connection, _ = presence.accept()
                selector.register(connection, selectors.EVENT_READ)
                joined += 1
                open_connections += 1
            elif not key.fileobj.recv(1):  # closed: that rank's process has exited
                selector.unregister(key.fileobj)
                key.fileobj.close()
                open_connections -= 1


if __name__ == "__main__":
    main()
