"""The cells of ``vesper bench label-privacy``: the completed runs of one (mode, label ε), and
the headline rule fixed before any run (docs/label-leakage.md, section 3): binary, the largest
of the four mean ROC-AUCs; multi-class, the larger of the two mean matched cluster accuracies.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from pydantic import BaseModel

from vesper.benchmarks.label_privacy_rows import LabelRow

CEILING_MARGIN = 3.0  # standard errors between a headline and its DP ceiling before a cell is flagged
BINARY_COLUMNS = ("norm_auc_first", "norm_auc_last", "direction_auc_first", "direction_auc_last")
MULTICLASS_COLUMNS = ("cluster_accuracy_first", "cluster_accuracy_last")


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation over seeds (0 for a single run)."""
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
        return mean_std(self.tests) if self.tests else None

    @property
    def reaches_a(self) -> bool:
        """Whether any gradient of one of B's labelled training nodes reached A in this cell."""
        return any(self.private_rows)

    def headline(self) -> tuple[float, float, str] | None:
        """(mean, std, column): the attack column of largest mean (the rule of the module docstring)."""
        scored = [(*mean_std(values), name) for name, values in self.attacks.items() if values]
        return max(scored, key=lambda item: item[0]) if scored else None

    def standard_error(self, column: str, at: float) -> float:
        """Of the column's mean, if the runs' expectation were ``at``: the larger of the
        spread over seeds and a bound on each run's own sampling error at ``at``.

        With few seeds the spread over seeds is itself noisy (three runs at AUC 1.000 have
        none); each run's AUC (``auc_standard_error``, a variance bound) or accuracy
        (binomial) over its attacked nodes bounds it from the other side.
        """
        from vesper.auditor.label_attack import accuracy_standard_error, auc_standard_error

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
