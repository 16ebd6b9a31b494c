"""``vesper audit RUN``: the attacks of docs/audit.md on one finished run.

The attacks run from party B's position, on what B kept of the run (``received.npz`` in
B's workdir, ``RunConfig.audit.record_releases``):

* **membership inference** ([VESPER, App. C.7], TFTS runs: ``audit.membership``);
* **edge inference**: B scores node pairs by how alike their releases are;
* the **one-run canary audit** (Steinke, Nasr and Jagielski 2023 [SNJ23]): B guesses which of A's
  canary edges were planted (``audit.canaries``); the count of right guesses gives an
  empirical lower bound on ε, set beside the accountant's ε.

Scoring needs the truth B does not have: the auditor reads A's graph (the dataset file),
B's labels, and A's canary draw (``canaries.npz`` in A's run directory, A's secret until
the audit). Each part runs when its inputs exist and says why when they do not.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel

from vesper.auditor.canary_replay import audit_canaries_replayed
from vesper.auditor.canary_scores import audit_canaries, audit_canaries_white_box
from vesper.auditor.edge_inference import EdgeInferenceResult, edge_inference
from vesper.auditor.membership_attack import MembershipResult, membership_attack
from vesper.auditor.one_run_bound import OneRunAudit
from vesper.auditor.received_releases import ReceivedReleases
from vesper.common.config import DecoderConfig, RunSummary
from vesper.common.dataset_files import load_graph_part, resolve_dataset
from vesper.party_a.canaries import CanaryDraw
from vesper.party_b.label_data import load_labels


class AuditError(ValueError):
    """The run cannot be audited (a file is missing or belongs to another run)."""


class AuditReport(BaseModel):
    run_id: str
    dataset: str
    extractor: str
    accounting: str
    privacy_unit: str
    epsilon_budget: float
    epsilon_spent: float
    delta: float
    confidence: float
    membership: MembershipResult | None = None
    edge_inference: EdgeInferenceResult | None = None
    canaries: OneRunAudit | None = None  # B's own guesses (pair_scores)
    canaries_replay: OneRunAudit | None = None  # the auditor's replay of the evaluation release
    # per-release white-box statistics (party_a/canary_statistics.py): A's noisy aggregates, and B's sums
    canaries_mechanism: OneRunAudit | None = None
    canaries_release: OneRunAudit | None = None
    skipped: list[str] = []

    @property
    def primary_canary_audit(self) -> OneRunAudit | None:
        """The pre-registered headline: the white-box statistic over A's noisy aggregates
        (every event the accountant composes) where the extractor has one, else B's own
        similarity guesses. Each scorer is a valid bound at the stated confidence on its own;
        only the primary is the run's number, so no multiple-testing correction is needed."""
        return self.canaries_mechanism or self.canaries

    @property
    def canary_bound(self) -> float | None:
        primary = self.primary_canary_audit
        return None if primary is None else primary.epsilon_lower_bound

    @property
    def exceeding(self) -> list[str]:
        """Scorers whose bound exceeds the accountant's ε: each is a bug to investigate (looking
        at four scorers raises the false-alarm rate a little, never hides a real excess)."""
        scorers = {
            "B's similarity": self.canaries, "replay": self.canaries_replay,
            "white box": self.canaries_mechanism, "B's release sums": self.canaries_release,
        }
        return [name for name, a in scorers.items() if a is not None and a.epsilon_lower_bound > self.epsilon_spent]

    @property
    def bound_exceeds_accountant(self) -> bool:
        """The audit contradicts the accountant: a bug to investigate, not a number to publish."""
        return bool(self.exceeding)

    def verdict(self) -> str:
        bound, spent = self.canary_bound, self.epsilon_spent
        if bound is None:
            return "no canary audit in this run"
        if self.bound_exceeds_accountant:
            return (
                f"EMPIRICAL LOWER BOUND ABOVE THE ACCOUNTANT'S ε {spent:.3g} ({self.accounting}; "
                f"{', '.join(self.exceeding)}): the guarantee does not hold for this run; investigate"
            )
        return (
            f"empirical lower bound {bound:.3g} ≤ the accountant's ε {spent:.3g} ({self.accounting}) "
            f"at confidence {self.confidence:g}: consistent"
        )


def _summary(party_a_workdir: Path, run_id: str) -> RunSummary:
    path = party_a_workdir / "runs" / run_id / "summary.json"
    if not path.is_file():
        raise AuditError(f"no run {run_id!r} in party A's workdir {party_a_workdir} ({path} is missing)")
    return RunSummary.model_validate_json(path.read_text())


def audit_run(
    run_id: str, party_a_workdir: Path, party_b_workdir: Path, *, dataset: Path | None = None,
    confidence: float = 0.95, seed: int = 0,
) -> AuditReport:
    """Every attack whose inputs the run left behind, scored against the truth."""

    summary = _summary(party_a_workdir, run_id)
    if summary.status != "completed":
        raise AuditError(f"run {run_id} did not complete ({summary.status}: {summary.message}); nothing to audit")
    received_path = party_b_workdir / "runs" / run_id / "received.npz"
    if not received_path.is_file():
        raise AuditError(
            f"party B kept nothing of run {run_id} ({received_path} is missing): audit a run trained with "
            "audit.record_releases = true"
        )
    received = ReceivedReleases.load(received_path)
    path = dataset or resolve_dataset(summary.dataset)
    graph = load_graph_part(path)
    if graph.num_nodes != received.num_nodes:
        raise AuditError(
            f"{path} has {graph.num_nodes} nodes but party B received ids of {received.num_nodes}: "
            "not the run's dataset"
        )
    report = AuditReport(
        run_id=run_id, dataset=summary.dataset, extractor=summary.extractor, accounting=summary.accounting,
        privacy_unit=summary.privacy_unit, epsilon_budget=summary.epsilon_budget,
        epsilon_spent=summary.epsilon_spent, delta=summary.delta, confidence=confidence,
    )
    skipped: list[str] = []
    report.edge_inference = edge_inference(received, graph.edges, seed)
    if received.split_ids("train").size:
        store = load_labels(path, 0)
        report.membership = membership_attack(
            received, store.labels.numpy(), store.num_classes, seed, decoder=DecoderConfig(kind=summary.decoder),
        )
    else:
        skipped.append("membership: the run was not a TFTS membership audit (audit.membership)")
    run_dir = party_a_workdir / "runs" / run_id
    if (run_dir / "canaries.npz").is_file():
        draw = CanaryDraw.load(run_dir / "canaries.npz")
        report.canaries = audit_canaries(draw, received, summary.delta, confidence)
        try:
            report.canaries_replay = audit_canaries_replayed(
                draw, received, run_dir, graph.edges, graph.features, summary.delta, confidence,
            )
        except ValueError as exc:
            skipped.append(f"canaries (white-box replay): {exc}")
        try:
            report.canaries_mechanism, report.canaries_release = audit_canaries_white_box(
                draw, received, run_dir, summary.delta, confidence,
            )
        except (FileNotFoundError, ValueError) as exc:
            skipped.append(f"canaries (per-release statistics): {exc}")
    else:
        skipped.append("canaries: the run planted none (audit.canaries)")
    report.skipped = skipped
    return report


def format_epsilon(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.4g}"
