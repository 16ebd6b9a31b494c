"""Attack ROC-AUC against ε ([VESPER, Fig. 4]): the rows ``vesper audit`` writes, and their plot.

One ``AttackRow`` per (run, attack): the run's cell (dataset, extractor, accounting mode,
ε budget, seed), the attack (``membership`` or ``edge``, docs/audit-attacks.md), its AUC
and the ε the accountant says the run spent. ``plot_attack_auc`` draws a grid, a row of
panels per attack and a column per dataset: mean ± std over seeds against ε on a log2
axis with ∞ (no noise) at the right edge, a line per (extractor, accounting mode), the
chance level 0.5 dashed. ``mlp`` reads no edge, so its AUC is one number for every ε: a
horizontal dotted line, the level an attack reaches from the features alone.

matplotlib is imported inside ``plot_attack_auc``: the CLI imports this module.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ATTACK_TITLES = {
    "membership": "node membership inference (TFTS)",
    "edge": "edge inference from the releases",
    "edge inference": "edge inference from the releases",
}
NO_EDGE_EXTRACTOR = "mlp"
CHANCE_AUC = 0.5


class AttackRow(BaseModel):
    """One attack on one finished run (a row of the audit bench's CSV)."""

    dataset: str
    extractor: str
    accounting: str  # visible-batch | hidden-batch
    epsilon: float  # the run's budget; inf = no noise
    seed: int
    attack: str  # membership | edge (or edge inference)
    auc: float
    epsilon_spent: float  # from the accountant's ledger, never from the attack
    run_id: str


class AttackCell(BaseModel):
    """Mean ± std of one attack's AUC over the seeds of one (dataset, extractor, accounting, ε)."""

    dataset: str
    extractor: str
    accounting: str
    attack: str
    epsilon: float
    mean: float
    std: float  # sample standard deviation; 0 for a single seed
    runs: int


def attack_cells(rows: Sequence[AttackRow]) -> list[AttackCell]:
    """Rows grouped by (dataset, extractor, accounting, attack, ε), in first-seen order."""
    groups: dict[tuple[str, str, str, str, float], list[float]] = {}
    for row in rows:
        groups.setdefault((row.dataset, row.extractor, row.accounting, row.attack, row.epsilon), []).append(row.auc)
    return [
        AttackCell(
            dataset=dataset, extractor=extractor, accounting=accounting, attack=attack, epsilon=epsilon,
            mean=statistics.fmean(aucs), std=statistics.stdev(aucs) if len(aucs) > 1 else 0.0, runs=len(aucs),
        )
        for (dataset, extractor, accounting, attack, epsilon), aucs in groups.items()
    ]


def epsilon_positions(epsilons: Sequence[float]) -> dict[float, float]:
    """x position of each ε on the log2 axis: finite ε at itself, ∞ one doubling right of the
    largest finite ε (at 2 when every ε is ∞), so the no-noise runs sit at the right edge."""
    finite = sorted({e for e in epsilons if math.isfinite(e)})
    positions = {e: e for e in finite}
    if any(math.isinf(e) for e in epsilons):
        positions[math.inf] = 2.0 * finite[-1] if finite else 2.0
    return positions


def _epsilon_label(epsilon: float) -> str:
    return "∞" if math.isinf(epsilon) else f"{epsilon:g}"


def plot_attack_auc(
    rows: Sequence[AttackRow],
    path: Path,
    *,
    attacks: Sequence[str] | None = None,
    title: str | None = None,
) -> None:
    """[VESPER, Fig. 4]: attack AUC (mean ± std over seeds) against ε, a panel per (attack, dataset)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = attack_cells(rows)
    wanted = list(attacks) if attacks is not None else list(dict.fromkeys(c.attack for c in cells))
    datasets = list(dict.fromkeys(c.dataset for c in cells))
    if not cells or not wanted or not datasets:
        raise ValueError("no attack rows to plot")
    positions = epsilon_positions([c.epsilon for c in cells])
    figure, axes = plt.subplots(
        len(wanted), len(datasets), figsize=(4.6 * len(datasets), 3.6 * len(wanted)), dpi=120, squeeze=False
    )
    for row_axes, attack in zip(axes, wanted, strict=True):
        for axis, dataset in zip(row_axes, datasets, strict=True):
            _draw_panel(axis, [c for c in cells if c.attack == attack and c.dataset == dataset], positions)
            axis.set_title(f"{dataset}: {ATTACK_TITLES.get(attack, attack)}", fontsize=9)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


def _draw_panel(axis: Axes, cells: Sequence[AttackCell], positions: dict[float, float]) -> None:
    """One panel: a line per (extractor, accounting), the edge-free extractor flat, chance dashed."""
    if not cells:
        axis.text(0.5, 0.5, "no runs", ha="center", va="center", transform=axis.transAxes, color="tab:gray")
    edge_free = [c for c in cells if c.extractor == NO_EDGE_EXTRACTOR]
    if edge_free:
        # it reads no edge: every ε and accounting mode is the same mechanism, one level
        level = statistics.fmean(c.mean for c in edge_free)
        axis.axhline(level, color="tab:gray", linestyle=":", label=f"{NO_EDGE_EXTRACTOR} (reads no edge)")
    lines: dict[tuple[str, str], list[AttackCell]] = {}
    for cell in cells:
        if cell.extractor != NO_EDGE_EXTRACTOR:
            lines.setdefault((cell.extractor, cell.accounting), []).append(cell)
    for (extractor, accounting), line in lines.items():
        line = sorted(line, key=lambda c: positions[c.epsilon])
        axis.errorbar(
            [positions[c.epsilon] for c in line], [c.mean for c in line], yerr=[c.std for c in line],
            marker="o", capsize=3, label=f"{extractor}, {accounting}",
        )
    axis.axhline(CHANCE_AUC, color="black", linestyle="--", linewidth=0.8, label="chance")
    axis.set_xscale("log", base=2)
    ticks = sorted(positions.items(), key=lambda item: item[1])
    axis.set_xticks([x for _, x in ticks], [_epsilon_label(e) for e, _ in ticks])
    axis.minorticks_off()
    axis.set_xlabel("ε")
    axis.set_ylabel("attack ROC-AUC")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
