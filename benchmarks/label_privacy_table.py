"""``vesper bench label-privacy``: what a curious party A learns about B's labels, against B's label ε.

Every cell is `seeds` runs of one (label-privacy mode, label ε) through the real services,
with ``record_gradients`` on: party A keeps the gradients B returned in the first and the
last epoch, and the label-free attacks of :mod:`vesper.auditor.label_attack` read them.
This benchmark (never A) then scores the attacks against B's true training labels and
reads the test metric and B's label ledger from the run summary.

* results.csv: one row per finished run, written as soon as it ends; rows are keyed by
  (dataset, mode, label ε, seed), so a killed table continues where it stopped;
* the ε = ∞ row is label_privacy.mode none: one run per seed, shown in every mode's column;
* in pate mode A trains the student on the answered *query* nodes only, so no gradient of
  one of B's labelled training nodes reaches A: the table says so and gives the count,
  instead of a number the attack did not earn;
* results.md (the table and sentences generated from the numbers) and results.png.

The headline rule is fixed before any run (docs/label-leakage.md, section 3): binary, the
largest of the four mean ROC-AUCs (norm and direction attack, first- and last-epoch
gradients); multi-class, the larger of the two mean matched cluster accuracies.

This module runs the cells and holds the command; the rest is split by concern:
:mod:`label_privacy_rows` (a run's row, its attack scores, results.csv),
:mod:`label_privacy_cells` (the runs of one cell, the headline rule),
:mod:`label_privacy_report` (results.md) and :mod:`label_privacy_plot` (results.png).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.console import Console

from vesper.benchmarks.harness import parse_epsilons, run_cells
from vesper.benchmarks.label_privacy_cells import BINARY_COLUMNS, MULTICLASS_COLUMNS, LabelCell, cell_at, cell_of
from vesper.benchmarks.label_privacy_plot import plot
from vesper.benchmarks.label_privacy_report import ABOVE_MARK, NO_PRIVATE_GRADIENT, TableContext, attack_text, markdown
from vesper.benchmarks.label_privacy_rows import (
    LabelRow,
    TrueLabels,
    append_row,
    attack_columns,
    cell_config,
    dataset_label,
    format_epsilon,
    planned_cells,
    read_rows,
    row_of,
    true_labels,
)
from vesper.common.config import RunConfig, RunSummary, load_config
from vesper.common.dataset_files import DatasetError, resolve_dataset

# the table's pieces, importable from here as before the split
__all__ = [
    "ABOVE_MARK", "BINARY_COLUMNS", "MODES", "MULTICLASS_COLUMNS", "NO_PRIVATE_GRADIENT", "Driver", "LabelCell",
    "LabelRow", "TableContext", "TrueLabels", "append_row", "attack_columns", "attack_text", "cell_at", "cell_config",
    "cell_of", "dataset_label", "format_epsilon", "label_privacy_command", "markdown", "planned_cells", "plot",
    "read_rows", "row_of", "run_label_table", "true_labels",
]

console = Console()

MODES = ("rr", "pate")

Driver = Callable[[RunConfig], tuple[RunSummary, Optional[Path]]]


# -- the runs ---------------------------------------------------------------------------------
def run_label_table(
    base: RunConfig, dataset: str, epsilons: Sequence[float], modes: Sequence[str], seeds: int, out: Path,
    drivers: Sequence[Driver], console: Console, *, pate_extractor: str | None = None,
    truth: Callable[[RunConfig], TrueLabels] = true_labels,
) -> list[LabelRow]:
    """Run every missing cell, ``len(drivers)`` at a time (rows appended under a lock); return the table's rows."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown label-privacy mode(s) {', '.join(unknown)}; expected {' or '.join(MODES)}")
    if not drivers:
        raise ValueError("run_label_table needs at least one driver")
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "results.csv"
    label = dataset_label(dataset)
    done = {row.key: row for row in read_rows(csv_path) if row.status == "completed"}
    rows: list[LabelRow] = []
    missing: list[tuple[str, float, int]] = []
    for mode, epsilon, seed in planned_cells(modes, epsilons, seeds):
        found = done.get((label, mode, epsilon, seed))
        if found is not None:
            rows.append(found)
        else:
            missing.append((mode, epsilon, seed))

    def run(drive: Driver, cell: tuple[str, float, int]) -> LabelRow:
        config = cell_config(base, dataset, *cell, pate_extractor)
        labels = truth(config)  # before the run: a dataset the benchmark cannot read fails fast
        summary, gradients = drive(config)
        return row_of(summary, gradients, config, labels)

    rows += run_cells(
        missing, drivers, run, lambda row: append_row(csv_path, row),
        lambda cell: f"{label} · {cell[0]} · label ε={format_epsilon(cell[1])} · seed {cell[2]}", console,
    )
    return rows


# -- the command ----------------------------------------------------------------------------------
def _base_run(config: Path | None, extractor: str, epochs: int, edge_epsilon: float) -> RunConfig:
    data = {}
    if config is not None:
        try:
            loaded = load_config(config)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--config") from None
        data = loaded.run.model_dump(exclude_unset=True) if loaded.run else {}
    data["epochs"] = epochs
    data.setdefault("extractor", {})["name"] = extractor
    data.setdefault("privacy", {})["epsilon"] = edge_epsilon
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise typer.BadParameter(f"invalid run configuration:\n{exc}") from None


def label_privacy_command(
    dataset: str = typer.Option("cora", "--dataset", help="A bundled name or an .npz path."),
    label_epsilon: list[str] = typer.Option(
        ["1", "2", "4", "8", "inf"], "--label-epsilon",
        help="B's label budgets, a row each (repeat the flag); 'inf' = the row without label privacy.",
    ),
    mode: list[str] = typer.Option(["rr", "pate"], "--mode", help="Label-privacy modes, a column each: rr, pate (repeat)."),
    seeds: int = typer.Option(3, "--seeds", help="Runs per cell (seeds 0, 1, ...).", min=1),
    extractor: str = typer.Option("mlp", "--extractor", help="A's extractor for the none and rr runs."),
    pate_extractor: str = typer.Option(
        "relational", "--pate-extractor",
        help="A's extractor for the pate runs: it must be trained without B's labels (a frozen encoder).",
    ),
    epochs: int = typer.Option(30, "--epochs", help="Training epochs of every run.", min=1),
    edge_epsilon: str = typer.Option(
        "inf", "--edge-epsilon",
        help="A's edge budget of every run; 'inf' = no edge noise. It does not enter B's label guarantee.",
    ),
    jobs: int = typer.Option(1, "--jobs", help="Runs at a time, each with its own services on loopback.", min=1),
    out: Path = typer.Option(Path("bench/label-privacy"), "--out", help="Directory for results.csv, results.md and results.png."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file whose [run] section every run starts from."),
) -> None:
    """Label leakage to party A against B's label ε, through the real services.

    A row per --label-epsilon (inf: no label privacy, run once per seed and
    shown in every column), a column per --mode. Party A records the
    gradients B returns (first and last epoch); the norm, direction and
    clustering attacks read only them, and are scored against B's true
    training labels beside the test metric and B's label ε spent. In pate
    mode A gets gradients of answered query nodes only, never of B's
    labelled training nodes: the table says so instead of a number.

    Writes OUT/results.csv (resumable: finished runs are not run again),
    results.md and results.png. See docs/label-leakage.md.
    """
    from contextlib import ExitStack

    from vesper.coordinator.processes import LocalCluster, ServiceStartError
    from vesper.coordinator.run_client import RunClientError, drive_run

    budgets = parse_epsilons(label_epsilon, "--label-epsilon", "a label ε")
    modes = list(dict.fromkeys(mode))
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: expected rr or pate", param_hint="--mode")
    edge = parse_epsilons([edge_epsilon], "--edge-epsilon")[0]
    base = _base_run(config, extractor, epochs, edge)
    try:  # the benchmark scores against the true labels, so it must read the dataset itself
        resolve_dataset(dataset)
    except DatasetError as exc:
        raise typer.BadParameter(str(exc), param_hint="--dataset") from None
    command = " ".join([
        "vesper bench label-privacy", f"--dataset {dataset}", *(f"--label-epsilon {e}" for e in label_epsilon),
        *(f"--mode {m}" for m in modes), f"--seeds {seeds}", f"--extractor {extractor}",
        f"--pate-extractor {pate_extractor}", f"--epochs {epochs}", f"--edge-epsilon {edge_epsilon}",
    ])

    def driver(cluster: LocalCluster) -> Driver:
        def drive(run: RunConfig) -> tuple[RunSummary, Path | None]:
            summary = drive_run(cluster.party_a_address, run, console)
            recorded = cluster.workdir / "party_a" / "runs" / summary.run_id / "gradients.npz"
            return summary, (recorded if recorded.is_file() else None)

        return drive

    try:
        with ExitStack() as stack:
            clusters = [stack.enter_context(LocalCluster((out / f"cluster-{i}").resolve())) for i in range(jobs)]
            rows = run_label_table(
                base, dataset, budgets, modes, seeds, out, [driver(c) for c in clusters], console,
                pate_extractor=pate_extractor, truth=true_labels,
            )
    except (ServiceStartError, RunClientError) as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    context = TableContext(command, dataset_label(dataset), extractor, pate_extractor, epochs, edge, seeds)
    (out / "results.md").write_text(markdown(rows, budgets, modes, context) + "\n")
    plot(rows, budgets, modes, out / "results.png")
    console.print((out / "results.md").read_text(), highlight=False)
    console.print(f"wrote {out / 'results.csv'}, {out / 'results.md'} and {out / 'results.png'}", highlight=False)
