"""Where party A's ranks meet: one TCPStore that rank 0 hosts and each worker joins.

torch's own ``tcp://`` rendezvous gives rank 0 no way to tell a worker that died before joining
from a slow one: ``init_process_group`` blocks until its timeout. So each rank opens the store
itself and a worker says it has arrived (``JOINED``) before the process group forms over the
store; rank 0 waits for that count while it watches the processes it started, and a worker that
exits first is reported at once (party_a.workers.group).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from urllib.parse import urlsplit

import torch.distributed as dist

JOINED = "vesper/joined"  # the workers that have arrived (a counter: store.add)


class RendezvousError(ValueError):
    """A rendezvous address vesper cannot use."""


def store_address(init_method: str) -> tuple[str, int]:
    """(host, port) of rank 0's store: ``tcp://HOST:PORT``, or ``env://`` (MASTER_ADDR, MASTER_PORT)."""
    if init_method == "env://":
        try:
            return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        except (KeyError, ValueError):
            raise RendezvousError(
                "--init env:// needs MASTER_ADDR and MASTER_PORT (rank 0's host and port) in the environment"
            ) from None
    parts = urlsplit(init_method)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or port is None:
        raise RendezvousError(f"rendezvous {init_method!r}: expected tcp://HOST:PORT or env://")
    return parts.hostname, port


def open_store(init_method: str, rank: int, world: int, timeout_s: float) -> dist.TCPStore:
    """Rank 0 hosts the store at the address, a worker connects to it (waiting up to ``timeout_s``
    for rank 0 to be there)."""
    host, port = store_address(init_method)
    return dist.TCPStore(
        host, port, world, is_master=rank == 0, timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
    )


def arrived(store: dist.TCPStore) -> int:
    """How many workers have said they arrived."""
    return int(store.add(JOINED, 0))


def arrive(store: dist.TCPStore) -> None:
    """A worker's word to rank 0 that it is here, before the group forms."""
    store.add(JOINED, 1)


def await_closed(store: dist.TCPStore, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Until rank 0's store of a run that ended is gone (True), or ``timeout_s`` (False). A worker
    that serves run after run waits for it before it joins again: rank 0 hosts each run's store at
    the same address, and a worker that reached the last run's store would meet its stale keys."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            arrived(store)
        except (RuntimeError, dist.DistError):  # the connection closed: rank 0 let the store go
            return True
        time.sleep(poll_s)
    return False
