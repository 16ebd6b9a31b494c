"""`vesper status` and `vesper ledger verify`: budgets read from the REST status or a ledger file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.table import Table

from vesper.coordinator.cli.shared import (
    PLAIN_HELP,
    console,
    fail,
    hidden_batch_numbers,
    load_settings,
)
from vesper.coordinator.run_client import format_epsilon


def _status_source(url: str | None, config: Path | None, ledger_file: Path | None, ca_file: Path | None = None):
    from vesper.coordinator import status_client

    cfg = load_settings(config)
    base = url or (cfg.coordinator.accountant_status_url if cfg.coordinator else "http://127.0.0.1:8080")
    if ca_file is None and cfg.coordinator is not None and cfg.coordinator.tls is not None:
        ca_file = cfg.coordinator.tls.ca_file
    if ledger_file is not None:
        if not ledger_file.exists():
            fail(f"--ledger {ledger_file}: no such file")
        try:
            return status_client.LedgerFile(ledger_file)  # read-only: the audit never writes the file
        except status_client.StatusError as exc:
            fail(str(exc), 1)
    return status_client.StatusEndpoint(base, ca_file)


UrlOpt = typer.Option(None, "--url", help="The accountant's REST base URL (default: [coordinator].accountant_status_url).")
StatusConfigOpt = typer.Option(None, "--config", "-c", help="TOML file with [coordinator].")
LedgerOpt = typer.Option(None, "--ledger", help="Read a ledger file directly instead of the REST endpoint.")
CaOpt = typer.Option(
    None, "--ca",
    help="The deployment's CA certificate (ca.pem of `vesper certs`) to verify an https status URL "
    "(default: [coordinator].tls.ca_file, else the system's trust store).",
)


def _bounds_text(view) -> str:
    parts = []
    for rule in view.rules:
        bound = "every release" if rule.participation_bound is None else str(rule.participation_bound)
        parts.append(f"{rule.kind} N_e={bound}")
    return ", ".join(parts)


def _print_verification(result) -> None:
    if not result.consistent:
        fail("ledger does not replay: " + "; ".join(result.problems), 4)
    extra = ""
    if result.epsilon_bound6 is not None:
        extra = f"; events {format_epsilon(result.epsilon_events)}, bound (6) {format_epsilon(result.epsilon_bound6)}"
    console.print(
        f"verified: ε recomputed from {result.charges} ledger rows ({result.counted} counted) = "
        f"{result.epsilon!r} ({result.accountant}{extra}), exactly as recorded", highlight=False,
    )


def _label_ledger(status_client, base, view):
    """B's label ledger of run ``view`` (``<run id>.labels``), if B protected its labels."""
    if view.privacy_unit == "label":
        return None
    try:
        return status_client.run_status(base, f"{view.run_id}.labels")
    except status_client.StatusError:
        return None


def _print_view(view, title: str = "") -> None:
    heading = f"[bold]run {view.run_id}[/] ({view.status}) — {view.extractor}, privacy unit: {view.privacy_unit}"
    console.print(heading + (f" — {title}" if title else ""), highlight=False)
    console.print(
        f"ε spent {format_epsilon(view.epsilon_spent)} of {format_epsilon(view.epsilon_budget)} at δ={view.delta:.3g} "
        f"({view.accounting}, computed by {view.accountant}, requested {view.accountant_requested}); "
        f"{view.charges} charges, {view.counted_charges} counted; {_bounds_text(view)}",
        highlight=False,
    )
    if view.accounting == "hidden-batch":
        console.print(hidden_batch_numbers(view.epsilon_events, view.epsilon_bound6), highlight=False)
    console.print(f"accounting: {view.assumption}", highlight=False)
    reserved = view.details.get("prediction_passes")
    if reserved or view.prediction_passes:
        console.print(
            f"prediction passes: {view.prediction_passes} made of {reserved or 0} reserved in the budget "
            "(charged like the evaluation pass; free where the evaluation is)", highlight=False,
        )
    if view.closed_reason:
        console.print(f"closed: {view.closed_reason}", highlight=False)


def status(
    run_id: Optional[str] = typer.Argument(None, help="A run id; without it, list all runs."),
    url: Optional[str] = UrlOpt,
    config: Optional[Path] = StatusConfigOpt,
    ledger_file: Optional[Path] = LedgerOpt,
    ca_file: Optional[Path] = CaOpt,
    verify: bool = typer.Option(False, "--verify", help="Recompute ε locally from the run's ledger and compare (as `vesper ledger verify`)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write the run's ε over its releases as a PNG to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print the accountant's JSON instead of a table."),
) -> None:
    """Read privacy budgets from the accountant's REST status endpoint."""
    from vesper.coordinator import status_client

    base = _status_source(url, config, ledger_file, ca_file)
    try:
        if run_id is None:
            if plot is not None:
                fail("--plot needs a run id")
            runs = status_client.list_runs(base)
            if as_json:
                console.print_json(json.dumps([json.loads(r.model_dump_json()) for r in runs]))
                return
            console.print(f"runs at {base}", highlight=False)
            table = Table(box=box.SIMPLE_HEAD)
            for column in ("run", "status", "extractor", "unit", "mode", "ε / budget", "δ", "charges"):
                table.add_column(column, no_wrap=True)
            for r in runs:
                table.add_row(r.run_id, r.status, r.extractor, r.privacy_unit, r.accounting,
                              f"{format_epsilon(r.epsilon_spent)} / {format_epsilon(r.epsilon_budget)}", f"{r.delta:.3g}", str(r.charges))
            console.print(table)
            if any(r.accounting == "hidden-batch" for r in runs):
                console.print("hidden-batch runs assume B cannot tell which edges a step used: no guarantee against B.")
            return
        view = status_client.run_status(base, run_id)
        labels = _label_ledger(status_client, base, view)
        if as_json:
            if labels is None:
                console.print_json(view.model_dump_json())
            else:  # both ledgers, each with its own privacy unit; never one number
                console.print_json(json.dumps({
                    "run": json.loads(view.model_dump_json()), "label_ledger": json.loads(labels.model_dump_json()),
                }))
        else:
            _print_view(view, "party A's ledger" if labels is not None else "")
            if labels is not None:
                console.print()
                _print_view(labels, "party B's label ledger, separate from A's and never added to it")
        if plot is not None:
            from vesper.coordinator.epsilon_plot import plot_epsilon

            plot_epsilon(view, plot)
            console.print(f"wrote {plot}", highlight=False)
        if verify:
            _print_verification(status_client.verify(base, run_id))
    except status_client.StatusError as exc:
        fail(str(exc), 1)


ledger_app = typer.Typer(help="Audit a run's ledger.", no_args_is_help=True, **PLAIN_HELP)


@ledger_app.command("verify")
def ledger_verify(
    run_id: str = typer.Argument(..., help="The run to verify."),
    url: Optional[str] = UrlOpt,
    config: Optional[Path] = StatusConfigOpt,
    ledger_file: Optional[Path] = LedgerOpt,
    ca_file: Optional[Path] = CaOpt,
) -> None:
    """Replay the run's stored DpEvents and reproduce its reported ε exactly (exit 4 if not)."""
    from vesper.coordinator import status_client

    base = _status_source(url, config, ledger_file, ca_file)
    try:
        view = status_client.run_status(base, run_id)
        result = status_client.verify(base, run_id)
    except status_client.StatusError as exc:
        fail(str(exc), 1)
    if result.consistent and result.charges and result.epsilon != view.epsilon_spent:
        fail(f"replayed ε {result.epsilon!r} differs from the reported ε {view.epsilon_spent!r}", 4)
    _print_verification(result)
    if view.accounting == "hidden-batch":
        console.print(f"accounting: {view.assumption}", highlight=False)
