"""``vesper bench extractors`` over several budgets: one table per dataset, a column per ε.

The cells, the CSV and resuming are those of :mod:`extractor_table` (a row per finished
run, keyed by dataset, extractor, seed, ε and accounting). Two things are particular to
a sweep:

* an extractor that reads no edge (cost model ``none``, e.g. the MLP) releases nothing
  that depends on ε: its runs at one budget *are* its runs at every budget, so each seed
  runs once and the row is shown in every column (the report says so);
* ``jobs`` > 1 runs cells concurrently, each worker driving its own set of services, so
  a sweep on a 2-core machine uses both cores. Rows are appended under a lock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from rich.console import Console

from vesper.common.config import RunConfig, RunSummary
from vesper.coordinator.extractor_table import (
    RECIPES,
    Cell,
    TableRow,
    append_row,
    cells,
    dataset_label,
    gap_in_stds,
    read_rows,
    row_of,
    run_config,
)
from vesper.coordinator.worker_pool import run_cells

Drive = Callable[[RunConfig], RunSummary]


def reads_no_edges(extractor: str) -> bool:
    """Whether the extractor's releases cannot depend on ε (looked up in the local registry)."""
    try:
        from vesper.party_a.extractors.registry import lookup

        return lookup(extractor).spec.cost_model == "none"
    except Exception:  # noqa: BLE001 — not installed here: run it at every ε, the safe choice
        return False


def with_budget(base: RunConfig, epsilon: float) -> RunConfig:
    data = base.model_dump(mode="json")
    data["privacy"]["epsilon"] = epsilon
    return RunConfig.model_validate(data)


def planned_cells(
    epsilons: Sequence[float], datasets: Iterable[str], extractors: Iterable[str], seeds: int,
    epsilon_free: Callable[[str], bool],
) -> list[tuple[float, str, str, int]]:
    """(ε, dataset, extractor, seed) of every run the sweep needs; ε-free extractors run at the first ε."""
    planned = []
    for dataset in datasets:
        for extractor in extractors:
            budgets = epsilons[:1] if epsilon_free(extractor) else epsilons
            for epsilon in budgets:
                planned += [(epsilon, dataset, extractor, seed) for seed in range(seeds)]
    return planned


def run_sweep(
    base: RunConfig, epsilons: Sequence[float], datasets: Sequence[str], extractors: Sequence[str], seeds: int,
    out_dir: Path, drivers: Sequence[Drive], console: Console,
    epsilon_free: Callable[[str], bool] = reads_no_edges,
) -> list[TableRow]:
    """Run every missing cell, ``len(drivers)`` at a time; return the sweep's rows (ε-free rows once)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "results.csv"
    accounting = base.privacy.accounting
    done: dict[tuple, TableRow] = {}
    for row in read_rows(csv_path):
        if row.status == "completed":
            done[row.key] = row
            if epsilon_free(row.extractor):  # one completed seed serves every budget
                done.setdefault((row.dataset, row.extractor, row.seed, "any", row.accounting), row)
    rows: list[TableRow] = []
    missing: list[tuple[float, str, str, int]] = []
    for epsilon, dataset, extractor, seed in planned_cells(epsilons, datasets, extractors, seeds, epsilon_free):
        label = dataset_label(dataset)
        found = done.get((label, extractor, seed, epsilon, accounting))
        if found is None and epsilon_free(extractor):
            found = done.get((label, extractor, seed, "any", accounting))
        if found is not None:
            rows.append(found)
        else:
            missing.append((epsilon, dataset, extractor, seed))

    def run(drive: Drive, cell: tuple[float, str, str, int]) -> TableRow:
        epsilon, dataset, extractor, seed = cell
        return row_of(drive(run_config(with_budget(base, epsilon), dataset, extractor, seed)), dataset, seed)

    rows += run_cells(
        missing, drivers, run, lambda row: append_row(csv_path, row),
        lambda cell: f"ε={cell[0]:g} · {dataset_label(cell[1])} · {cell[2]} · seed {cell[3]}", console,
    )
    return rows


# -- the report ------------------------------------------------------------------------------
def _cell_at(rows: list[TableRow], dataset: str, extractor: str, epsilon: float, free: bool) -> Cell | None:
    members = [r for r in rows if r.dataset == dataset and r.extractor == extractor and (free or r.epsilon_budget == epsilon)]
    found = cells(members)
    return found[0] if found else None


def _format_eps(epsilon: float) -> str:
    return "∞" if math.isinf(epsilon) else f"{epsilon:g}"


def markdown(
    rows: list[TableRow], base: RunConfig, epsilons: Sequence[float], seeds: int, command: str,
    epsilon_free: Callable[[str], bool] = reads_no_edges,
) -> str:
    extractors = list(dict.fromkeys(r.extractor for r in rows))
    datasets = list(dict.fromkeys(r.dataset for r in rows))
    free = [e for e in extractors if epsilon_free(e)]
    lines = [
        f"# Extractors side by side at ε ∈ {{{', '.join(_format_eps(e) for e in epsilons)}}} ({base.privacy.accounting})",
        "",
        f"Generated by `{command}`: {seeds} seeds per cell, every run through the three services on loopback "
        "and charged by the accountant. Each cell is test mean ± std over seeds, then the gap to the MLP in "
        "pooled standard deviations of the two samples. ε spent is the largest any seed's ledger reached at "
        "that budget. Each extractor's recipe on top of the base run "
        f"({base.epochs} epochs): "
        + "; ".join(f"{name} {RECIPES.get(name) or 'as the base'}" for name in extractors)
        + ".",
        "",
    ]
    if free:
        lines += [
            f"{', '.join(free)} read{'s' if len(free) == 1 else ''} no edge and release{'s' if len(free) == 1 else ''} "
            "nothing that depends on ε: each seed ran once and the same runs are shown in every column.",
            "",
        ]
    for dataset in datasets:
        metric = next(r.metric for r in rows if r.dataset == dataset and r.metric)
        header = " | ".join(f"ε = {_format_eps(e)}" for e in epsilons)
        lines += [
            f"## {dataset} (test {metric})", "",
            f"| extractor | privacy unit | {header} |",
            "|---|---|" + "---|" * len(epsilons),
        ]
        for extractor in extractors:
            entries = []
            unit = ""
            for epsilon in epsilons:
                cell = _cell_at(rows, dataset, extractor, epsilon, extractor in free)
                mlp = _cell_at(rows, dataset, "mlp", epsilon, "mlp" in free)
                if cell is None:
                    entries.append("—")
                    continue
                unit = cell.privacy_unit
                gap = "" if mlp is None or extractor == "mlp" else f" ({gap_in_stds(cell, mlp):+.1f} std)"
                spent = "" if extractor in free else f", ε spent {cell.epsilon_spent:.3g}"
                entries.append(f"{cell.mean:.4f} ± {cell.std:.4f}{gap}{spent}")
            lines.append(f"| {extractor} | {unit} | " + " | ".join(entries) + " |")
        lines += [""]
        for epsilon in epsilons:
            lines.append(f"- **ε = {_format_eps(epsilon)}:** {_verdict(rows, dataset, epsilon, extractors, free)}.")
        lines.append("")
    failed = [r for r in rows if r.status != "completed"]
    if failed:
        lines += ["## Runs that did not complete", ""]
        lines += [f"- ε={_format_eps(r.epsilon_budget)} · {r.dataset} · {r.extractor} · seed {r.seed}: {r.status}: {r.message}" for r in failed]
        lines.append("")
    return "\n".join(lines)


def _verdict(rows: list[TableRow], dataset: str, epsilon: float, extractors: list[str], free: list[str]) -> str:
    mlp = _cell_at(rows, dataset, "mlp", epsilon, "mlp" in free)
    graph = [c for e in extractors if e != "mlp" and (c := _cell_at(rows, dataset, e, epsilon, e in free)) is not None]
    if mlp is None or not graph:
        return "nothing to compare"
    beating = [c for c in graph if gap_in_stds(c, mlp) > 2]
    best = max(graph, key=lambda c: c.mean)
    if beating:
        return "beat the MLP by more than two pooled standard deviations: " + ", ".join(
            f"{c.extractor} ({c.mean - mlp.mean:+.4f}, {gap_in_stds(c, mlp):+.1f} std)" for c in beating
        )
    return (
        f"no extractor beats the MLP by more than two pooled standard deviations; the best is {best.extractor} "
        f"at {best.mean - mlp.mean:+.4f} ({gap_in_stds(best, mlp):+.1f} std)"
    )


def plot(
    rows: list[TableRow], epsilons: Sequence[float], path: Path,
    epsilon_free: Callable[[str], bool] = reads_no_edges,
) -> None:
    """One panel per dataset: test metric against ε, a line per extractor, the MLP as a reference line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r.dataset for r in rows))
    extractors = list(dict.fromkeys(r.extractor for r in rows))
    finite = [e for e in epsilons if math.isfinite(e)]
    if not datasets or not finite:
        return
    figure, axes = plt.subplots(1, len(datasets), figsize=(5.5 * len(datasets), 4), dpi=120, squeeze=False)
    for axis, dataset in zip(axes[0], datasets, strict=True):
        metric = next((r.metric for r in rows if r.dataset == dataset and r.metric), "")
        for extractor in extractors:
            free = epsilon_free(extractor)
            points = [(e, c) for e in finite if (c := _cell_at(rows, dataset, extractor, e, free)) is not None]
            if not points:
                continue
            if free:
                cell = points[0][1]
                axis.axhline(cell.mean, color="black" if extractor == "mlp" else "grey", linestyle="--",
                             label=f"{extractor} (no edges)")
                continue
            axis.errorbar([e for e, _ in points], [c.mean for _, c in points], yerr=[c.std for _, c in points],
                          marker="o", capsize=3, label=extractor)
        axis.set_xscale("log", base=2)
        axis.set_xticks(finite, [f"{e:g}" for e in finite])
        axis.set_xlabel("ε (budget)")
        axis.set_ylabel(f"test {metric}")
        axis.set_title(f"{dataset} ({rows[0].accounting})", fontsize=10)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
