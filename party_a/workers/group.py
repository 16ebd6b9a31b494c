"""Rank 0's side of party A's worker group: start the workers, split each release, gather it,
hand B's gradient back and sum the parameter gradients (the package docstring says why it is
the release one process makes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from vesper.common.config import PartyAConfig, RunConfig
from vesper.party_a.extractors.base import Extractor
from vesper.party_a.graph_store import Graph
from vesper.party_a.noise import NoiseSource
from vesper.party_a.workers.errors import WorkerLost, WorkersUnsupported
from vesper.party_a.workers.gradients import apply_gradients, flat_gradients
from vesper.party_a.workers.hops import partitioned_hop
from vesper.party_a.workers.protocol import (
    ONE_SHOT_EXTRACTORS,
    PER_STEP_EXTRACTORS,
    BackwardCommand,
    Command,
    HopCommand,
    ReleaseCommand,
    StopCommand,
    WorkerSetup,
    cpu_state,
    split_roots,
)
from vesper.party_a.workers.rendezvous import arrived, open_store

WORKERS_FILE = "workers.json"  # runs/<id>/workers.json: the worker processes' ids, for an operator
_ONE_GROUP = threading.Lock()  # torch.distributed has one default group per process: one run at a time uses it


def check_supported(config: RunConfig, workers: int) -> None:
    """Refuse, before anything is charged, a run W > 1 workers cannot make (WorkersUnsupported)."""
    if workers <= 1:
        return
    name = config.extractor.name
    fix = "set party_a.workers = 1 (vesper serve party-a --workers 1)"
    if name not in PER_STEP_EXTRACTORS + ONE_SHOT_EXTRACTORS:
        raise WorkersUnsupported(
            f"party_a.workers = {workers} supports the per-step extractors {', '.join(PER_STEP_EXTRACTORS)} and "
            f"GAP's one-shot hops ({', '.join(ONE_SHOT_EXTRACTORS)}; relational-gap's pre-training runs on rank 0 "
            f"alone), not {name} (its releases are not split over workers); {fix}; nothing was charged"
        )
    audits = [what for what, on in (("canaries", config.audit.canaries), ("membership", config.audit.membership)) if on]
    if audits:
        raise WorkersUnsupported(
            f"party_a.workers = {workers} cannot run the audit {' and '.join(audits)} (it rebuilds A's graph in "
            f"rank 0 only); {fix}; nothing was charged"
        )
    if config.label_privacy.mode == "pate":
        raise WorkersUnsupported(
            f"party_a.workers = {workers} does not support label_privacy.mode = pate; {fix}; nothing was charged"
        )


class GroupReservation:
    """This party A's worker group held for one run: taken at the run's start, before anything is
    charged, so that a second run is refused then, not when it would start its workers (for GAP,
    after its edge-free stage and pre-training); released when the run's group closes or the run ends."""

    def __init__(self, workers: int) -> None:
        if not _ONE_GROUP.acquire(blocking=False):
            raise WorkersUnsupported(
                f"another run of this party A is using its {workers} worker processes; start this run when it "
                "has ended, or set party_a.workers = 1; nothing was charged"
            )
        self.held = True

    def release(self) -> None:
        """Let another run have the group; safe to call twice."""
        if self.held:
            self.held = False
            _ONE_GROUP.release()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class WorkerGroup:
    """Rank 0 and W-1 worker processes, for one run."""

    def __init__(
        self, world: int, processes: list[subprocess.Popen], timeout_s: float, reservation: GroupReservation,
    ) -> None:
        self.world = world
        self.reservation = reservation
        self.processes = processes
        self.timeout_s = timeout_s
        self.healthy = True
        self.closed = False
        self._changed = True  # the parameters changed since the workers last received them

    # -- starting and stopping ------------------------------------------------------------------
    @classmethod
    def start(
        cls, settings: PartyAConfig, setup: WorkerSetup, states: tuple[torch.Tensor, torch.Tensor],
        run_dir: Path | None = None, reservation: GroupReservation | None = None,
    ) -> WorkerGroup:
        """Start W-1 workers on this host (or wait for them at ``party_a.workers_listen``), join them,
        and have each build the run's extractor from the generators' ``states`` at rank 0's build.
        ``reservation``: the run's hold on the group (taken now when None or no longer held)."""
        world = settings.workers
        if reservation is None or not reservation.held:
            reservation = GroupReservation(world)
        processes: list[subprocess.Popen] = []
        try:
            # the longest a worker waits for the next command: B's answer, a charge's retries, a checkpoint
            timeout = settings.step_timeout_s + settings.peer_retry_s + 60.0
            if settings.workers_listen:
                init = f"tcp://{settings.workers_listen}"
            else:
                init = f"tcp://127.0.0.1:{free_port()}"
                processes = [
                    subprocess.Popen([
                        sys.executable, "-m", "vesper.party_a.workers", "--init", init, "--rank", str(rank),
                        "--world", str(world), "--timeout-s", str(timeout),
                    ])
                    for rank in range(1, world)
                ]
            if run_dir is not None:
                (run_dir / WORKERS_FILE).write_text(json.dumps({"pids": [p.pid for p in processes]}) + "\n")
            group = cls(world, processes, timeout, reservation)
            with group._lost("joining the group"):
                store = open_store(init, 0, world, timeout)
                group._await_workers(store)
                dist.init_process_group("gloo", store=store, rank=0, world_size=world, timeout=timedelta(seconds=timeout))
            with group._lost("setting the workers up"):
                dist.broadcast_object_list([setup.model_dump_json(), states], src=0)
                problems: list[Any] = [None] * world
                dist.gather_object("", problems, dst=0)
            failed = [f"worker {rank}: {problem}" for rank, problem in enumerate(problems) if problem]
            if failed:
                group.healthy = False
                raise WorkersUnsupported(f"party A's workers could not build the run's extractor ({'; '.join(failed)})")
            return group
        except BaseException:
            _stop_processes(processes)
            if dist.is_initialized():
                dist.destroy_process_group()
            else:
                _forget_failed_join()
            reservation.release()
            raise

    def close(self) -> None:
        """Stop the workers (asked, then terminated) and leave the group; safe to call twice."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.healthy:
                try:
                    self._send(StopCommand())
                except WorkerLost:
                    pass
            _stop_processes(self.processes, wait_s=10.0 if self.healthy else 0.0)
        finally:
            dist.destroy_process_group()
            self.reservation.release()

    # -- one release ----------------------------------------------------------------------------
    def release(self, extractor: Extractor, roots: torch.Tensor, kind: str) -> torch.Tensor:
        """The release of ``roots``: share 0 here, the others at the workers, in root order."""
        setup = extractor.setup  # type: ignore[attr-defined]
        shares = split_roots(roots.detach().cpu(), self.world)
        training = bool(extractor.training)  # type: ignore[attr-defined]
        parameters = cpu_state(extractor.state_dict()) if self._changed or training else None
        self._send(ReleaseCommand(
            kind=kind, training=training, noise_std=float(extractor.noise_std),  # type: ignore[attr-defined]
            shares=shares, sampling_state=setup.sampling_generator.get_state(),
            noise_state=setup.noise.generator.get_state(), parameters=parameters,
        ))
        self._changed = False
        own = extractor.release(shares[0].to(setup.device), kind)  # type: ignore[arg-type]
        gathered: list[Any] = [None] * self.world
        with self._lost(f"the {kind} release"):
            dist.gather_object(None, gathered, dst=0)
        rows = [own] + [part.to(own.device, own.dtype) for part in gathered[1:] if part is not None]
        return torch.cat(rows) if len(rows) > 1 else own

    def backward(self, extractor: Extractor, embeddings: torch.Tensor, gradient: torch.Tensor) -> None:
        """B's gradient: rank 0's rows here (through the concatenation), the others at their workers;
        the parameter gradients summed into rank 0's, which then steps the optimiser."""
        self._send(BackwardCommand(gradient.detach().cpu()))
        embeddings.backward(gradient.to(embeddings.device))
        parameters = extractor.trainable_parameters()
        flat = flat_gradients(parameters)
        with self._lost("summing the gradients"):
            dist.reduce(flat, dst=0, op=dist.ReduceOp.SUM)
        apply_gradients(parameters, flat)
        self._changed = True

    def hop(self, command: HopCommand, x_prev: torch.Tensor, graph: Graph, noise: NoiseSource) -> torch.Tensor:
        """One of GAP's hops: rank 0's block here, the others at the workers; x_k gathered here (CPU)."""
        self._send(command)
        with self._lost(f"hop {command.hop} of GAP"):
            gathered = partitioned_hop(command, x_prev, graph, noise, 0, self.world)
        if gathered is None:
            raise RuntimeError("rank 0 gathered no block of the hop")
        return gathered

    # -- faults ---------------------------------------------------------------------------------
    def _await_workers(self, store: dist.TCPStore, poll_s: float = 0.05) -> None:
        """Until the W-1 workers have arrived at the store (party_a.workers.rendezvous): a worker
        this rank started that exits first is reported now, not when the join would give up
        (step_timeout_s + peer_retry_s + 60 s). Workers on other hosts are waited for that long."""
        deadline = time.monotonic() + self.timeout_s
        while (count := arrived(store)) < self.world - 1:
            if self._a_worker_exited():
                raise RuntimeError("a worker process exited before it joined")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{count} of {self.world - 1} workers joined within {self.timeout_s:g} s")
            time.sleep(poll_s)

    def _send(self, command: Command) -> None:
        """Every command starts with a look at the workers this rank started: one that has exited is
        reported now, not when a collective waiting for it gives up (the group's timeout)."""
        with self._lost(f"sending a {command.op} command"):
            if self._a_worker_exited():
                raise RuntimeError("a worker process has exited")
            dist.broadcast_object_list([command], src=0)

    def _a_worker_exited(self) -> bool:
        """Whether a worker process this rank started has exited."""
        return any(process.poll() is not None for process in self.processes)

    @contextmanager
    def _lost(self, doing: str) -> Iterator[None]:
        try:
            yield
        except (RuntimeError, dist.DistError) as exc:
            self.healthy = False
            gone = [f"worker {rank} (pid {p.pid}) exited with {p.poll()}" for rank, p in enumerate(self.processes, 1) if p.poll() is not None]
            who = "; ".join(gone) if gone else f"a worker did not answer within {self.timeout_s:g} s"
            raise WorkerLost(f"party A lost a worker process while {doing} ({who}; {str(exc).splitlines()[0]})") from None


def _forget_failed_join() -> None:
    """Undo what a failed ``init_process_group`` leaves behind. torch numbers each new group
    (its keys in the store are prefixed ``/default_pg/<n>/``) from a counter that it raises
    before the rendezvous and does not lower when the rendezvous fails (pytorch/pytorch#46561;
    ``destroy_process_group`` resets it, but a group that never formed cannot be destroyed).
    Rank 0 would then name its next group 1 while the fresh workers of a resumed run name
    theirs 0, and the join would wait out its timeout. No group exists here, so 0 is right."""
    from torch.distributed import distributed_c10d

    distributed_c10d._world.group_count = 0


def _stop_processes(processes: list[subprocess.Popen], wait_s: float = 0.0) -> None:
    """Let the workers exit for ``wait_s``, then terminate those still running (each by its own handle)."""
    for process in processes:
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class DistributedExtractor:
    """The run's extractor, its releases split over the worker group; everything else is the
    extractor's own (parameters, state, checkpoints). No prefetch: the workers sample each
    release from the generators' state at its start (party_a.pipeline is off with W > 1)."""

    prefetch: Callable[[torch.Tensor], None] | None = None

    def __init__(self, extractor: Extractor, group: WorkerGroup) -> None:
        self.inner = extractor
        self.group = group

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def release(self, roots: torch.Tensor, kind: str) -> torch.Tensor:
        return self.group.release(self.inner, roots, kind)

    def backward(self, embeddings: torch.Tensor, gradient: torch.Tensor) -> None:
        self.group.backward(self.inner, embeddings, gradient)
