"""The run's summary: built up as its phases pass, ended by how it stopped, and written
beside its files (``runs/<id>/summary.json``) and sent to the coordinator."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vesper.common.config import RunConfig, RunSummary
from vesper.party_a.extractors.base import ChargePlan, Extractor
from vesper.party_a.peers import AccountantClient, BudgetRefused, LeaseRefused, PeerError, PeerLost
from vesper.party_a.run.progress import Cancelled
from vesper.party_a.run.release import Release, relation
from vesper.proto.v1 import accountant_pb2 as acc_pb
from vesper.proto.v1 import label_party_pb2 as lp_pb

log = logging.getLogger(__name__)

# how a run can stop short of completing, each with its own status (``ended``); anything
# else is a crash: the run is closed as failed and the exception reaches the service
ENDINGS = (LeaseRefused, BudgetRefused, Cancelled, PeerLost, OSError, PeerError, ValueError)


@dataclass
class Milestones:
    """How far the run got, which decides what its ending must undo or keep."""

    b_ready: bool = False  # B has a session for the run: tell it how the run ended
    run_created: bool = False  # the accountant holds the run: close it there
    lost_accountant: bool = False  # ... unless it is gone
    lost_lease: bool = False  # another trainer holds the run: leave it, B's session and the ledger alone
    refused_lease: bool = False  # this trainer never held it: leave its files as they were


def initial(run_id: str, config: RunConfig, delta: float, status_url: str) -> RunSummary:
    cfg = config
    return RunSummary(
        run_id=run_id, status="failed", dataset=cfg.dataset, extractor=cfg.extractor.name,
        decoder=cfg.decoder.kind, accounting=cfg.privacy.accounting, epsilon_budget=cfg.privacy.epsilon,
        epsilon_spent=0.0, delta=delta, status_url=status_url, label_privacy=cfg.label_privacy.mode,
    )


def with_extractor(summary: RunSummary, extractor: Extractor, delta: float) -> RunSummary:
    return summary.model_copy(update={
        "delta": delta, "privacy_unit": extractor.spec.privacy_unit,
        "cost_model": extractor.spec.cost_model, "relation": relation(extractor),
    })


def with_labels(config: RunConfig, summary: RunSummary, reply: lp_pb.SetupRunReply) -> RunSummary:
    """What B says about its label ledger (B's own run at the accountant)."""
    if config.label_privacy.mode == "none":
        return summary
    if not reply.label_ledger_id:
        raise PeerError("the run asks for label privacy but party B opened no label ledger")
    return summary.model_copy(update={
        "label_privacy": config.label_privacy.mode, "label_run_id": reply.label_ledger_id,
        "label_epsilon_budget": reply.label_epsilon_budget, "label_epsilon_spent": reply.label_epsilon_spent,
        "label_delta": reply.label_delta, "label_note": reply.label_note,
    })


def with_release(
    summary: RunSummary, config: RunConfig, split: str, release: Release, plan: ChargePlan,
) -> RunSummary:
    return summary.model_copy(update={
        "split": split, "noise_multiplier": release.noise_multiplier, "noise_std": release.noise_std,
        "sensitivity": release.sensitivity, "participation_bound": release.participation_bound,
        "accountant_requested": config.privacy.accountant,
        "sensitivity_form": release.details.get("sensitivity_form", ""),
        "one_shot_releases": plan.one_shot_releases, "pre_train_releases": plan.pre_train_releases,
    })


def ended(
    summary: RunSummary, exc: BaseException, milestones: Milestones, steps_done: int, checkpoint_step: int | None,
) -> RunSummary:
    """The summary of a run that stopped with ``exc`` (one of ENDINGS); ``milestones`` learns
    whether the accountant or the lease was lost."""
    run_id = summary.run_id

    def stop(status: str, message: str) -> RunSummary:
        return summary.model_copy(update={"status": status, "message": message})

    if isinstance(exc, LeaseRefused):
        # another trainer holds the run: this one leaves the run, B's session and the ledger to it
        milestones.lost_lease = True
        what = "not resumed" if milestones.refused_lease else "stopped without closing it"
        return stop("failed", f"run {run_id} {what}: {exc}")
    if isinstance(exc, BudgetRefused):
        return stop("refused", f"refused by the accountant: {exc}")
    if isinstance(exc, Cancelled):
        return stop("cancelled", "cancelled by the coordinator")
    if isinstance(exc, PeerLost):
        if not milestones.run_created:
            return stop("failed", str(exc))
        milestones.lost_accountant = exc.peer == "accountant"
        done = f"step {checkpoint_step}" if checkpoint_step is not None else "the start (no checkpoint yet)"
        return stop("interrupted", (
            f"{exc}. Run {run_id} is interrupted after {steps_done} steps; its last checkpoint is "
            f"at {done}. Once the {exc.peer} is back: vesper train --resume {run_id}"
        ))
    if isinstance(exc, OSError):  # A's own disk (journal, checkpoint, run files): fix it, then resume
        where = f"{exc.strerror or exc}: {exc.filename}" if exc.filename else f"{exc.strerror or exc}"
        if not milestones.run_created:
            return stop("failed", (
                f"party A cannot write its run files ({where}); nothing was charged. Fix party A's disk "
                "(party_a.workdir) and start the run again"
            ))
        return stop("interrupted", (
            f"party A cannot write its run files ({where}). Run {run_id} is interrupted after "
            f"{steps_done} steps; once party A's disk (party_a.workdir) is fixed: "
            f"vesper train --resume {run_id}"
        ))
    return stop("failed", str(exc))  # PeerError, ValueError


def with_closed(summary: RunSummary, closed: acc_pb.RunStatus) -> RunSummary:
    """What the accountant computed when it closed the run."""
    return summary.model_copy(update={
        "accountant": closed.accountant,
        "assumption": closed.assumption,
        "epsilon_events": closed.epsilon_events if closed.HasField("epsilon_events") else None,
        "epsilon_bound6": closed.epsilon_bound6 if closed.HasField("epsilon_bound6") else None,
    })


def with_label_ledger(summary: RunSummary, accountant: AccountantClient) -> RunSummary:
    """B's label ledger as the accountant has it at the end (B charges it, A only reads)."""
    if not summary.label_run_id:
        return summary
    try:
        status = accountant.get_run(summary.label_run_id)
    except PeerError as exc:
        return summary.model_copy(update={"message": f"{summary.message}; {exc}"})
    return summary.model_copy(update={"label_epsilon_spent": status.epsilon_spent})


def write(run_dir: Callable[[], Path], summary: RunSummary) -> None:
    """The summary beside the run's files; the coordinator gets it on the stream either way,
    so a disk that fails here costs the local copy, not the run's ending."""
    try:
        (run_dir() / "summary.json").write_text(summary.model_dump_json(indent=2) + "\n")
    except OSError as exc:
        log.warning("run %s: cannot write its summary.json (%s)", summary.run_id, exc)
