"""``vesper bench extractors``: extractors side by side at one ε, through the real services.

Every cell is n seeds of one (dataset, extractor) run at the same budget and accounting
mode; each row of results.csv is one finished run, written as soon as it ends, so a
killed table continues where it stopped. results.md holds mean ± std per cell, the
privacy cost actually spent, and for every graph extractor its gap to the MLP in
units of the two samples' pooled standard deviation; results.png shows the same.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from rich.console import Console

from vesper.common.config import RunConfig, RunSummary
from vesper.common.dotted_settings import set_dotted
from vesper.coordinator.public_facts import with_published_edge_bound

DEFAULT_EXTRACTORS = ("mlp", "pmp-gin", "pmp-gcn", "gap", "vfgnn", "dpar-edge")

def _extractor_defaults() -> dict[str, dict[str, Any]]:
    """Each installed extractor's own run defaults (``ExtractorSpec.run_defaults``: what party A
    applies to a run that does not set them), dotted RunConfig keys."""
    from vesper.party_a.extractors.registry import installed

    return {found.name: dict(found.extractor.spec.run_defaults) for found in installed() if found.extractor is not None}


# Per-extractor recipes: each extractor's own defaults, set explicitly on every cell so that the
# reports name them (a key the command line sets explicitly still comes from the recipe). The
# measurements behind them are in each extractor's spec and docs/extractors/*.md. A benchmark
# that reproduces a paper's settings would add its own here; none does.
RECIPES: dict[str, dict[str, Any]] = _extractor_defaults()


class TableRow(BaseModel):
    """One finished run. ``decoder`` and ``noise_multiplier`` came later: a CSV without them
    reads as concat runs whose noise was not recorded."""

    dataset: str
    extractor: str
    decoder: str = "concat"
    seed: int
    epsilon_budget: float
    accounting: str
    status: str
    metric: str = ""
    test: float | None = None
    val: float | None = None
    epsilon_spent: float = 0.0
    privacy_unit: str = "edge"
    noise_multiplier: float | None = None
    seconds: float = 0.0
    run_id: str = ""
    message: str = ""
    head: str = ""  # with an edge-free path: the head B kept (graph, edge-free or combined; party_b.head_choice)

    @property
    def key(self) -> tuple[str, str, str, int, float, str]:
        return (self.dataset, self.extractor, self.decoder, self.seed, self.epsilon_budget, self.accounting)


def dataset_label(dataset: str) -> str:
    return Path(dataset).stem if dataset.endswith(".npz") else dataset


def recipe_settings(base: RunConfig, extractor: str) -> dict[str, Any]:
    """The dotted settings a benchmark cell of ``extractor`` writes over ``base``: the extractor's
    recipe (its own defaults, set here because the base's --epochs would win over them at party A)
    and the edge-free path's settings party A records with them where it applies the defaults itself
    (registry.defaults_to_apply: GAP's path keeps the MLP's d)."""
    from vesper.party_a.extractors.registry import defaults_to_apply

    given = base.model_dump(mode="json", exclude_unset=True)
    given["extractor"] = {**given.get("extractor", {}), "name": extractor}
    return defaults_to_apply(RunConfig.model_validate(given), RECIPES.get(extractor, {})).settings


def run_config(base: RunConfig, dataset: str, extractor: str, seed: int, decoder: str | None = None) -> RunConfig:
    """``base`` with the cell's dataset, extractor, its recipe (:func:`recipe_settings`), seed and
    (if given) decoder."""
    data = base.model_dump(mode="json")
    data.update({"dataset": dataset, "seed": seed})
    data["extractor"].update({"name": extractor, "params": {}})
    if decoder is not None:
        data["decoder"]["kind"] = decoder
    for dotted, value in recipe_settings(base, extractor).items():
        set_dotted(data, dotted, value)
    return with_published_edge_bound(RunConfig.model_validate(data))


_OPTIONAL = {name for name, field in TableRow.model_fields.items() if not field.is_required() and field.default is None}


def read_rows(path: Path) -> list[TableRow]:
    """Every row of a results.csv, of this version or an older one (missing columns take defaults)."""
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return [
            TableRow.model_validate({k: (None if v == "" and k in _OPTIONAL else v) for k, v in row.items()})
            for row in csv.DictReader(handle)
        ]


def drop_superseded(path: Path, rerun: Iterable[tuple]) -> None:
    """Keep only the newest row of each key in ``rerun`` (cells run again after a failure),
    so a resumed benchmark does not list the same failure once per attempt."""
    from vesper.benchmarks.harness import newest_only

    rows = read_rows(path)
    kept = newest_only(rows, rerun)
    if len(kept) != len(rows):
        _write_rows(path, kept, "w")


def _write_rows(path: Path, rows: Iterable[TableRow], mode: str) -> None:
    with path.open(mode, newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(TableRow.model_fields))
        if mode == "w":
            writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.model_dump().items()})


def append_row(path: Path, row: TableRow) -> None:
    """Append one row; a file with other columns (an older version) is rewritten first,
    so that appended values never land under another column's header."""
    if not path.exists():
        _write_rows(path, [row], "w")
        return
    with path.open(newline="") as handle:
        header = next(csv.reader(handle), [])
    if header != list(TableRow.model_fields):
        _write_rows(path, [*read_rows(path), row], "w")
        return
    _write_rows(path, [row], "a")


def row_of(summary: RunSummary, dataset: str, seed: int) -> TableRow:
    """The run's row; its cell (extractor, decoder, ε, accounting) as the summary states it."""
    return TableRow(
        dataset=dataset_label(dataset), extractor=summary.extractor, decoder=summary.decoder or "concat", seed=seed,
        epsilon_budget=summary.epsilon_budget, accounting=summary.accounting, status=summary.status,
        metric=summary.test_metric.name if summary.test_metric else "",
        test=summary.test_metric.value if summary.test_metric else None,
        val=summary.val_metric.value if summary.val_metric else None,
        epsilon_spent=summary.epsilon_spent, privacy_unit=summary.privacy_unit,
        noise_multiplier=summary.noise_multiplier, seconds=summary.seconds, run_id=summary.run_id,
        message=summary.message if summary.status != "completed" else "", head=summary.decoder_head,
    )


def run_table(
    base: RunConfig, datasets: Iterable[str], extractors: Iterable[str], seeds: int, out_dir: Path,
    drive: Callable[[RunConfig], RunSummary], console: Console,
) -> list[TableRow]:
    """Run every missing (dataset, extractor, seed) cell; return all rows of this table."""
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "results.csv"
    done = {row.key: row for row in read_rows(csv_path) if row.status == "completed"}
    rows = []
    for dataset in datasets:
        for extractor in extractors:
            for seed in range(seeds):
                key = (
                    dataset_label(dataset), extractor, base.decoder.kind, seed, base.privacy.epsilon,
                    base.privacy.accounting,
                )
                if key in done:
                    rows.append(done[key])
                    continue
                config = run_config(base, dataset, extractor, seed)
                console.print(f"{dataset_label(dataset)} · {extractor} · seed {seed}", highlight=False)
                row = row_of(drive(config), dataset, seed)
                append_row(csv_path, row)
                rows.append(row)
                if row.status != "completed":
                    console.print(f"  {row.status}: {row.message}", highlight=False)
    return rows


# -- the report ------------------------------------------------------------------------------
class Cell(BaseModel):
    dataset: str
    extractor: str
    metric: str
    values: list[float]
    epsilon_spent: float
    privacy_unit: str
    seconds: float

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0


def cells(rows: Iterable[TableRow]) -> list[Cell]:
    grouped: dict[tuple[str, str], list[TableRow]] = {}
    for row in rows:
        if row.status == "completed" and row.test is not None:
            grouped.setdefault((row.dataset, row.extractor), []).append(row)
    return [
        Cell(
            dataset=dataset, extractor=extractor, metric=members[0].metric,
            values=[r.test for r in members if r.test is not None],
            epsilon_spent=max(r.epsilon_spent for r in members), privacy_unit=members[0].privacy_unit,
            seconds=statistics.fmean(r.seconds for r in members),
        )
        for (dataset, extractor), members in grouped.items()
    ]


def gap_in_stds(cell: Cell, mlp: Cell) -> float:
    """(mean − MLP's mean) / pooled std of the two samples (±∞ when both are exact)."""
    pooled = math.sqrt((cell.std**2 + mlp.std**2) / 2)
    difference = cell.mean - mlp.mean
    if pooled == 0:
        return 0.0 if difference == 0 else math.copysign(math.inf, difference)
    return difference / pooled


def verdict(dataset_cells: list[Cell]) -> str:
    mlp = next((c for c in dataset_cells if c.extractor == "mlp"), None)
    if mlp is None:
        return "no MLP cell: nothing to compare against"
    graph = [c for c in dataset_cells if c.extractor != "mlp"]
    beating = [c for c in graph if gap_in_stds(c, mlp) > 2]
    if beating:
        names = ", ".join(f"{c.extractor} (+{c.mean - mlp.mean:.4f}, {gap_in_stds(c, mlp):.1f} std)" for c in beating)
        return f"beats the MLP by more than two pooled standard deviations: {names}"
    best = max(graph, key=lambda c: c.mean, default=None)
    if best is None:
        return "no graph extractor ran"
    return (
        f"no graph extractor beats the MLP by more than two pooled standard deviations; the best is "
        f"{best.extractor} at {best.mean - mlp.mean:+.4f} ({gap_in_stds(best, mlp):+.1f} std)"
    )


def markdown(rows: list[TableRow], base: RunConfig, seeds: int, command: str) -> str:
    all_cells = cells(rows)
    extractors = {row.extractor for row in rows}
    eps = "∞" if math.isinf(base.privacy.epsilon) else f"{base.privacy.epsilon:g}"
    lines = [
        f"# Extractors side by side at ε = {eps} ({base.privacy.accounting})",
        "",
        f"Generated by `{command}`: {seeds} seeds per cell, every run through the three services on "
        "loopback and charged by the accountant. ε spent is the largest any seed's ledger reached; the "
        "gap is (mean − MLP mean) / pooled std of the two samples; seconds/run is wall time, which depends "
        "on what else the machine ran (not a performance figure). Each extractor's recipe on top of the "
        f"base run ({base.epochs} epochs): "
        + "; ".join(f"{name} {recipe or 'as the base'}" for name, recipe in RECIPES.items() if name in extractors)
        + ".",
        "",
    ]
    failed = [r for r in rows if r.status != "completed"]
    for dataset in dict.fromkeys(c.dataset for c in all_cells):
        dataset_cells = [c for c in all_cells if c.dataset == dataset]
        mlp = next((c for c in dataset_cells if c.extractor == "mlp"), None)
        metric = dataset_cells[0].metric
        lines += [
            f"## {dataset} (test {metric})", "",
            "| extractor | privacy unit | test mean ± std | n | ε spent | gap to MLP | seconds/run |",
            "|---|---|---|---|---|---|---|",
        ]
        for cell in dataset_cells:
            gap = "—" if mlp is None or cell is mlp else f"{gap_in_stds(cell, mlp):+.1f} std"
            lines.append(
                f"| {cell.extractor} | {cell.privacy_unit} | {cell.mean:.4f} ± {cell.std:.4f} | {len(cell.values)} "
                f"| {cell.epsilon_spent:.4g} | {gap} | {cell.seconds:.1f} |"
            )
        lines += ["", f"**{dataset}:** {verdict(dataset_cells)}.", ""]
    if failed:
        lines += ["## Runs that did not complete", ""]
        lines += [f"- {r.dataset} · {r.extractor} · seed {r.seed}: {r.status}: {r.message}" for r in failed]
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[TableRow], path: Path) -> None:
    """One panel per dataset: mean ± std per extractor, the MLP as a reference line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    all_cells = cells(rows)
    datasets = list(dict.fromkeys(c.dataset for c in all_cells))
    if not datasets:
        return
    figure, axes = plt.subplots(1, len(datasets), figsize=(5 * len(datasets), 4), dpi=120, squeeze=False)
    for axis, dataset in zip(axes[0], datasets, strict=True):
        dataset_cells = [c for c in all_cells if c.dataset == dataset]
        names = [c.extractor for c in dataset_cells]
        axis.bar(names, [c.mean for c in dataset_cells], yerr=[c.std for c in dataset_cells], capsize=4, color="tab:blue")
        mlp = next((c for c in dataset_cells if c.extractor == "mlp"), None)
        if mlp is not None:
            axis.axhline(mlp.mean, color="tab:red", linestyle="--", label="MLP")
            axis.legend(loc="lower right")
        low = min(c.mean - c.std for c in dataset_cells)
        axis.set_ylim(bottom=max(0.0, low - 0.05))
        budget = rows[0].epsilon_budget
        eps = "∞" if math.isinf(budget) else f"{budget:g}"
        axis.set_title(f"{dataset}: test {dataset_cells[0].metric} at ε = {eps} ({rows[0].accounting})", fontsize=10)
        axis.tick_params(axis="x", rotation=30)
        axis.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
