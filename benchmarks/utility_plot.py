"""OUT/plots/utility-<decoder>.png of ``vesper bench utility``, in the style of VESPER's Figure 2."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vesper.benchmarks.extractor_sweep import HIDDEN, Traits, registry_traits, served_cell
from vesper.benchmarks.extractor_table import TableRow
from vesper.benchmarks.utility_options import UtilityOptions
from vesper.benchmarks.utility_report import SERVED_MARK, stands_in
from vesper.benchmarks.utility_runs import UtilityRun

# matplotlib is imported where it is used: the CLI imports this module (through utility_bench)
# to register the command.


def plot(run: UtilityRun, options: UtilityOptions, out_dir: Path, traits: Traits = registry_traits) -> list[Path]:
    """A figure per decoder, a panel per (dataset, accounting) as in VESPER's Figure 2: metric
    against ε on a log2 axis with std error bars per extractor, every extractor that reads no
    edge as a dashed horizontal line, and each extractor's ε = ∞ value as a hollow marker at
    the right edge (tick "∞")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [e for e in options.epsilons if math.isfinite(e)]
    has_inf = any(math.isinf(e) for e in options.epsilons)
    if not run.datasets or not (finite or has_inf):
        return []
    x_inf = 2 * max(finite) if finite else 1.0
    colours = {name: f"C{i % 10}" for i, name in enumerate(options.extractors)}
    written = []
    for decoder in options.decoders:
        if not any(r.decoder == decoder and r.status == "completed" for r in run.rows):
            continue
        n_rows, n_cols = len(run.datasets), len(options.accountings)
        figure, axes = plt.subplots(n_rows, n_cols, figsize=(5.2 * n_cols, 3.9 * n_rows), dpi=110, squeeze=False)
        for i, dataset in enumerate(run.datasets):
            metric = next((r.metric for r in run.rows if r.dataset == dataset.label and r.metric), "metric")
            for j, accounting in enumerate(options.accountings):
                axis = axes[i][j]
                for extractor in options.extractors:
                    _draw(axis, run.rows, dataset.label, extractor, decoder, accounting, finite, has_inf, x_inf,
                          colours[extractor], traits)
                axis.set_xscale("log", base=2)
                ticks = [*finite, *([x_inf] if has_inf else [])]
                axis.set_xticks(ticks, [*(f"{e:g}" for e in finite), *(["∞"] if has_inf else [])])
                axis.set_xlabel("ε (budget)")
                axis.set_ylabel(f"test {metric}")
                caveat = " — the paper's accounting, not a guarantee" if accounting == HIDDEN else ""
                axis.set_title(f"{dataset.label} · {accounting}{caveat}", fontsize=9)
                axis.grid(alpha=0.3)
                if axis.has_data():
                    axis.legend(fontsize=7)
        figure.suptitle(f"vesper bench utility · decoder {decoder}", fontsize=10)
        figure.tight_layout()
        path = out_dir / f"utility-{decoder}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written


def _draw(axis: Any, rows: Sequence[TableRow], label: str, extractor: str, decoder: str, accounting: str,
          finite: Sequence[float], has_inf: bool, x_inf: float, colour: str, traits: Traits) -> None:
    found = traits(extractor)
    if found.reads_no_edges:
        cell = served_cell(rows, label, extractor, decoder, accounting, (finite or [math.inf])[0], traits)
        if cell is not None:
            axis.axhline(cell.mean, color="black" if extractor == "mlp" else colour, linestyle="--",
                         label=f"{extractor} (no edges)")
            axis.axhspan(cell.mean - cell.std, cell.mean + cell.std, color="grey", alpha=0.15)
        return
    points = [(e, c) for e in finite if (c := served_cell(rows, label, extractor, decoder, accounting, e, traits))]
    if points:
        served = f" ({SERVED_MARK} {found.run_accounting})" if stands_in(found, accounting, points[0][0]) else ""
        axis.errorbar([e for e, _ in points], [c.mean for _, c in points], yerr=[c.std for _, c in points],
                      marker="o", capsize=3, color=colour, label=extractor + served)
    top = served_cell(rows, label, extractor, decoder, accounting, math.inf, traits) if has_inf else None
    if top is not None:
        axis.errorbar([x_inf], [top.mean], yerr=[top.std], marker="D", markerfacecolor="none", capsize=3,
                      color=colour, linestyle="none", label=None if points else f"{extractor} (ε = ∞)")
