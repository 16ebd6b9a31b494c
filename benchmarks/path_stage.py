"""Does the edge-free path's own stage make its head the MLP baseline? (docs/utility.md, section 7)

An extractor released once stops its run early (GAP: 20 epochs); without a stage its path is an
MLP trained that long, with one it first trains alone for the rest of the baseline's epochs
(docs/privacy.md, section 2.5). This runs both forms of one extractor, seed for seed, through
one in-process set of services, with the MLP baseline in the same run, and prints each head's
mean test metric per graph and form: the edge-free head should match the baseline.

    python -m vesper.benchmarks.path_stage [--dataset cora ...] [--extractor gap] [--epsilon 4]
                                           [--seeds 5] [--out bench/path-stage]

Runs are kept in OUT/rows.jsonl (one JSON object a line) and not run again.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from vesper.benchmarks.utility_datasets import resolve_datasets
from vesper.benchmarks.utility_options import SYNTHETIC_NODES
from vesper.common.config import RunConfig
from vesper.coordinator.public_facts import with_published_edge_bound
from vesper.party_b.decoders import HEADS

FORMS = ("baseline", "stage", "no stage")  # the MLP; the extractor with its path's stage; without it


class PathStageRow(BaseModel):
    """One finished run: which graph, form and seed, and what each head scored on test."""

    dataset: str
    extractor: str
    form: str
    epsilon: float
    seed: int
    status: str
    chosen: str
    test: float | None
    heads: dict[str, float]
    seconds: float


def read_rows(path: Path) -> list[PathStageRow]:
    if not path.is_file():
        return []
    return [PathStageRow.model_validate_json(line) for line in path.read_text().splitlines() if line.strip()]


def run_config(dataset: str, extractor: str, form: str, epsilon: float, seed: int) -> RunConfig:
    """The run of one form: the MLP baseline, or ``extractor`` with its path's stage or without."""
    name = "mlp" if form == "baseline" else extractor
    fields: dict = {"name": name}
    if form == "no stage":
        fields["edge_free_path_epochs"] = 0
    config = RunConfig.model_validate({
        "dataset": dataset, "seed": seed, "privacy": {"epsilon": epsilon}, "extractor": fields,
    })
    return with_published_edge_bound(config)


def planned(labels: list[tuple[str, str]], seeds: int) -> Iterator[tuple[str, str, str, int]]:
    """(label, run name, form, seed), seed-major so a cut-short bench still compares like with like."""
    for seed in range(seeds):
        for label, run_name in labels:
            for form in FORMS:
                yield label, run_name, form, seed


def mean(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f}" if values else "—"


def report(rows: list[PathStageRow], console: Console) -> None:
    table = Table(title="edge-free head per form (mean test metric over seeds)")
    for column in ("graph", "form", "runs", "edge-free head", "graph head", "combined head", "as B chose"):
        table.add_column(column)
    for label in dict.fromkeys(r.dataset for r in rows):
        for form in FORMS:
            done = [r for r in rows if r.dataset == label and r.form == form and r.status == "completed"]
            if not done:
                continue
            heads = ["—"] * len(HEADS) if form == "baseline" else [
                mean([r.heads[f"test@{h}"] for r in done if f"test@{h}" in r.heads]) for h in HEADS
            ]
            table.add_row(label, form, str(len(done)), *heads, mean([r.test for r in done if r.test is not None]))
    console.print(table)


def main(
    dataset: Optional[list[str]] = typer.Option(None, "--dataset", help="Graphs (repeat; default cora, tolokers, twitch-engb)."),
    extractor: str = typer.Option("gap", "--extractor", help="An extractor released once (gap, relational-gap)."),
    epsilon: float = typer.Option(4.0, "--epsilon", help="The edge-level budget of every run."),
    seeds: int = typer.Option(5, "--seeds", min=1, help="Seeds per graph and form."),
    out: Path = typer.Option(Path("bench/path-stage"), "--out", help="rows.jsonl goes here (resumable)."),
) -> None:
    from vesper.coordinator.in_process import InProcessCluster

    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    found = resolve_datasets(dataset or ["cora", "tolokers", "twitch-engb"], out / "data", SYNTHETIC_NODES, set(), console)
    labels = [(d.label, d.run_name) for d in found]
    rows_file = out / "rows.jsonl"
    done = {(r.dataset, r.form, r.seed) for r in read_rows(rows_file) if r.extractor == extractor and r.epsilon == epsilon}
    with InProcessCluster((out / "services").resolve()) as cluster:
        for label, run_name, form, seed in planned(labels, seeds):
            if (label, form, seed) in done:
                continue
            console.print(f"{label} · {form} · seed {seed}", highlight=False)
            summary = cluster.drive(run_config(run_name, extractor, form, epsilon, seed))
            row = PathStageRow(
                dataset=label, extractor=extractor, form=form, epsilon=epsilon, seed=seed, status=summary.status,
                chosen=summary.decoder_head or "", test=summary.test_metric.value if summary.test_metric else None,
                heads={k: v.value for k, v in summary.head_metrics.items()}, seconds=summary.seconds,
            )
            with rows_file.open("a") as handle:
                handle.write(row.model_dump_json() + "\n")
    report([r for r in read_rows(rows_file) if r.extractor == extractor and r.epsilon == epsilon], console)


if __name__ == "__main__":
    typer.run(main)
