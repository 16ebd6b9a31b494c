"""The rows of ``vesper bench label-privacy``: one finished run each, scored, kept in results.csv.

What only the benchmark holds (every node's label and B's labelled training nodes,
:class:`TrueLabels`), the configuration of each planned cell, the label-free attacks of
:mod:`vesper.auditor.label_attack` scored on the gradients party A recorded, and results.csv:
a row per finished run, keyed by (dataset, mode, label ε, seed), appended as the run ends.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel

from vesper.common.config import RunConfig, RunSummary
from vesper.common.dataset_files import load_label_part, resolve_dataset
from vesper.common.splits import split_for
from vesper.coordinator.public_facts import with_published_edge_bound

if TYPE_CHECKING:
    from vesper.auditor.label_attack import RecordedGradients

# vesper.auditor.label_attack (torch, scipy) is imported where it is used: the CLI imports
# this module (through label_privacy_table) to register the command, and every `vesper` call
# would otherwise pay for torch.


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
    from vesper.auditor.label_attack import accuracy_ceiling, auc_ceiling

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
    from vesper.auditor.label_attack import evaluate_attack

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
    from vesper.auditor.label_attack import RecordedGradientsError, load_recorded

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
