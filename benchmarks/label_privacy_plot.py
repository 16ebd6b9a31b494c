"""results.png of ``vesper bench label-privacy``: attack and test metric against B's label ε."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from vesper.benchmarks.label_privacy_cells import cell_of
from vesper.benchmarks.label_privacy_report import NO_PRIVATE_GRADIENT
from vesper.benchmarks.label_privacy_rows import LabelRow


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
