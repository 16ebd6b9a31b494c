"""How a run's summary is printed: the table, and a paragraph per run naming the mode of every ε."""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.table import Table

from vesper.common.config import (
    RunSummary,
)
from vesper.coordinator.cli.shared import (
    console,
    hidden_batch_numbers,
)
from vesper.coordinator.run_client import format_epsilon


def _computed_by(s: RunSummary) -> str:
    """What produced the summary's ε: the accountant's name, or why it is not known."""
    if s.accountant:
        return s.accountant
    if s.status == "interrupted" and "accountant" in s.message:
        return "ε as of party A's last receipt: the accountant was lost before the run was closed"
    if s.epsilon_spent > 0 or s.steps:
        return "ε as of party A's last receipt"
    return "no charges"


def print_summaries(summaries: list[RunSummary]) -> None:
    # fits 80 columns; every ε names the accounting that produced it (hidden-batch is no guarantee against B)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("run", "extractor", "status", "test", "ε / budget"):
        table.add_column(column, no_wrap=True)
    short = {"accuracy": "acc", "roc_auc": "auc"}
    for s in summaries:
        metric = f"{short.get(s.test_metric.name, s.test_metric.name)} {s.test_metric.value:.4f}" if s.test_metric else "-"
        table.add_row(
            s.run_id, s.extractor, s.status, metric,
            f"{format_epsilon(s.epsilon_spent)} / {format_epsilon(s.epsilon_budget)} ({s.accounting})",
        )
    console.print(table)
    for s in summaries:
        if s.status != "completed":
            console.print(f"[bold]{s.run_id}[/] {s.status}: {s.message}", highlight=False)
        if s.cost_model == "none":
            noise = "reads no edges, so spends nothing"
        elif s.noise_multiplier and s.cost_model == "one-shot":
            parts = []
            if s.pre_train_releases:
                parts.append(f"{s.pre_train_releases} private pre-training charge{'s' if s.pre_train_releases != 1 else ''} inside A")
            if s.one_shot_releases:
                parts.append(f"{s.one_shot_releases} release{'s' if s.one_shot_releases != 1 else ''}")
            noise = (
                f"noise multiplier z {s.noise_multiplier:.4g} on {' and '.join(parts) or 'nothing'} made once before "
                "training; every training and evaluation release is post-processing of them"
            )
        elif s.noise_multiplier:
            counted = "every release" if s.participation_bound is None else f"{s.participation_bound} per pass"
            once = f"{s.one_shot_releases} releases once, then " if s.one_shot_releases else ""
            form = f"{s.sensitivity_form} " if s.sensitivity_form else ""
            noise = (
                f"noise std θ={s.noise_std:.4g} = z {s.noise_multiplier:.4g} × {form}sensitivity "
                f"{s.sensitivity:.4g}; counted releases: {once}{counted}"
            )
        else:
            noise = "no noise"
        val = f", val {s.val_metric.value:.4f}" if s.val_metric else ""
        console.print(
            f"[bold]{s.run_id}[/] {s.extractor}+{s.decoder} on {s.dataset}, {s.steps} steps in {s.seconds:.1f} s{val}: "
            f"{s.privacy_unit}-level ε spent "
            f"{format_epsilon(s.epsilon_spent)} of {format_epsilon(s.epsilon_budget)} at δ={s.delta:.3g} "
            f"({s.accounting}, {_computed_by(s)}); {noise}"
            + (f". Privacy unit: {s.relation}" if s.relation else ""),
            highlight=False,
        )
        if s.decoder_head:
            console.print(f"  {head_line(s)}", highlight=False)
        if s.accounting == "hidden-batch":
            console.print(f"  {hidden_batch_numbers(s.epsilon_events, s.epsilon_bound6)} {s.assumption}", highlight=False)
        if s.status_url:
            console.print(f"  status: {s.status_url}", highlight=False)
        else:
            console.print("  no record at the accountant: the run ended before it was created there; nothing was charged", highlight=False)
        if s.label_privacy != "none" and not s.label_run_id:
            console.print(f"  B's labels ({s.label_privacy}): party B opened no label ledger; nothing was charged", highlight=False)
        elif s.label_privacy != "none":
            spent = "-" if s.label_epsilon_spent is None else format_epsilon(s.label_epsilon_spent)
            budget = "-" if s.label_epsilon_budget is None else format_epsilon(s.label_epsilon_budget)
            delta = "" if s.label_delta is None else f" at δ={s.label_delta:.3g}"
            console.print(
                f"  B's labels ({s.label_privacy}): label-level ε spent {spent} of {budget}{delta}, a separate "
                f"ledger ({s.label_run_id}); privacy unit: one label of one of B's training nodes. {s.label_note}",
                highlight=False,
            )
        else:
            console.print("  B's labels: not protected from party A (--label-privacy none)", highlight=False)


def write_json(path: Path | None, summary: RunSummary) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(summary.model_dump_json(indent=2) + "\n")


def head_line(s: RunSummary) -> str:
    """Which of B's three heads the run kept, and why (the edge-free path, docs/utility.md section 7)."""
    val = {head: s.head_metrics.get(f"val@{head}") for head in ("graph", "edge-free", "combined")}
    scores = ", ".join(f"{head} {m.value:.4f}" for head, m in val.items() if m is not None)
    kept = {
        "graph": "the graph head (the extractor's slices)", "edge-free": "the edge-free head (the MLP's slices)",
        "combined": "the combined head (every slice)",
    }.get(s.decoder_head, s.decoder_head)
    line = f"B kept {kept}: validation {scores}"
    base = val["edge-free"]
    rivals = {head: m for head, m in val.items() if head != "edge-free" and m is not None}
    if base is None or not rivals:
        return line
    rival = s.decoder_head if s.decoder_head in rivals else max(rivals, key=lambda head: rivals[head].value)
    lead = rivals[rival].value - base.value
    error = s.head_errors.get(f"val@{rival}")
    noise = f", SE of the paired difference {error.value:.4f}" if error is not None else ""
    if s.decoder_head == "edge-free" and lead > 0:
        line += f" ({rival} led it by {lead:.4f}, within the paired noise on those nodes{noise})"
    elif s.decoder_head == rival:
        line += f" ({rival} led the edge-free head by {lead:.4f}{noise})"
    return line
