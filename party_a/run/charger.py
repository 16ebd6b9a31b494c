"""Write-ahead charging of one run at the accountant: create, reopen, charge, charge ahead,
journal, close (docs/privacy.md, section 6; docs/faults.md).

Nothing leaves A before the accountant has committed its charge: ``charged_release`` is the
only way A makes a tensor for B. It computes the extractor's release, waits for the charge,
encodes the tensor and appends its digest to the release journal (or, replayed on resume,
checks it against the journal) before the caller sends it.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from vesper.common.accountant_client import nodes_digest
from vesper.common.config import RunConfig
from vesper.common.metrics import NO_COUNTERS, RunCounters
from vesper.common.wire import encode_tensor
from vesper.party_a.extractors.base import ChargePlan, Extractor, RootPlan
from vesper.party_a.extractors.edge_free_path import edge_free_layers
from vesper.party_a.peers import AccountantClient, LeaseRefused
from vesper.party_a.run.checkpoint_files import ReleaseJournal, ResumeError
from vesper.party_a.run.progress import ProgressEvent, Report
from vesper.party_a.run.release import Release, relation
from vesper.party_a.run.step_timings import _NO_TIMER, StepTimings
from vesper.proto.v1 import accountant_pb2 as acc_pb
from vesper.proto.v1 import tensor_pb2


@dataclass(frozen=True)
class PendingCharge:
    """A charge started ahead of its release (``WriteAheadCharger.charge_ahead``)."""

    key: str
    future: Future[acc_pb.ChargeReceipt]


class WriteAheadCharger:
    """One run's charges at the accountant, and what the ledger says the run has spent."""

    def __init__(
        self, accountant: AccountantClient, run_id: str, journal: ReleaseJournal, config: RunConfig,
        device: torch.device, report: Report, counters: RunCounters = NO_COUNTERS,
    ) -> None:
        """``counters``: the service's metrics of this run's releases (party A's /metrics)."""
        self.accountant = accountant
        self.run_id = run_id
        self.journal = journal
        self.config = config
        self.device = device
        self.report = report
        self.counters = counters
        self.epsilon_spent = 0.0
        self.charges = 0  # ledger rows of this run so far

    # -- the run at the accountant ---------------------------------------------------------------
    def create(
        self, delta: float, roots: RootPlan, plan: ChargePlan, release: Release, split: str, extractor: Extractor,
    ) -> None:
        """The run's ledger, with its charge rules and what it was calibrated for."""
        cfg = self.config
        note = f"Privacy unit: {relation(extractor)}."
        if cfg.privacy.edge_sample_rate:
            note += (
                f" Credited: party A keeps a secret Poisson sample of the edges at rate "
                f"q={cfg.privacy.edge_sample_rate:g} for every release, drawn afresh per release and hidden from B."
            )
        self.accountant.create_run(
            self.run_id, cfg.privacy.epsilon, delta, release.rules, cfg.extractor.name, cfg.privacy.accounting,
            cfg.privacy.accountant, ledger_details(cfg, roots, plan, release, split, extractor), note,
            privacy_unit=extractor.spec.privacy_unit,
        )

    def reopen(self, needed_charges: int, checkpoint_step: int | None, lease_s: float) -> None:
        """The ledger decides: the run must still be open at the accountant, and hold every
        charge A's checkpoint counted (otherwise charges were lost and nothing is resumed)."""
        status = self.accountant.get_run(self.run_id)
        if status.status not in ("active", "interrupted"):
            raise ResumeError(f"run {self.run_id} is {status.status} at the accountant; only an interrupted run resumes")
        if status.charges < needed_charges:
            raise ResumeError(
                f"the accountant's ledger holds {status.charges} charges of run {self.run_id}, but party A's checkpoint "
                f"after step {checkpoint_step} was taken after {needed_charges}: charges were lost; not resuming"
            )
        self._take_over(status.status, lease_s)
        self.epsilon_spent = status.epsilon_spent
        self.report(ProgressEvent("setup", message=(
            f"resuming run {self.run_id}: the ledger holds {status.charges} charges, ε spent {status.epsilon_spent:.4g}"
        ), epsilon_spent=self.epsilon_spent))

    def _take_over(self, status: str, lease_s: float) -> None:
        """Reopen the run under this trainer's lease. A run whose trainer was killed still holds that
        trainer's lease until it expires (``party_a.lease_s``): wait that long, no longer; a live
        trainer keeps renewing, and this resume is then refused (LeaseRefused)."""
        deadline = time.monotonic() + lease_s + 1.0
        waiting = False
        while True:
            try:
                self.accountant.reopen_run(self.run_id, f"resumed by party A ({status})")
                return
            except LeaseRefused:
                if time.monotonic() > deadline:
                    raise
                if not waiting:
                    waiting = True
                    self.report(ProgressEvent("setup", message=(
                        f"run {self.run_id} still holds its previous trainer's lease: waiting up to "
                        f"{lease_s:g} s for it to expire"
                    ), epsilon_spent=self.epsilon_spent))
                time.sleep(0.5)

    def close(self, status: str, message: str) -> acc_pb.RunStatus:
        closed = self.accountant.close_run(self.run_id, status, message)
        self.epsilon_spent = closed.epsilon_spent
        return closed

    # -- charges -----------------------------------------------------------------------------------
    def charge(self, roots: torch.Tensor, release: Release, pass_id: str, kind: str, index: int) -> None:
        """The write-ahead charge: returns only once the accountant has committed it."""
        self._count(self._commit(roots, release, pass_id, kind, index))
        self.counters.release(kind)

    def _commit(self, roots: torch.Tensor, release: Release, pass_id: str, kind: str, index: int) -> acc_pb.ChargeReceipt:
        """The Charge RPC alone (thread-safe: ``charge_ahead`` runs it on a worker thread)."""
        return self.accountant.charge(
            self.run_id, f"{pass_id}/{index}", pass_id, kind, roots.numel(), nodes_digest(roots),
            release.event_json(kind),
        )

    def _count(self, receipt: acc_pb.ChargeReceipt) -> None:
        self.epsilon_spent = receipt.epsilon_spent
        self.charges = max(self.charges, receipt.seq + 1)

    def charge_ahead(
        self, worker: ThreadPoolExecutor, roots: torch.Tensor, release: Release, pass_id: str, index: int
    ) -> PendingCharge:
        """Start step t+1's write-ahead charge once B has answered step t, while A updates.

        A charge names the release's roots, key and DpEvent, never its values, so it can be
        committed before the release is computed; ``charged_release`` waits for the receipt
        before anything of the release is encoded or sent, so every release is still charged
        before it leaves A. The one difference: a run that stops after this call and before
        step t+1 is sent (A fails in its update, is cancelled or killed) holds a charge for a
        release B never receives (over-counted, never under-counted; a resume sends it under
        that charge). docs/faults.md.
        """
        # in this thread's context: what the charge logs (a retry) names the run
        future = worker.submit(contextvars.copy_context().run, self._commit, roots, release, pass_id, "train", index)
        return PendingCharge(f"{pass_id}/{index}", future)

    def charged_release(
        self, make: Callable[[torch.Tensor], torch.Tensor], roots: torch.Tensor, release: Release,
        pass_id: str, kind: str, index: int, timer: StepTimings | None = None,
        charged: PendingCharge | None = None, edge_free: bool = False,
    ) -> tuple[torch.Tensor, tensor_pb2.Tensor]:
        """The only way A makes a tensor for B: the extractor's release, the charge, and the
        journal entry (or, replayed on resume, the check against it). The caller sends the
        wire message only after this returns. ``charged``: this release's charge, started
        ahead (``charge_ahead``); it is waited for here, before anything is encoded. ``edge_free``:
        the release reads no edge (the journal keeps no bytes of it, ReleaseJournal.before_send)."""
        timer = timer or _NO_TIMER
        key = f"{pass_id}/{index}"
        if charged is not None and charged.key != key:
            raise RuntimeError(f"the charge started ahead is for {charged.key}, not for the release {key}")
        embeddings = make(roots.to(self.device))
        timer.mark("release")
        if charged is None:
            self.charge(roots, release, pass_id, kind, index)
        else:
            self._count(charged.future.result())
            self.counters.release(kind)
        timer.mark("charge")
        message = encode_tensor(embeddings, self.config.wire_dtype)
        self.counters.wire_bytes(kind, message.ByteSize())
        timer.mark("encode")
        replays = len(self.journal.inexact_replays)
        message = self.journal.before_send(key, message, edge_free)  # on resume: the bytes sent before
        if len(self.journal.inexact_replays) > replays:
            self.report(ProgressEvent("train", message=(
                f"release {key} recomputed on resume differed from the one sent in its last bits "
                f"(by {self.journal.inexact_replays[-1][1]:.2g} of its largest value): sent again as sent before"
            ), epsilon_spent=self.epsilon_spent))
        timer.mark("journal")
        return embeddings, message


def ledger_details(
    cfg: RunConfig, roots: RootPlan, plan: ChargePlan, release: Release, split: str, extractor: Extractor,
) -> dict:
    """What the ledger records of the run's set-up beside its charge rules (public: the audit shows it)."""
    ex = cfg.extractor
    return {
        "dataset": cfg.dataset,
        "split": split,
        "privacy_unit": extractor.spec.privacy_unit,
        "cost_model": extractor.spec.cost_model,
        "layers": ex.layers,
        "output_layers": extractor.output_layers,  # the edge-free path's included (docs/privacy.md, 2.5)
        "edge_free_layers": edge_free_layers(extractor),
        "fanout": ex.fanout,
        "degree_bound": ex.degree_bound,
        "d_min": ex.d_min,
        "dim": ex.dim,
        "params": ex.params,
        "sensitivity": release.sensitivity,
        "noise_multiplier": release.noise_multiplier,
        "noise_std": release.noise_std,
        "edge_sample_rate": cfg.privacy.edge_sample_rate,
        "epochs": cfg.epochs,
        "batch_size": cfg.batch_size,
        "train_nodes": roots.train_ids.numel(),
        "steps_per_epoch": roots.steps_per_epoch,
        "eval_chunks": roots.eval_chunks,
        "prediction_passes": plan.prediction_passes,
        "predict_chunks": roots.predict_chunks,
        "one_shot_releases": plan.one_shot_releases,
        "pre_train_releases": plan.pre_train_releases,
        "relation": relation(extractor),
        "stages": [{"name": s.name, "epochs": s.epochs, "layers": s.layers} for s in plan.stages],
        **release.details,
    }
