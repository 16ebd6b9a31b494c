"""A run's ε over its releases, as a PNG (``vesper status RUN --plot FILE``)."""

from __future__ import annotations

import math
from pathlib import Path

from vesper.common.privacy.ledger import RunStatusView


def plot_epsilon(view: RunStatusView, path: Path) -> None:
    """Step plot of ε after each counted charge, with the budget as a line."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    points = [(0, 0.0)] + [(p.seq + 1, p.epsilon) for p in view.epsilon_curve]
    if view.charges > points[-1][0]:
        points.append((view.charges, points[-1][1]))  # uncounted releases after the last counted one
    x, y = zip(*points, strict=True)
    figure, axes = plt.subplots(figsize=(7, 4), dpi=120)
    finite = [v for v in y if math.isfinite(v)]
    axes.step(x, [v if math.isfinite(v) else float("nan") for v in y], where="post", label="ε spent")
    if math.isfinite(view.epsilon_budget):
        axes.axhline(view.epsilon_budget, color="tab:red", linestyle="--", label=f"budget {view.epsilon_budget:g}")
    if len(finite) < len(y):
        axes.text(0.5, 0.5, "ε = ∞ (non-private releases)", transform=axes.transAxes, ha="center")
    axes.set_xlabel("releases charged (ledger order)")
    axes.set_ylabel(f"edge-level ε at δ={view.delta:.3g}")
    axes.set_title(f"run {view.run_id}: {view.extractor}, {view.accounting}, {view.accountant}", fontsize=10)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    if view.accounting == "hidden-batch":
        figure.text(
            0.01, 0.01, "hidden-batch: assumes B cannot tell which edges a step used (no guarantee against B)",
            fontsize=7, color="tab:red",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, format="png")
    plt.close(figure)
