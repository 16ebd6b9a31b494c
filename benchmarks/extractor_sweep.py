"""``vesper bench extractors`` over several budgets, and the grid ``vesper bench utility`` runs.

The cells, the CSV and resuming are those of :mod:`extractor_table` (a row per finished
run, keyed by dataset, extractor, decoder, seed, ε and accounting). A grid cell is
(dataset, extractor, decoder, accounting, ε, seed); several cells can be served by one
run, because some runs release nothing that depends on what differs between them:

* an extractor that reads no edge (cost model ``none``, e.g. the MLP) releases nothing
  that depends on ε or on the accounting mode: one run per (dataset, decoder, seed)
  serves every ε and both modes (the report says so);
* ε = ∞ adds no noise and charges nothing: one run per (dataset, extractor, decoder,
  seed) serves both modes. A row is trusted for this only if its summary recorded no
  noise multiplier (or 0); one that did keeps its own accounting mode;
* a one-shot extractor (GAP, DPAR-edge, relational) releases its noisy aggregates once over
  the whole graph and then trains on them: no batch B sees takes part in the release, so
  ``hidden-batch``'s sampling credit has nothing to apply to (GAP declares hidden-batch and
  charges it exactly as visible-batch), and its ``visible-batch`` run serves the
  ``hidden-batch`` cell;
* a cell whose mode the extractor does not support otherwise (e.g. HeterPoisson under
  ``hidden-batch``) is *unsupported*: not run, and reported as such.

``jobs`` > 1 runs cells concurrently, each worker driving its own set of services, so
a sweep on a 2-core machine uses both cores. Rows are appended under a lock.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel
from rich.console import Console

from vesper.benchmarks.extractor_table import (
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
from vesper.benchmarks.harness import run_cells
from vesper.common.config import RunConfig, RunSummary

Drive = Callable[[RunConfig], RunSummary]

VISIBLE = "visible-batch"
HIDDEN = "hidden-batch"
SHARED = "*"  # in a serve key: any value of this field is served by the same run


class ExtractorTraits(BaseModel):
    """What the grid needs to know of an extractor (its ``ExtractorSpec`` at party A)."""

    name: str
    privacy_unit: str = "edge"
    cost_model: str = "per-step"
    accountings: tuple[str, ...] = (VISIBLE, HIDDEN)

    @property
    def reads_no_edges(self) -> bool:
        return self.cost_model == "none"

    @property
    def accounting_free(self) -> bool:
        """Whether its releases are the same under both modes: nothing B-visible is sampled in them."""
        return self.reads_no_edges or self.cost_model == "one-shot"

    @property
    def run_accounting(self) -> str:
        """The mode its shared runs use: visible-batch, the one every extractor supports."""
        return VISIBLE if VISIBLE in self.accountings else self.accountings[0]


Traits = Callable[[str], ExtractorTraits]


@functools.lru_cache(maxsize=None)
def registry_traits(name: str) -> ExtractorTraits:
    """Traits from this machine's extractor registry; an extractor not installed here (a plugin
    at a remote party A) is run at every cell as asked, and A refuses what it cannot do.

    Cached: a lookup scans the entry points (slow: docs/performance-notes.md), and a report asks once per row and cell."""
    try:
        from vesper.party_a.extractors.registry import lookup

        spec = lookup(name).spec
    except Exception:  # noqa: BLE001 — not installed here: the safe choice is to share nothing
        return ExtractorTraits(name=name)
    return ExtractorTraits(
        name=name, privacy_unit=spec.privacy_unit, cost_model=spec.cost_model, accountings=tuple(spec.accountings)
    )


def reads_no_edges(extractor: str) -> bool:
    """Whether the extractor's releases cannot depend on ε (looked up in the local registry)."""
    return registry_traits(extractor).reads_no_edges


class GridCell(NamedTuple):
    """One cell of a grid; ``dataset`` is what the run is given (a name or an .npz path)."""

    dataset: str
    extractor: str
    decoder: str
    accounting: str
    epsilon: float
    seed: int


ServeKey = tuple[str, str, str, str, object, int]


def serve_key(
    label: str, extractor: str, decoder: str, accounting: str, epsilon: float, seed: int, traits: ExtractorTraits,
    noise_multiplier: float | None = None,
) -> ServeKey:
    """Which run serves the cell (label, extractor, decoder, accounting, ε, seed): equal keys, one run.

    ``noise_multiplier`` is a finished row's; at ε = ∞ a row with noise is not shared.
    """
    if traits.reads_no_edges:
        return (label, extractor, decoder, SHARED, SHARED, seed)
    noise_free = math.isinf(epsilon) and not noise_multiplier
    if noise_free or traits.accounting_free:
        return (label, extractor, decoder, SHARED, epsilon, seed)
    return (label, extractor, decoder, accounting, epsilon, seed)


def row_serve_key(row: TableRow, traits: Traits) -> ServeKey:
    return serve_key(
        row.dataset, row.extractor, row.decoder, row.accounting, row.epsilon_budget, row.seed,
        traits(row.extractor), row.noise_multiplier,
    )


def cell_serve_key(cell: GridCell, traits: Traits) -> ServeKey:
    return serve_key(
        dataset_label(cell.dataset), cell.extractor, cell.decoder, cell.accounting, cell.epsilon, cell.seed,
        traits(cell.extractor),
    )


def supported(cell: GridCell, traits: Traits) -> bool:
    found = traits(cell.extractor)
    return cell.accounting in found.accountings or cell_serve_key(cell, traits)[3] == SHARED


def run_of(cell: GridCell, traits: Traits) -> GridCell:
    """The cell actually run for ``cell``: a shared key runs under its extractor's ``run_accounting``."""
    if cell_serve_key(cell, traits)[3] == SHARED:
        return cell._replace(accounting=traits(cell.extractor).run_accounting)
    return cell


def grid_cells(
    datasets: Iterable[str], extractors: Iterable[str], decoders: Iterable[str], accountings: Iterable[str],
    epsilons: Iterable[float], seeds: int,
) -> list[GridCell]:
    """Every cell of the product, in report order."""
    epsilons, extractors, decoders, accountings = list(epsilons), list(extractors), list(decoders), list(accountings)
    return [
        GridCell(dataset, extractor, decoder, accounting, epsilon, seed)
        for dataset in datasets for decoder in decoders for accounting in accountings
        for extractor in extractors for epsilon in epsilons for seed in range(seeds)
    ]


class GridPlan(BaseModel):
    """The runs a grid needs: done (a completed row serves them), missing, and unsupported cells."""

    runs: list[GridCell]  # one per serve key, in the order of the cells
    done: list[TableRow]  # the completed rows that serve some of ``runs``
    missing: list[GridCell]
    unsupported: list[GridCell]


def plan_grid(cells_: Iterable[GridCell], rows: Iterable[TableRow], traits: Traits) -> GridPlan:
    """Map every cell to the run serving it, and find which runs a completed row already serves."""
    completed: dict[ServeKey, TableRow] = {}
    for row in rows:
        if row.status == "completed":
            completed.setdefault(row_serve_key(row, traits), row)
    runs: dict[ServeKey, GridCell] = {}
    unsupported: list[GridCell] = []
    for cell in cells_:
        if not supported(cell, traits):
            unsupported.append(cell)
            continue
        runs.setdefault(cell_serve_key(cell, traits), run_of(cell, traits))
    done = [completed[key] for key in runs if key in completed]
    missing = [run for key, run in runs.items() if key not in completed]
    return GridPlan(runs=list(runs.values()), done=done, missing=missing, unsupported=unsupported)


def run_grid(
    base: RunConfig, plan: GridPlan, out_dir: Path, drivers: Sequence[Drive], console: Console,
) -> list[TableRow]:
    """Run the plan's missing runs, ``len(drivers)`` at a time; every row is appended to
    out_dir/results.csv as soon as its run ends. Returns the done rows and the new ones."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "results.csv"

    def run(drive: Drive, cell: GridCell) -> TableRow:
        config = cell_run_config(base, cell)
        # the row names the cell it was run for, whatever a failed run's summary left empty
        return row_of(drive(config), cell.dataset, cell.seed).model_copy(update={
            "extractor": cell.extractor, "decoder": cell.decoder, "accounting": cell.accounting,
            "epsilon_budget": cell.epsilon,
        })

    return [*plan.done, *run_cells(
        plan.missing, drivers, run, lambda row: append_row(csv_path, row), describe_cell, console,
    )]


def describe_cell(cell: GridCell) -> str:
    return (
        f"{dataset_label(cell.dataset)} · {cell.extractor}+{cell.decoder} · {cell.accounting} · "
        f"ε={_format_eps(cell.epsilon)} · seed {cell.seed}"
    )


def served_cell(
    rows: Iterable[TableRow], label: str, extractor: str, decoder: str, accounting: str, epsilon: float,
    traits: Traits,
) -> Cell | None:
    """Mean ± std over the completed rows that serve this (dataset, extractor, decoder, accounting, ε)."""
    found = traits(extractor)
    want = serve_key(label, extractor, decoder, accounting, epsilon, 0, found)[:5]
    if not (accounting in found.accountings or want[3] == SHARED):
        return None
    by_seed: dict[int, TableRow] = {}  # a seed run twice (two tables merged) counts once
    for r in rows:
        if r.status == "completed" and row_serve_key(r, traits)[:5] == want:
            by_seed.setdefault(r.seed, r)
    grouped = cells(by_seed.values())
    return grouped[0] if grouped else None


def cell_run_config(base: RunConfig, cell: GridCell) -> RunConfig:
    """The run of ``cell``: ``base`` at the cell's budget, with its dataset, extractor (and recipe),
    seed and decoder."""
    return run_config(with_budget(base, cell.epsilon, cell.accounting), cell.dataset, cell.extractor, cell.seed,
                      cell.decoder)


def with_budget(base: RunConfig, epsilon: float, accounting: str | None = None) -> RunConfig:
    """``base`` at another ε (and accounting). Only these become set: what the base left to the
    defaults stays unset, so an extractor's recipe still counts as its own defaults (a copy
    validated from a full dump would set every field, and GAP's path would then take the run's
    d = 16 instead of the MLP baseline's 64: registry.defaults_to_apply)."""
    update: dict[str, object] = {"epsilon": epsilon}
    if accounting is not None:
        update["accounting"] = accounting
    privacy = type(base.privacy).model_validate({**base.privacy.model_dump(exclude_unset=True), **update})
    return base.model_copy(update={"privacy": privacy})


def _free_traits(epsilon_free: Callable[[str], bool] | None) -> Traits:
    if epsilon_free is None:
        return registry_traits
    return lambda name: ExtractorTraits(name=name, cost_model="none" if epsilon_free(name) else "per-step")


def planned_cells(
    epsilons: Sequence[float], datasets: Iterable[str], extractors: Iterable[str], seeds: int,
    epsilon_free: Callable[[str], bool] | None = None,
) -> list[tuple[float, str, str, int]]:
    """(ε, dataset, extractor, seed) of every run the sweep needs; ε-free extractors run at the first ε."""
    grid = grid_cells(datasets, extractors, ["concat"], [VISIBLE], epsilons, seeds)
    plan = plan_grid(grid, [], _free_traits(epsilon_free))
    return [(run.epsilon, run.dataset, run.extractor, run.seed) for run in plan.runs]


def run_sweep(
    base: RunConfig, epsilons: Sequence[float], datasets: Sequence[str], extractors: Sequence[str], seeds: int,
    out_dir: Path, drivers: Sequence[Drive], console: Console,
    epsilon_free: Callable[[str], bool] | None = None,
) -> list[TableRow]:
    """Run every missing cell at the base run's decoder and accounting, ``len(drivers)`` at a
    time; return the sweep's rows (a row serving several cells once)."""
    traits = _free_traits(epsilon_free)
    grid = grid_cells(datasets, extractors, [base.decoder.kind], [base.privacy.accounting], epsilons, seeds)
    plan = plan_grid(grid, read_rows(out_dir / "results.csv"), traits)
    return run_grid(base, plan, out_dir, drivers, console)


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
    """The sweep's report at its one decoder and accounting: a table per dataset, a column per ε."""
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
