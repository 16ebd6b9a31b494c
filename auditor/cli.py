"""`vesper audit RUN`: attack a finished run from party B's position (docs/audit.md); loaded by the
`vesper` command line only when `audit` is asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.table import Table

from vesper.common.config import (
    PartyAConfig,
    PartyBConfig,
    VesperConfig,
)
from vesper.coordinator.cli.shared import (
    PLAIN_HELP,
    console,
    fail,
    load_settings,
)
from vesper.coordinator.run_client import format_epsilon

audit_app = typer.Typer(add_completion=False, **PLAIN_HELP)


@audit_app.command()
def audit(
    run_id: str = typer.Argument(..., help="A finished run, trained with audit.record_releases = true."),
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", help="TOML file whose [party_a] and [party_b] sections name the workdirs."
    ),
    party_a_workdir: Optional[Path] = typer.Option(None, "--party-a-workdir", help="Party A's workdir (A's summary and canary draw)."),
    party_b_workdir: Optional[Path] = typer.Option(None, "--party-b-workdir", help="Party B's workdir (what B received)."),
    dataset: Optional[Path] = typer.Option(None, "--dataset", help="The run's .npz (default: the run's dataset name resolved here)."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence of the canary audit's ε lower bound.", min=0.5, max=0.9999),
    seed: int = typer.Option(0, "--seed", help="Seed of the attacks' own sampling (non-edges, shadow set).", min=0),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Attack a finished run from party B's position (docs/audit.md).

    Membership inference (TFTS runs: audit.membership), edge inference from the released
    embeddings, and the one-run canary audit (runs with audit.canaries): its empirical
    lower bound on ε is printed beside the accountant's ε. Exit 5 if the bound exceeds it.
    """
    from vesper.auditor.run_audit import AuditError, audit_run

    loaded = load_settings(config) if config is not None else VesperConfig()
    a_dir = party_a_workdir or (loaded.party_a or PartyAConfig()).workdir
    b_dir = party_b_workdir or (loaded.party_b or PartyBConfig()).workdir
    try:
        report = audit_run(run_id, a_dir, b_dir, dataset=dataset, confidence=confidence, seed=seed)
    except (AuditError, FileNotFoundError, ValueError) as exc:
        fail(str(exc), 1)
    if as_json:
        console.print_json(report.model_dump_json())
    else:
        _print_audit(report)
    if report.bound_exceeds_accountant:
        raise typer.Exit(5)


def _print_audit(report) -> None:
    console.print(
        f"run {report.run_id}: {report.extractor} on {report.dataset}, {report.accounting}, "
        f"ε spent {format_epsilon(report.epsilon_spent)} of {format_epsilon(report.epsilon_budget)}, δ {report.delta:.3g}",
        highlight=False,
    )
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("attack", "result", "detail"):
        table.add_column(column)
    if report.edge_inference is not None:
        e = report.edge_inference
        table.add_row("edge inference", f"AUC {e.auc:.3f}", f"{e.positives} edges vs {e.negatives} non-edges")
    if report.membership is not None:
        m = report.membership
        table.add_row(f"membership ({m.attack})", f"AUC {m.auc:.3f}", f"{m.members} members vs {m.non_members} non-members")
    scorers = (
        ("canary audit: B's similarity", report.canaries),
        ("canary audit: replay of the evaluation release", report.canaries_replay),
        ("canary audit: A's noisy aggregates (white box)", report.canaries_mechanism),
        ("canary audit: B's release sums (white box)", report.canaries_release),
    )
    for name, c in scorers:
        if c is not None:
            table.add_row(name, f"ε ≥ {c.epsilon_lower_bound:.3f}", f"{c.correct}/{c.guesses} right of m = {c.m}, confidence {c.confidence:g}"
                          + (" (primary)" if c is report.primary_canary_audit else ""))
    console.print(table)
    for reason in report.skipped:
        console.print(f"skipped {reason}", highlight=False)
    console.print(report.verdict(), style="bold red" if report.bound_exceeds_accountant else None, highlight=False)
