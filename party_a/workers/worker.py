"""A worker process of party A (rank 1..W-1): join rank 0's process group, build the run's
extractor, then answer rank 0's commands until it says stop (or goes away)."""

from __future__ import annotations

import logging
from datetime import timedelta

import torch
import torch.distributed as dist

from vesper.common.torch_threads import apply_torch_threads
from vesper.party_a.workers.hops import partitioned_hop
from vesper.party_a.workers.protocol import BackwardCommand, HopCommand, ReleaseCommand, StopCommand, WorkerSetup
from vesper.party_a.workers.rendezvous import arrive, await_closed, open_store
from vesper.party_a.workers.replica import Replica

log = logging.getLogger(__name__)


def receive(count: int = 1) -> list[object]:
    """The next ``count`` objects rank 0 broadcasts (it sends as many)."""
    box: list[object] = [None] * count
    dist.broadcast_object_list(box, src=0)
    return box


def serve_run(init_method: str, rank: int, world: int, timeout_s: float, forever: bool = False) -> int:
    """One run's group, from joining it to rank 0's stop; 0 when it ended as rank 0 asked.
    ``forever``: then wait until rank 0's store of this run is gone (rendezvous.await_closed)."""
    store = open_store(init_method, rank, world, timeout_s)
    arrive(store)  # rank 0 watches for this while it watches the processes it started
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    try:
        setup_json, states = receive(2)
        setup = WorkerSetup.model_validate_json(setup_json)  # type: ignore[arg-type]
        apply_torch_threads(setup.torch_threads)
        try:
            replica, problem = Replica.build(setup, states, rank), ""  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 — said to rank 0, which ends the run with it
            replica, problem = None, f"{type(exc).__name__}: {exc}"
        dist.gather_object(problem, None, dst=0)
        if replica is None:
            return 1
        while True:
            command = receive()[0]
            if isinstance(command, StopCommand):
                return 0
            if isinstance(command, ReleaseCommand):
                dist.gather_object(replica.release(command), None, dst=0)
            elif isinstance(command, HopCommand):  # GAP's hop: this rank's block of rows
                setup = replica.setup
                partitioned_hop(command, None, setup.graph, setup.noise, rank, world)
            elif isinstance(command, BackwardCommand):
                flat = replica.backward(command.gradient)
                dist.reduce(flat, dst=0, op=dist.ReduceOp.SUM)
            else:
                raise RuntimeError(f"unknown command from rank 0: {command!r}")
    finally:
        dist.destroy_process_group()
        if forever:
            await_closed(store, timeout_s)


def main(init_method: str, rank: int, world: int, timeout_s: float, forever: bool) -> int:
    """Serve one run (a worker rank 0 started), or, ``forever``, one run after another (a worker
    started by hand on another host: it joins every run of party A that asks for W workers)."""
    torch.set_grad_enabled(True)
    while True:
        try:
            code = serve_run(init_method, rank, world, timeout_s, forever)
        except (RuntimeError, dist.DistError) as exc:  # rank 0 went away, or never came
            if not forever:
                log.error("worker %d of %d: the group ended (%s)", rank, world, exc)
                return 2
            log.info("worker %d of %d: the group ended (%s); waiting for the next run", rank, world, exc)
            continue
        if not forever:
            return code
