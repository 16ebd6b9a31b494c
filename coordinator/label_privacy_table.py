"""``vesper bench label-privacy``: what a curious party A learns about B's labels, against B's label ε.

Every cell is `seeds` runs of one (label-privacy mode, label ε) through the real services,
with ``record_gradients`` on: party A keeps the gradients B returned in the first and the
last epoch, and the label-free attacks of :mod:`vesper.party_a.label_attack` read them.
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
"""

from __future__ import annotations

import csv
import functools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console

from vesper.common.config import RunConfig, RunSummary, load_config
from vesper.common.dataset_files import DatasetError, load_label_part, resolve_dataset
from vesper.common.splits import split_for
from vesper.coordinator.epsilon_flags import parse_epsilons
from vesper.coordinator.public_facts import with_published_edge_bound
from vesper.coordinator.worker_pool import run_cells

if TYPE_CHECKING:
    from vesper.party_a.label_attack import RecordedGradients

# vesper.party_a.label_attack (torch, scipy) is imported where it is used: the CLI imports
# this module to register the command, and every `vesper` call would otherwise pay for torch.

console = Console()

MODES = ("rr", "pate")
MODE_NAMES = {"none": "no label privacy", "rr": "randomised response", "pate": "DP-GPL (PATE)"}
NO_PRIVATE_GRADIENT = "no gradient of a private label reaches A"
ABOVE_MARK = "⚠ above"
CEILING_MARGIN = 3.0  # standard errors between a headline and its DP ceiling before a cell is flagged
BINARY_COLUMNS = ("norm_auc_first", "norm_auc_last", "direction_auc_first", "direction_auc_last")
MULTICLASS_COLUMNS = ("cluster_accuracy_first", "cluster_accuracy_last")
COLUMN_NAMES = {
    "norm_auc_first": "norm attack, first epoch", "norm_auc_last": "norm attack, last epoch",
    "direction_auc_first": "direction attack, first epoch", "direction_auc_last": "direction attack, last epoch",
    "cluster_accuracy_first": "clusters, first epoch", "cluster_accuracy_last": "clusters, last epoch",
}

Driver = Callable[[RunConfig], tuple[RunSummary, Optional[Path]]]


# -- the runs ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrueLabels:
    """What only the benchmark holds: every node's label, and B's labelled training nodes of the run."""

    labels: np.ndarray  # int64 [N]
    private_ids: np.ndarray  # int64: B's training split, the labels label privacy protects


@functools.lru_cache(maxsize=8)
def _labels_of(dataset: str, split_seed: int, label_independent: bool) -> TrueLabels:
    part = load_label_part(resolve_dataset(dataset))
    split = split_for(part, split_seed, label_independent=label_independent)
    return TrueLabels(part.labels.astype(np.int64), split.train)


def true_labels(config: RunConfig) -> TrueLabels:
    """The run's truth, with B's split as B makes it: label-independent under label privacy."""
    return _labels_of(config.dataset, config.split_seed, config.label_privacy.mode != "none")


def dataset_label(dataset: str) -> str:
    return Path(dataset).stem if dataset.endswith(".npz") else dataset


def format_epsilon(epsilon: float) -> str:
    return "∞" if math.isinf(epsilon) else f"{epsilon:g}"


class LabelRow(BaseModel):
    """One finished run of the table, with the attacks' scores on its recorded gradients."""

    dataset: str
    mode: str
    label_epsilon: float
    seed: int
    status: str
    message: str = ""
    run_id: str = ""
    extractor: str = ""
    metric: str = ""
    test: float | None = None
    val: float | None = None
    label_epsilon_spent: float | None = None
    label_delta: float | None = None
    label_note: str = ""
    edge_epsilon_spent: float = 0.0
    task: str = ""
    num_classes: int = 0
    gradient_rows: int = 0
    private_rows: int = 0
    positives: int | None = None
    norm_auc_first: float | None = None
    norm_auc_last: float | None = None
    direction_auc_first: float | None = None
    direction_auc_last: float | None = None
    cluster_accuracy_first: float | None = None
    cluster_accuracy_last: float | None = None
    chance: float | None = None
    matched_chance: float | None = None
    ceiling: float | None = None
    seconds: float = 0.0

    @property
    def key(self) -> tuple[str, str, float, int]:
        return (self.dataset, self.mode, self.label_epsilon, self.seed)


def planned_cells(modes: Sequence[str], epsilons: Sequence[float], seeds: int) -> list[tuple[str, float, int]]:
    """(mode, label ε, seed) of every run: ε = ∞ once per seed as mode none, then each mode at each finite ε."""
    reference = [("none", math.inf, s) for s in range(seeds)] if any(math.isinf(e) for e in epsilons) else []
    finite = [e for e in epsilons if math.isfinite(e)]
    return reference + [(mode, epsilon, seed) for mode in modes for epsilon in finite for seed in range(seeds)]


def cell_config(
    base: RunConfig, dataset: str, mode: str, epsilon: float, seed: int, pate_extractor: str | None = None
) -> RunConfig:
    """``base`` with the cell's dataset, seed, label privacy and ``record_gradients``; pate swaps the extractor."""
    data = base.model_dump(mode="json")
    data.update({"dataset": dataset, "seed": seed, "record_gradients": True})
    data["label_privacy"].update({"mode": mode, "epsilon": epsilon})
    if mode == "pate" and pate_extractor:
        data["extractor"].update({"name": pate_extractor, "params": {}})
    return with_published_edge_bound(RunConfig.model_validate(data))


def _ceiling(summary: RunSummary, mode: str, epsilon: float, labels: np.ndarray, num_classes: int) -> float | None:
    """What label DP at the ledger's (ε, δ) lets any attack reach (docs/label-leakage.md, eqs. C3, C5)."""
    from vesper.party_a.label_attack import accuracy_ceiling, auc_ceiling

    if mode == "none":
        return None
    spent = summary.label_epsilon_spent if summary.label_epsilon_spent is not None else epsilon
    delta = summary.label_delta or 0.0
    if num_classes == 2:
        return auc_ceiling(spent, delta)
    prior = np.bincount(labels, minlength=num_classes) / labels.size
    return accuracy_ceiling(spent, prior, delta)


def attack_columns(recorded: RecordedGradients, truth: TrueLabels, seed: int) -> dict[str, object]:
    """The attacks on the rows of B's labelled training nodes, on the first- and the last-epoch gradients."""
    from vesper.party_a.label_attack import evaluate_attack

    private = np.isin(recorded.node_ids, truth.private_ids)
    columns: dict[str, object] = {
        "gradient_rows": recorded.nodes, "private_rows": int(private.sum()), "num_classes": recorded.num_classes,
        "task": "binary" if recorded.num_classes == 2 else "multiclass",
    }
    views = [("last", recorded.gradients, np.ones(recorded.nodes, dtype=bool))]
    if recorded.first_gradients is not None:
        views.append(("first", recorded.first_gradients, recorded.first_recorded))
    for epoch, gradients, present in views:
        attacked = private & present
        if not attacked.any():
            continue
        ids = recorded.node_ids[attacked]
        report = evaluate_attack(ids, gradients[attacked], truth.labels[ids], recorded.num_classes, seed)
        if report.task == "binary":
            columns[f"norm_auc_{epoch}"], columns[f"direction_auc_{epoch}"] = report.norm_auc, report.direction_auc
            if epoch == "last":
                columns["positives"] = int(truth.labels[ids].sum())
        else:
            columns[f"cluster_accuracy_{epoch}"] = report.cluster_accuracy
            columns["matched_chance"] = report.matched_chance
        columns["chance"] = report.chance
    return columns


def row_of(
    summary: RunSummary, gradients_path: Path | None, config: RunConfig, truth: TrueLabels
) -> LabelRow:
    """The run's row: its summary, and the attacks on its recorded gradients."""
    from vesper.party_a.label_attack import RecordedGradientsError, load_recorded

    mode, epsilon = config.label_privacy.mode, config.label_privacy.epsilon
    row = LabelRow(
        dataset=dataset_label(config.dataset), mode=mode, label_epsilon=epsilon, seed=config.seed,
        status=summary.status, run_id=summary.run_id, extractor=summary.extractor,
        message=summary.message if summary.status != "completed" else "",
        metric=summary.test_metric.name if summary.test_metric else "",
        test=summary.test_metric.value if summary.test_metric else None,
        val=summary.val_metric.value if summary.val_metric else None,
        label_epsilon_spent=summary.label_epsilon_spent, label_delta=summary.label_delta,
        label_note=summary.label_note, edge_epsilon_spent=summary.epsilon_spent, seconds=summary.seconds,
    )
    if summary.status != "completed":
        return row
    if gradients_path is None or not Path(gradients_path).is_file():
        if mode == "pate":  # A writes no file when no query was answered: no gradient reached it at all
            return row
        return row.model_copy(update={
            "status": "no-gradients",
            "message": "party A recorded no gradients for this run (record_gradients needs a party A that writes them)",
        })
    try:
        recorded = load_recorded(Path(gradients_path))
        columns = attack_columns(recorded, truth, config.seed)
    except (RecordedGradientsError, ValueError) as exc:
        return row.model_copy(update={"status": "attack-failed", "message": str(exc)})
    if columns["private_rows"]:
        attacked = truth.labels[recorded.node_ids[np.isin(recorded.node_ids, truth.private_ids)]]
        columns["ceiling"] = _ceiling(summary, mode, epsilon, attacked, recorded.num_classes)
    return row.model_copy(update=columns)


def read_rows(path: Path) -> list[LabelRow]:
    if not path.exists():
        return []
    optional = {name for name, field in LabelRow.model_fields.items() if not field.is_required() and field.default is None}
    with path.open(newline="") as handle:
        return [
            LabelRow.model_validate({k: (None if v == "" and k in optional else v) for k, v in row.items()})
            for row in csv.DictReader(handle)
        ]


def _write_rows(path: Path, rows: Sequence[LabelRow], mode: str) -> None:
    with path.open(mode, newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(LabelRow.model_fields))
        if mode == "w":
            writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.model_dump().items()})


def append_row(path: Path, row: LabelRow) -> None:
    """Append one row; a file written with other columns (an older version) is rewritten first."""
    if not path.exists():
        _write_rows(path, [row], "w")
        return
    with path.open(newline="") as handle:
        header = next(csv.reader(handle), [])
    if header != list(LabelRow.model_fields):
        _write_rows(path, [*read_rows(path), row], "w")
        return
    _write_rows(path, [row], "a")


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


# -- the cells ----------------------------------------------------------------------------------
def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


class LabelCell(BaseModel):
    """The completed runs of one (mode, label ε); mode none is the ε = ∞ row."""

    mode: str
    label_epsilon: float
    runs: int
    task: str
    num_classes: int
    metric: str
    tests: list[float]
    attacks: dict[str, list[float]]
    label_epsilon_spent: float | None
    label_delta: float | None
    gradient_rows: list[int]
    private_rows: list[int]
    positives: list[int]
    chance: float | None
    matched_chance: float | None
    ceiling: float | None
    note: str

    @property
    def test(self) -> tuple[float, float] | None:
        return _mean_std(self.tests) if self.tests else None

    @property
    def reaches_a(self) -> bool:
        """Whether any gradient of one of B's labelled training nodes reached A in this cell."""
        return any(self.private_rows)

    def headline(self) -> tuple[float, float, str] | None:
        """(mean, std, column): the attack column of largest mean (the rule of the module docstring)."""
        scored = [(*_mean_std(values), name) for name, values in self.attacks.items() if values]
        return max(scored, key=lambda item: item[0]) if scored else None

    def standard_error(self, column: str, at: float) -> float:
        """Of the column's mean, if the runs' expectation were ``at``: the larger of the
        spread over seeds and a bound on each run's own sampling error at ``at``.

        With few seeds the spread over seeds is itself noisy (three runs at AUC 1.000 have
        none); each run's AUC (``auc_standard_error``, a variance bound) or accuracy
        (binomial) over its attacked nodes bounds it from the other side.
        """
        from vesper.party_a.label_attack import accuracy_standard_error, auc_standard_error

        values = self.attacks[column]
        runs = len(values)
        spread = statistics.variance(values) / runs if runs > 1 else 0.0
        nodes = [n for n in self.private_rows if n]
        if self.task == "binary" and self.positives and nodes:
            sampling = [auc_standard_error(at, p, n - p) ** 2 for p, n in zip(self.positives, nodes, strict=False)
                        if 0 < p < n]
        else:
            sampling = [accuracy_standard_error(at, n) ** 2 for n in nodes]
        own = sum(sampling) / len(sampling) / runs if sampling else 0.0
        return math.sqrt(max(spread, own))

    def above_ceiling(self) -> bool:
        """Headline mean above the DP ceiling by more than ``CEILING_MARGIN`` standard errors
        at the ceiling (the null hypothesis: the attack's expectation sits exactly on it).

        Three, not two: the headline is the largest of up to four column means.
        """
        top = self.headline()
        if top is None or self.ceiling is None:
            return False
        return top[0] - CEILING_MARGIN * self.standard_error(top[2], self.ceiling) > self.ceiling


def cell_of(rows: Sequence[LabelRow], mode: str, epsilon: float) -> LabelCell | None:
    members = [r for r in rows if r.status == "completed" and r.mode == mode and r.label_epsilon == epsilon]
    if not members:
        return None
    task = next((r.task for r in members if r.task), "")
    columns = BINARY_COLUMNS if task == "binary" else MULTICLASS_COLUMNS
    spent = [r.label_epsilon_spent for r in members if r.label_epsilon_spent is not None]
    ceilings = [r.ceiling for r in members if r.ceiling is not None]
    matched = [r.matched_chance for r in members if r.matched_chance is not None]
    chances = [r.chance for r in members if r.chance is not None]
    return LabelCell(
        mode=mode, label_epsilon=epsilon, runs=len(members), task=task,
        num_classes=max(r.num_classes for r in members),
        metric=next((r.metric for r in members if r.metric), ""),
        tests=[r.test for r in members if r.test is not None],
        attacks={c: [getattr(r, c) for r in members if getattr(r, c) is not None] for c in columns},
        label_epsilon_spent=max(spent) if spent else None,
        label_delta=next((r.label_delta for r in members if r.label_delta is not None), None),
        gradient_rows=[r.gradient_rows for r in members], private_rows=[r.private_rows for r in members],
        positives=[r.positives for r in members if r.positives is not None],
        chance=statistics.fmean(chances) if chances else None,
        matched_chance=statistics.fmean(matched) if matched else None,
        ceiling=max(ceilings) if ceilings else None,
        note=next((r.label_note for r in members if r.label_note), ""),
    )


def cell_at(rows: Sequence[LabelRow], mode: str, epsilon: float) -> LabelCell | None:
    """The cell shown at (mode, ε): the ε = ∞ row is the mode-none runs in every mode's column."""
    return cell_of(rows, "none", math.inf) if math.isinf(epsilon) else cell_of(rows, mode, epsilon)


# -- the report ---------------------------------------------------------------------------------
def _pm(values: tuple[float, float] | None, digits: int = 3) -> str:
    return "—" if values is None else f"{values[0]:.{digits}f} ± {values[1]:.{digits}f}"


def _count(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}–{high}"


def attack_text(cell: LabelCell) -> str:
    """The attack entry of a cell: mean ± std of its headline, or why there is no number."""
    if not cell.reaches_a:
        return f"{NO_PRIVATE_GRADIENT} (0 of {_count(cell.gradient_rows)} gradient rows)"
    top = cell.headline()
    if top is None:
        return "—"
    text = f"{top[0]:.3f} ± {top[1]:.3f}"
    if cell.ceiling is not None:
        text += f" (ceiling {cell.ceiling:.4f}{f', {ABOVE_MARK}' if cell.above_ceiling() else ''})"
    return text


def _spent(cell: LabelCell | None) -> str:
    if cell is None or cell.label_epsilon_spent is None:
        return "—"
    delta = f" (δ {cell.label_delta:.2g})" if cell.label_delta else ""
    return f"{cell.label_epsilon_spent:.4g}{delta}"


@dataclass(frozen=True)
class TableContext:
    """What results.md states about how the table was made."""

    command: str
    dataset: str
    extractor: str
    pate_extractor: str
    epochs: int
    edge_epsilon: float
    seeds: int


def markdown(rows: Sequence[LabelRow], epsilons: Sequence[float], modes: Sequence[str], context: TableContext) -> str:
    reference = cell_of(rows, "none", math.inf)
    any_cell = reference or next(
        (c for m in modes for e in epsilons if (c := cell_at(rows, m, e)) is not None), None
    )
    task = any_cell.task if any_cell else ""
    metric = any_cell.metric if any_cell else ""
    ordered = sorted(epsilons, key=lambda e: (math.isinf(e), e))
    lines = [
        f"# Label leakage against party B's label ε: {context.dataset}",
        "",
        f"Generated by `{context.command}`. Dataset {context.dataset} ({_task_text(task, any_cell)}, test {metric or '—'}); "
        f"A's extractor {context.extractor}" + (f" (pate cells: {context.pate_extractor}, a frozen encoder trained "
        "without B's labels)" if "pate" in modes else "")
        + f"; {context.epochs} epochs; edge ε = {format_epsilon(context.edge_epsilon)} (A's budget; it does not "
        f"enter B's label guarantee); {context.seeds} seeds per cell. Every run went through the three services on "
        "loopback. Party A recorded the gradients B returned in the first and the last epoch, and the attacks "
        "of `party_a/label_attack.py` read nothing else; they are scored against B's true training labels, "
        "which only this benchmark holds (docs/label-leakage.md). The ε = ∞ row is the same runs without "
        "label privacy (mode none) in every column.",
        "",
        _headline_rule(task, any_cell),
        "",
    ]
    header = " | ".join(f"{m}: attack | {m}: test {metric} | {m}: label ε spent" for m in modes)
    lines += [f"| label ε | {header} |", "|---|" + "---|---|---|" * len(modes)]
    for epsilon in ordered:
        entries = []
        for mode in modes:
            cell = cell_at(rows, mode, epsilon)
            if cell is None:
                entries += ["—", "—", "—"]
                continue
            entries += [attack_text(cell), _pm(cell.test, 4), "—" if math.isinf(epsilon) else _spent(cell)]
        lines.append(f"| {format_epsilon(epsilon)} | " + " | ".join(entries) + " |")
    lines.append("")
    for mode in modes:
        lines += _details(rows, mode, ordered, task, metric)
    lines += ["## Reading", ""]
    lines += [f"- **{mode}:** {_reading(rows, mode, ordered, task, metric)}" for mode in modes]
    lines.append("")
    failed = [r for r in rows if r.status != "completed"]
    if failed:
        lines += ["## Runs that did not complete", ""]
        lines += [
            f"- {r.mode} · label ε={format_epsilon(r.label_epsilon)} · seed {r.seed}: {r.status}: {r.message}"
            for r in failed
        ]
        lines.append("")
    return "\n".join(lines)


def _task_text(task: str, cell: LabelCell | None) -> str:
    if task == "binary":
        return "binary"
    if task == "multiclass":
        return "multi-class" + (f", {cell.num_classes} classes" if cell is not None and cell.num_classes else "")
    return "task unknown: no completed run recorded gradients"


def _headline_rule(task: str, cell: LabelCell | None) -> str:
    if task == "binary":
        return (
            "Attack = the largest of the four mean ROC-AUCs of the norm and the direction attack on the first- and "
            "the last-epoch gradients (chance 0.5), a rule fixed before any run. Picking the best attack needs the "
            "labels, so the headline bounds from above what A itself could do. Ceiling = the largest AUC any test "
            "can reach on a release that is (ε, δ)-DP for one label, at the ledger's ε and δ "
            "(docs/label-leakage.md, eq. C3); it binds when the attack's scores carry no other information about "
            f"the labels (section 4.3). {ABOVE_MARK}: the mean exceeds it by more than {CEILING_MARGIN:g} standard "
            "errors at the ceiling (the larger of the spread over seeds and a bound on each run's own sampling "
            "error, AUC(1 − AUC)/min(n₊, n₋)); three because the headline is a maximum of four means."
        )
    if task == "multiclass":
        chance = "" if cell is None or cell.chance is None else f" (majority class {cell.chance:.3f}"
        if chance and cell is not None and cell.matched_chance is not None:
            chance += f", the same clusters against permuted labels {cell.matched_chance:.3f})"
        elif chance:
            chance += ")"
        return (
            "Attack = the larger of the two mean cluster accuracies (k-means on the first- and the last-epoch "
            "unit gradients), each with the best one-to-one matching of clusters to classes — chosen with the "
            f"labels, so an upper bound on an attacker without them{chance}. Ceiling = the largest accuracy of any "
            "estimator of a label from an (ε, δ)-DP release, with the attacked nodes' class shares as prior "
            "(docs/label-leakage.md, eq. C5)."
        )
    return "No completed run recorded gradients of B's labelled training nodes."


def _details(rows: Sequence[LabelRow], mode: str, ordered: Sequence[float], task: str, metric: str) -> list[str]:
    columns = BINARY_COLUMNS if task == "binary" else MULTICLASS_COLUMNS
    names = " | ".join(COLUMN_NAMES[c] for c in columns)
    lines = [
        f"## {mode}: {MODE_NAMES[mode]}, every attack column", "",
        f"| label ε | runs | gradient rows at A | of B's training nodes | {names} | ceiling | test {metric} | label ε spent | B's note |",
        "|---|---|---|---|" + "---|" * len(columns) + "---|---|---|---|",
    ]
    for epsilon in ordered:
        cell = cell_at(rows, mode, epsilon)
        if cell is None:
            continue
        attacks = [_pm(_mean_std(cell.attacks[c])) if cell.attacks.get(c) else "—" for c in columns]
        ceiling = "—" if cell.ceiling is None else f"{cell.ceiling:.4f}"
        lines.append(
            f"| {format_epsilon(epsilon)} | {cell.runs} | {_count(cell.gradient_rows)} | {_count(cell.private_rows)} | "
            + " | ".join(attacks)
            + f" | {ceiling} | {_pm(cell.test, 4)} | {'—' if math.isinf(epsilon) else _spent(cell)} | {cell.note or '—'} |"
        )
    lines.append("")
    return lines


def _reading(rows: Sequence[LabelRow], mode: str, ordered: Sequence[float], task: str, metric: str) -> str:
    """One paragraph per mode, every number taken from the cells."""
    reference = cell_of(rows, "none", math.inf)
    finite = [(e, c) for e in ordered if math.isfinite(e) and (c := cell_of(rows, mode, e)) is not None]
    if not finite:
        return "no completed run."
    parts: list[str] = []
    measure = "ROC-AUC" if task == "binary" else "matched cluster accuracy"
    chance = 0.5 if task == "binary" else (reference.matched_chance if reference and reference.matched_chance else None)
    top_ref = reference.headline() if reference is not None and reference.reaches_a else None
    if top_ref is not None:
        parts.append(
            f"without label privacy the best attack reaches a {measure} of {top_ref[0]:.3f} "
            f"({COLUMN_NAMES[top_ref[2]]})" + (f", chance {chance:.3f}" if chance is not None else "")
        )
    reached = [(e, c) for e, c in finite if c.reaches_a]
    unreached = [(e, c) for e, c in finite if not c.reaches_a]
    if reached:
        values = [(e, c.headline()) for e, c in reached]
        described = ", ".join(f"{top[0]:.3f} at ε = {format_epsilon(e)}" for e, top in values if top is not None)
        parts.append(f"with {MODE_NAMES[mode]} it is {described}")
        means = [top[0] for _, top in values if top is not None]
        if len(means) > 1:
            falling = all(a <= b for a, b in zip(means, means[1:], strict=False))
            parts.append("it grows with ε at every step" if falling else "it does not grow monotonically with ε")
        above = [format_epsilon(e) for e, c in reached if c.above_ceiling()]
        with_ceiling = [c for _, c in reached if c.ceiling is not None]
        if above:
            parts.append(
                f"at ε = {', '.join(above)} the attack exceeds the DP ceiling: either the scores use what A's own "
                "embeddings say about the labels (no label DP can remove that; docs/label-leakage.md, section 4.3) "
                "or B's mechanism is weaker than its ledger says"
            )
        elif with_ceiling:
            parts.append(f"no cell exceeds its DP ceiling by more than {CEILING_MARGIN:g} standard errors")
    if unreached:
        answered = sorted({n for _, c in unreached for n in c.gradient_rows})
        parts.append(
            f"at ε = {', '.join(format_epsilon(e) for e, _ in unreached)} {NO_PRIVATE_GRADIENT}: its gradients "
            f"are for {_count(answered) if answered else 'no'} answered query node(s), none of them one of B's labelled "
            "training nodes, so the gradient attacks have nothing of the private labels to read; the labels' "
            "protection is the ledger's ε alone"
        )
    tests = [(e, c.test) for e, c in finite if c.test is not None]
    if tests:
        described = ", ".join(f"{t[0]:.4f} at ε = {format_epsilon(e)}" for e, t in tests)
        if reference is not None and reference.test is not None:
            parts.append(f"test {metric}: {described}, against {reference.test[0]:.4f} without label privacy")
        else:
            parts.append(f"test {metric}: {described}")
    return "; ".join(parts) + "."


def plot(rows: Sequence[LabelRow], epsilons: Sequence[float], modes: Sequence[str], path: Path) -> None:
    """Attack headline and test metric against label ε, a line per mode, mode none as dashed references."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = sorted(e for e in epsilons if math.isfinite(e))
    if not finite:
        return
    reference = cell_of(rows, "none", math.inf)
    task = next((r.task for r in rows if r.task), "")
    metric = next((r.metric for r in rows if r.metric), "")
    figure, (attack_axis, test_axis) = plt.subplots(1, 2, figsize=(11, 4), dpi=120)
    colours = {"rr": "tab:blue", "pate": "tab:orange"}
    for mode in modes:
        cells = [(e, c) for e in finite if (c := cell_of(rows, mode, e)) is not None]
        reached = [(e, c.headline()) for e, c in cells if c.reaches_a and c.headline() is not None]
        if reached:
            attack_axis.errorbar([e for e, _ in reached], [t[0] for _, t in reached], yerr=[t[1] for _, t in reached],
                                 marker="o", capsize=3, color=colours.get(mode), label=mode)
        elif cells:
            attack_axis.plot([], [], " ", label=f"{mode}: {NO_PRIVATE_GRADIENT}")
        ceilings = [(e, c.ceiling) for e, c in cells if c.ceiling is not None]
        if ceilings:
            attack_axis.plot([e for e, _ in ceilings], [v for _, v in ceilings], linestyle=":", marker="x",
                             color=colours.get(mode), label=f"{mode}: DP ceiling")
        tests = [(e, c.test) for e, c in cells if c.test is not None]
        if tests:
            test_axis.errorbar([e for e, _ in tests], [t[0] for _, t in tests], yerr=[t[1] for _, t in tests],
                               marker="o", capsize=3, color=colours.get(mode), label=mode)
    if reference is not None:
        top = reference.headline()
        if top is not None:
            attack_axis.axhline(top[0], color="black", linestyle="--", label="no label privacy (ε = ∞)")
        if reference.test is not None:
            test_axis.axhline(reference.test[0], color="black", linestyle="--", label="no label privacy (ε = ∞)")
    chance = 0.5 if task == "binary" else (reference.matched_chance if reference is not None else None)
    if chance is not None:
        attack_axis.axhline(chance, color="grey", linestyle="-.", label="chance")
    for axis in (attack_axis, test_axis):
        axis.set_xscale("log", base=2)
        axis.set_xticks(finite, [f"{e:g}" for e in finite])
        axis.set_xlabel("B's label ε")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    attack_axis.set_ylabel("attack ROC-AUC (headline)" if task == "binary" else "attack matched accuracy (headline)")
    test_axis.set_ylabel(f"test {metric}")
    dataset = rows[0].dataset if rows else ""
    attack_axis.set_title(f"{dataset}: what A infers from B's gradients", fontsize=10)
    test_axis.set_title(f"{dataset}: what B's model is worth", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


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
