"""``vesper bench utility``: the privacy–utility grid of VESPER's Figure 2, and its findings.

A cell is (dataset, extractor, decoder, accounting, ε, seed). The grid is planned, run and
resumed by :mod:`extractor_sweep` (which runs serve which cells: the MLP once per dataset,
decoder and seed for every ε and both modes; ε = ∞ once for both modes; a one-shot
extractor's visible-batch run for both modes); this module adds what is particular to the
utility benchmark:

* datasets by name: ``cora`` (bundled), ``tolokers`` (skipped, with the reason, when its
  file is absent), and ``synthetic-dense`` / ``synthetic-sparse``, generated once into
  ``OUT/data/`` from a fixed :class:`SyntheticSpec` recorded in ``OUT/data/spec.json``: a
  resumed benchmark refuses to mix rows of graphs drawn from different specs;
* drivers: one LocalCluster per job (the default), running services (``--party-a``), or the
  same code in one process (``--in-process``, ``vesper.coordinator.in_process``);
* the report: ``OUT/results.csv`` (a row per finished run, appended as it ends),
  ``OUT/results.md`` (a table per dataset × decoder × accounting, a column per ε, and the
  findings of :mod:`findings`), and ``OUT/plots/utility-<decoder>.png`` (Figure 2's style).

How to read the report and how findings are decided: docs/utility.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console

from vesper.common.config import RunConfig, load_config
from vesper.coordinator.epsilon_flags import parse_epsilons
from vesper.coordinator.extractor_sweep import (
    HIDDEN,
    VISIBLE,
    Drive,
    ExtractorTraits,
    GridCell,
    GridPlan,
    Traits,
    grid_cells,
    plan_grid,
    registry_traits,
    row_serve_key,
    run_grid,
    served_cell,
)
from vesper.coordinator.extractor_table import RECIPES, TableRow, dataset_label, drop_superseded, read_rows

if TYPE_CHECKING:
    from vesper.coordinator.findings import Finding, GraphDensity
    from vesper.coordinator.synthetic import SyntheticSpec

# numpy-heavy modules (synthetic, findings) and matplotlib are imported where they are used:
# the CLI imports this module to register the command.

console = Console()

EPSILONS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, math.inf)
DECODERS = ("concat", "gru")
ACCOUNTINGS = (HIDDEN, VISIBLE)
DATASETS = ("cora", "tolokers", "synthetic-dense", "synthetic-sparse")
TOLOKERS = Path("/work/shared/data/tolokers.npz")
SYNTHETIC_PROFILES = {"synthetic-dense": "dense", "synthetic-sparse": "sparse"}
# Cora's node count: with the generator's 16 features a run then takes about as long as a
# Cora run (20 epochs at ε = 4: pmp-gcn 3.8 s dense, 6.2 s sparse, 4.3 s Cora; docs/utility.md)
SYNTHETIC_NODES = 2708
FIRST_EXTRACTORS = ("mlp", "pmp-gin", "pmp-gcn", "gap", "vfgnn")


# -- the options ----------------------------------------------------------------------------------
class Preset(BaseModel):
    """Values of the grid's options a flag left unset takes."""

    datasets: list[str]
    extractors: list[str] | None  # None: every extractor installed here
    decoders: list[str]
    epsilons: list[float]
    accountings: list[str]
    seeds: int
    epochs: int | None  # None: the [run] section's, else RunConfig's default
    jobs: int


FULL = Preset(
    datasets=list(DATASETS), extractors=None, decoders=list(DECODERS), epsilons=list(EPSILONS),
    accountings=list(ACCOUNTINGS), seeds=5, epochs=None, jobs=1,
)
# Every ε a finding reads except 8 and 32, a sparse and a dense graph, two seeds (the least
# Welch's test can use); its wall time on 2 cores is in docs/utility.md
QUICK = Preset(
    datasets=["cora", "synthetic-dense"], extractors=list(FIRST_EXTRACTORS), decoders=["concat"],
    epsilons=[4.0, 16.0, math.inf], accountings=list(ACCOUNTINGS), seeds=2, epochs=20, jobs=2,
)


class UtilityOptions(BaseModel):
    """One invocation of the benchmark, every preset value resolved."""

    datasets: list[str]
    extractors: list[str]
    decoders: list[str]
    epsilons: list[float]
    accountings: list[str]
    seeds: int
    base: RunConfig  # every run starts from it (the [run] section of --config, --epochs applied)
    jobs: int = 1
    in_process: bool = False
    party_a: str | None = None
    out: Path = Path("bench/utility")
    synthetic_nodes: int = SYNTHETIC_NODES
    quick: bool = False

    @property
    def command(self) -> str:
        """The command that reproduces this grid, flag by flag."""
        parts = [
            "vesper bench utility", *(f"--dataset {d}" for d in self.datasets),
            *(f"--extractor {e}" for e in self.extractors), *(f"--decoder {d}" for d in self.decoders),
            *(f"--epsilon {format_epsilon(e, 'inf')}" for e in self.epsilons),
            *(f"--accounting {a}" for a in self.accountings), f"--seeds {self.seeds}",
            f"--epochs {self.base.epochs}", f"--jobs {self.jobs}",
        ]
        if any(d in SYNTHETIC_PROFILES for d in self.datasets):
            parts.append(f"--synthetic-nodes {self.synthetic_nodes}")
        if self.in_process:
            parts.append("--in-process")
        return " ".join(parts)


def format_epsilon(epsilon: float, infinity: str = "∞") -> str:
    return infinity if math.isinf(epsilon) else f"{epsilon:g}"


def installed_extractors() -> list[str]:
    """Every extractor registered at this machine's party A (edge- and node-level), VESPER's first."""
    from vesper.party_a.extractors.registry import installed

    names = [item.name for item in installed() if item.extractor is not None]
    return [n for n in FIRST_EXTRACTORS if n in names] + sorted(n for n in names if n not in FIRST_EXTRACTORS)


# -- datasets -------------------------------------------------------------------------------------
class BenchDataset(BaseModel):
    label: str  # in rows and reports
    run_name: str  # what a run is given: a bundled name or an absolute .npz path
    path: Path  # the file here, for its density


class SpecMismatch(ValueError):
    """OUT/data/spec.json records another synthetic graph than the one asked for."""


def synthetic_spec(profile: str, nodes: int) -> SyntheticSpec:
    """The fixed spec of a named synthetic dataset: the generator's profile defaults, seed 0."""
    from vesper.coordinator.synthetic import SyntheticSpec

    return SyntheticSpec(num_nodes=nodes, profile=profile, seed=0)


def spec_fields(spec: SyntheticSpec) -> dict[str, Any]:
    """The spec as JSON values (a tuple becomes a list), as spec.json stores it."""
    return json.loads(json.dumps(dataclasses.asdict(spec)))


def array_digest(path: Path) -> str:
    """SHA-256 over every array's name, dtype, shape and bytes (the .npz's zip timestamps vary)."""
    import numpy as np

    digest = hashlib.sha256()
    with np.load(path, allow_pickle=False) as archive:
        for name in sorted(archive.files):
            array = np.ascontiguousarray(archive[name])
            digest.update(f"{name}|{array.dtype.str}|{array.shape}".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


class SyntheticRecord(BaseModel):
    spec: dict[str, Any]
    sha256: str


def _read_records(path: Path) -> dict[str, SyntheticRecord]:
    if not path.exists():
        return {}
    return {label: SyntheticRecord.model_validate(v) for label, v in json.loads(path.read_text()).items()}


def _write_records(path: Path, records: dict[str, SyntheticRecord]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({k: v.model_dump() for k, v in records.items()}, indent=2, sort_keys=True) + "\n")


def spec_differences(recorded: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    return [
        f"{key}: recorded {recorded.get(key)!r}, asked {asked.get(key)!r}"
        for key in sorted(set(recorded) | set(asked)) if recorded.get(key) != asked.get(key)
    ]


def ensure_synthetic(data_dir: Path, label: str, nodes: int, labels_with_rows: set[str]) -> Path:
    """``data_dir/<label>.npz``, generated from :func:`synthetic_spec` the first time.

    Refuses (:class:`SpecMismatch`) when spec.json records another spec for ``label``, when the
    file's arrays are not the recorded ones, and when results.csv has rows of ``label`` but
    spec.json does not say which graph they were made on.
    """
    from vesper.coordinator.synthetic import generate, save_npz

    spec_path = data_dir / "spec.json"
    records = _read_records(spec_path)
    asked = spec_fields(synthetic_spec(SYNTHETIC_PROFILES[label], nodes))
    path = data_dir / f"{label}.npz"
    record = records.get(label)
    if record is not None:
        differences = spec_differences(record.spec, asked)
        if differences:
            raise SpecMismatch(
                f"{spec_path} records {label} with another spec ({'; '.join(differences)}), and the rows of "
                f"{label} in results.csv were made on that graph: pass --synthetic-nodes "
                f"{record.spec.get('num_nodes')} to resume, or choose another --out"
            )
    elif label in labels_with_rows:
        raise SpecMismatch(
            f"results.csv has rows of {label} but {spec_path} does not record the spec of their graph: "
            "choose another --out"
        )
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        save_npz(generate(synthetic_spec(SYNTHETIC_PROFILES[label], nodes)), path)
    digest = array_digest(path)
    if record is not None and digest != record.sha256:
        raise SpecMismatch(
            f"{path}'s arrays are not the ones {spec_path} recorded for this spec (sha256 {digest[:12]}…, "
            f"recorded {record.sha256[:12]}…): the file was changed, or the generator no longer gives the "
            "same graph for the same spec"
        )
    if record is None:
        records[label] = SyntheticRecord(spec=asked, sha256=digest)
        _write_records(spec_path, records)
    return path


def resolve_datasets(
    names: Sequence[str], data_dir: Path, nodes: int, labels_with_rows: set[str], say: Console,
) -> list[BenchDataset]:
    """The grid's datasets; tolokers is skipped with a printed reason when its file is absent."""
    from vesper.common.dataset_files import BUNDLED, resolve_dataset

    found = []
    for name in names:
        if name in SYNTHETIC_PROFILES:
            path = ensure_synthetic(data_dir, name, nodes, labels_with_rows).resolve()
            found.append(BenchDataset(label=name, run_name=str(path), path=path))
        elif name == "tolokers":
            if not TOLOKERS.is_file():
                say.print(f"skipping tolokers: {TOLOKERS} does not exist", highlight=False)
                continue
            found.append(BenchDataset(label="tolokers", run_name=str(TOLOKERS), path=TOLOKERS))
        else:
            path = resolve_dataset(name)
            run_name = name if name in BUNDLED else str(path.resolve())
            found.append(BenchDataset(label=dataset_label(name), run_name=run_name, path=path))
    return found


# -- the runs -------------------------------------------------------------------------------------
class UtilityRun(BaseModel):
    """What :func:`run_utility` ran: the grid's datasets, its plan, and every row serving it."""

    datasets: list[BenchDataset]
    plan: GridPlan
    rows: list[TableRow]


def estimated_seconds(missing: Sequence[GridCell], rows: Sequence[TableRow]) -> float | None:
    """Σ over missing runs of the mean seconds of finished runs of the same (dataset, extractor),
    else of the same extractor, else of all; None before any run finished."""
    finished = [r for r in rows if r.status == "completed" and r.seconds > 0]
    if not finished:
        return None
    overall = statistics.fmean(r.seconds for r in finished)
    by_pair: dict[tuple[str, str], list[float]] = {}
    by_extractor: dict[str, list[float]] = {}
    for r in finished:
        by_pair.setdefault((r.dataset, r.extractor), []).append(r.seconds)
        by_extractor.setdefault(r.extractor, []).append(r.seconds)
    total = 0.0
    for cell in missing:
        samples = by_pair.get((dataset_label(cell.dataset), cell.extractor)) or by_extractor.get(cell.extractor)
        total += statistics.fmean(samples) if samples else overall
    return total


def plan_text(plan: GridPlan, cells: int, rows: Sequence[TableRow], jobs: int) -> str:
    """What is about to happen: cells, runs (after sharing), done, to run, and the time left."""
    lines = [
        f"{cells} cells, served by {len(plan.runs)} runs: {len(plan.done)} done, {len(plan.missing)} to run"
        + (f"; {len(plan.unsupported)} cells unsupported (not run)" if plan.unsupported else "")
    ]
    remaining = estimated_seconds(plan.missing, rows)
    if plan.missing and remaining is not None:
        lines.append(
            f"estimated time left ≈ {remaining / jobs / 60:.1f} min over {jobs} job{'s' if jobs > 1 else ''} "
            "(finished runs' seconds, without service start-up)"
        )
    return "\n".join(lines)


@contextmanager
def open_drivers(options: UtilityOptions, say: Console) -> Iterator[list[Drive]]:
    """One driver per job: its own LocalCluster, the running services at --party-a, or in process."""
    from vesper.coordinator.processes import LocalCluster
    from vesper.coordinator.run_client import drive_run

    def driver(address: str) -> Drive:
        return lambda config: drive_run(address, config, say)

    with ExitStack() as stack:
        if options.party_a is not None:
            yield [driver(options.party_a)] * options.jobs
        elif options.in_process:
            from vesper.coordinator.in_process import InProcessCluster

            clusters = [
                stack.enter_context(InProcessCluster((options.out / f"in-process-{i}").resolve()))
                for i in range(options.jobs)
            ]
            yield [cluster.drive for cluster in clusters]
        else:
            clusters = [
                stack.enter_context(LocalCluster((options.out / f"cluster-{i}").resolve())) for i in range(options.jobs)
            ]
            yield [driver(cluster.party_a_address) for cluster in clusters]


def run_utility(
    options: UtilityOptions, say: Console = console, *, drivers: Sequence[Drive] | None = None,
    traits: Traits = registry_traits,
) -> UtilityRun:
    """Plan the grid, print the plan, run what is missing (``drivers``, else :func:`open_drivers`).

    Every finished run is appended to OUT/results.csv as it ends; a killed benchmark resumes
    where it stopped. Raises :class:`SpecMismatch` before running anything if OUT/data holds
    another synthetic graph than the options ask for.
    """
    options.out.mkdir(parents=True, exist_ok=True)
    before = read_rows(options.out / "results.csv")
    datasets = resolve_datasets(
        options.datasets, options.out / "data", options.synthetic_nodes, {r.dataset for r in before}, say,
    )
    cells = grid_cells(
        [d.run_name for d in datasets], options.extractors, options.decoders, options.accountings,
        options.epsilons, options.seeds,
    )
    plan = plan_grid(cells, before, traits)
    say.print(plan_text(plan, len(cells), before, options.jobs), highlight=False)
    if not plan.missing:
        return UtilityRun(datasets=datasets, plan=plan, rows=plan.done)
    if drivers is not None:
        rows = run_grid(options.base, plan, options.out, drivers, say)
    else:
        with open_drivers(options, say) as opened:
            rows = run_grid(options.base, plan, options.out, opened, say)
    drop_superseded(options.out / "results.csv", (r.key for r in rows))
    return UtilityRun(datasets=datasets, plan=plan, rows=rows)


# -- the report -----------------------------------------------------------------------------------
SERVED_MARK = "†"


def _entry(rows: Sequence[TableRow], label: str, extractor: str, decoder: str, accounting: str, epsilon: float,
           traits: Traits) -> str:
    found = traits(extractor)
    if not (accounting in found.accountings or found.accounting_free or math.isinf(epsilon)):
        return "n/a"
    cell = served_cell(rows, label, extractor, decoder, accounting, epsilon, traits)
    if cell is None:
        return "—"
    text = f"{cell.mean:.4f} ± {cell.std:.4f} ({len(cell.values)})"
    if math.isfinite(epsilon) and not found.reads_no_edges:
        text += f", ε {cell.epsilon_spent:.3g}"
    if _stands_in(found, accounting, epsilon):
        text += SERVED_MARK
    return text


def _stands_in(found: ExtractorTraits, accounting: str, epsilon: float) -> bool:
    """Whether the (finite-ε) cell shows a run of the other mode: a one-shot extractor's."""
    return (math.isfinite(epsilon) and found.accounting_free and not found.reads_no_edges
            and accounting != found.run_accounting)


def _unsupported_text(plan: GridPlan) -> list[str]:
    pairs = dict.fromkeys((c.extractor, c.accounting) for c in plan.unsupported)
    return [f"- {extractor} under {accounting}: the extractor has no {accounting} accounting (not run)"
            for extractor, accounting in pairs]


def _failed_text(rows: Sequence[TableRow], traits: Traits) -> list[str]:
    """The latest unfinished row of each cell that no completed row serves, grouped over seeds."""
    served = {row_serve_key(r, traits) for r in rows if r.status == "completed"}
    latest: dict[tuple, TableRow] = {}
    for row in rows:
        key = row_serve_key(row, traits)
        if row.status != "completed" and key not in served:
            latest[key] = row
    grouped: dict[tuple, list[TableRow]] = {}
    for key, row in latest.items():
        grouped.setdefault((key[:5], row.status, row.message), []).append(row)
    return [
        f"- {members[0].dataset} · {members[0].extractor}+{members[0].decoder} · {members[0].accounting} · "
        f"ε = {format_epsilon(members[0].epsilon_budget)} · seeds {', '.join(str(r.seed) for r in members)}: "
        f"{status}: {message}"
        for (_, status, message), members in grouped.items()
    ]


def markdown(
    run: UtilityRun, options: UtilityOptions, densities: dict[str, GraphDensity], findings_section: str,
    traits: Traits = registry_traits,
) -> str:
    """results.md: the grid's tables (a column per ε, ∞ last) and the findings section."""
    rows = run.rows
    finite = [e for e in options.epsilons if math.isfinite(e)]
    columns = [*finite, *(e for e in options.epsilons if math.isinf(e))]
    shared = [e for e in options.extractors if traits(e).reads_no_edges]
    one_shot = [e for e in options.extractors if traits(e).accounting_free and not traits(e).reads_no_edges]
    one_shot = one_shot if HIDDEN in options.accountings else []
    recipes = "; ".join(f"{name} {RECIPES[name]}" for name in options.extractors if RECIPES.get(name))
    lines = [
        "# Privacy–utility grid (`vesper bench utility`)",
        "",
        f"Generated by `{options.command}`. Each entry is the test metric's mean ± std over seeds (n), then the "
        "ε the ledger actually spent (the largest over seeds). "
        + ("Every run went through the same code in one process (`--in-process`). " if options.in_process else
           "Every run went through the three services and was charged by the accountant. ")
        + f"Base run: {options.base.epochs} epochs, batch {options.base.batch_size}, L = "
        f"{options.base.extractor.layers}, fanout D = {options.base.extractor.fanout}, D_min = "
        f"{options.base.extractor.d_min}, d = {options.base.extractor.dim}"
        + (f"; recipes on top of it: {recipes}" if recipes else "") + ".",
        "",
        "Shared runs (docs/utility.md): "
        + (f"{', '.join(shared)} read{'s' if len(shared) == 1 else ''} no edge, so one run per dataset, decoder "
           "and seed serves every ε and both modes (the same numbers in every column); " if shared else "")
        + "ε = ∞ adds no noise and charges nothing, so one run serves both modes"
        + (f"; {', '.join(one_shot)} release{'s' if len(one_shot) == 1 else ''} once over the whole graph, where "
           "hidden-batch has no sampling to credit, so under hidden-batch the visible-batch runs are shown, "
           f"marked {SERVED_MARK}" if one_shot else "")
        + ". n/a: the extractor has no accounting of that mode. —: no completed run.",
        "",
    ]
    if HIDDEN in options.accountings:
        lines += [
            "**hidden-batch** is VESPER's Theorem 2.1 as published: it assumes B cannot tell which edges a step "
            "used. B sees every batch's node ids, so hidden-batch numbers reproduce the paper; only visible-batch "
            "is a guarantee against B. Bound (6) does not fall to 0 as the noise grows: on a small graph with "
            "batch 256 its floor can exceed a budget, and such runs fail at calibration (docs/utility.md §3).",
            "",
        ]
    for dataset in run.datasets:
        density = densities.get(dataset.label)
        lines += [f"## {dataset.label}", ""]
        if density is not None:
            lines += [
                f"{density.nodes:,} nodes, {density.edges:,} undirected edges, mean degree {density.mean_degree:.2f} "
                f"{'>' if density.dense else '≤'} ln N = {density.log_nodes:.2f}: **{density.kind}**.", "",
            ]
        metric = next((r.metric for r in rows if r.dataset == dataset.label and r.metric), "metric")
        for decoder in options.decoders:
            for accounting in options.accountings:
                header = " | ".join("∞ (non-private)" if math.isinf(e) else f"ε = {e:g}" for e in columns)
                lines += [
                    f"### {dataset.label} · decoder {decoder} · {accounting} (test {metric})", "",
                    f"| extractor | privacy unit | {header} |", "|---|---|" + "---|" * len(columns),
                ]
                for extractor in options.extractors:
                    entries = [_entry(rows, dataset.label, extractor, decoder, accounting, e, traits) for e in columns]
                    lines.append(f"| {extractor} | {traits(extractor).privacy_unit} | " + " | ".join(entries) + " |")
                lines.append("")
    unsupported, failed = _unsupported_text(run.plan), _failed_text(rows, traits)
    noisy = [r for r in rows if r.status == "completed" and math.isinf(r.epsilon_budget) and r.noise_multiplier]
    if unsupported:
        lines += ["## Cells not run", "", *unsupported, ""]
    if failed:
        lines += ["## Runs that did not complete", "", *failed, ""]
    if noisy:
        lines += [
            "## ε = ∞ runs that recorded noise (a bug to investigate: they serve only their own mode)", "",
            *(f"- {r.dataset} · {r.extractor}+{r.decoder} · {r.accounting} · seed {r.seed}: noise multiplier "
              f"{r.noise_multiplier:g} (run {r.run_id})" for r in noisy), "",
        ]
    lines += [findings_section, ""]
    return "\n".join(lines)


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
        served = f" ({SERVED_MARK} {found.run_accounting})" if _stands_in(found, accounting, points[0][0]) else ""
        axis.errorbar([e for e, _ in points], [c.mean for _, c in points], yerr=[c.std for _, c in points],
                      marker="o", capsize=3, color=colour, label=extractor + served)
    top = served_cell(rows, label, extractor, decoder, accounting, math.inf, traits) if has_inf else None
    if top is not None:
        axis.errorbar([x_inf], [top.mean], yerr=[top.std], marker="D", markerfacecolor="none", capsize=3,
                      color=colour, linestyle="none", label=None if points else f"{extractor} (ε = ∞)")


def write_report(
    run: UtilityRun, options: UtilityOptions, *, traits: Traits = registry_traits,
) -> list[Finding]:
    """Write OUT/results.md and OUT/plots/utility-<decoder>.png; return the findings (for docs/results.md:
    ``findings.markdown(found, densities)`` renders them)."""
    from vesper.coordinator import findings

    densities = {d.label: findings.graph_density(d.label, d.path) for d in run.datasets}
    found = findings.decide(
        run.rows, densities, traits=traits, epsilons=options.epsilons, accountings=options.accountings,
        decoders=options.decoders,
    )
    section = findings.markdown(found, densities)
    (options.out / "results.md").write_text(markdown(run, options, densities, section, traits) + "\n")
    plot(run, options, options.out / "plots", traits)
    return found


# -- the command ----------------------------------------------------------------------------------
def _choices(values: Sequence[str], allowed: Sequence[str], hint: str) -> list[str]:
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: expected {' or '.join(allowed)}", param_hint=hint)
    return list(dict.fromkeys(values))


def base_run(config: Path | None, epochs: int | None) -> RunConfig:
    """The [run] section of ``config`` (or RunConfig's defaults), with ``epochs`` if given."""
    data: dict[str, Any] = {}
    if config is not None:
        try:
            loaded = load_config(config)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--config") from None
        data = loaded.run.model_dump(exclude_unset=True) if loaded.run else {}
    if epochs is not None:
        data["epochs"] = epochs
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise typer.BadParameter(f"invalid run configuration:\n{exc}", param_hint="--config") from None


def utility_command(
    dataset: Optional[list[str]] = typer.Option(
        None, "--dataset",
        help="cora, tolokers, synthetic-dense, synthetic-sparse, or an .npz path (repeat; default all four).",
    ),
    extractor: Optional[list[str]] = typer.Option(
        None, "--extractor", help="Extractors (repeat; default every one installed here, node-level ones included)."
    ),
    decoder: Optional[list[str]] = typer.Option(None, "--decoder", help="concat, gru (repeat; default both)."),
    epsilon: Optional[list[str]] = typer.Option(
        None, "--epsilon", help="Budgets, a column each (repeat; 'inf' = no noise; default 1 2 4 8 16 32 inf)."
    ),
    accounting: Optional[list[str]] = typer.Option(
        None, "--accounting",
        help="hidden-batch (the paper's Theorem 2.1, no guarantee against B), visible-batch (repeat; default both).",
    ),
    seeds: Optional[int] = typer.Option(None, "--seeds", help="Seeds per cell, 0, 1, ... (default 5).", min=1),
    epochs: Optional[int] = typer.Option(
        None, "--epochs", help="Training epochs (default: the [run] section's, else 50; recipes may set their own).",
        min=1,
    ),
    jobs: Optional[int] = typer.Option(None, "--jobs", help="Runs at a time, each with its own services.", min=1),
    in_process: bool = typer.Option(
        False, "--in-process", help="Run A, B and the accountant as the same code in this process, without gRPC."
    ),
    party_a: Optional[str] = typer.Option(
        None, "--party-a", help="Use running services at this party A address (the .npz paths must exist there)."
    ),
    out: Path = typer.Option(Path("bench/utility"), "--out", help="results.csv, results.md, plots/ and data/ go here."),
    synthetic_nodes: int = typer.Option(
        SYNTHETIC_NODES, "--synthetic-nodes", help="N of the synthetic datasets (generated once, seed 0).", min=100
    ),
    config: Optional[Path] = typer.Option(
        None, "--config", "-c", help="TOML file whose [run] section every run starts from."
    ),
    quick: bool = typer.Option(
        False, "--quick",
        help="Preset: cora and synthetic-dense; mlp, pmp-gin, pmp-gcn, gap, vfgnn; ε 4, 16, inf; concat; both "
        "modes; 2 seeds; 20 epochs; 2 jobs (under 10 minutes on 2 cores). Explicit flags override it.",
    ),
) -> None:
    """Privacy–utility grid of VESPER's Figure 2, and whether the paper's findings hold.

    Cells are dataset × extractor × decoder × accounting × ε × seed. The MLP runs once
    per dataset, decoder and seed and serves every ε and mode; ε = inf runs once for
    both modes. Resumable: runs already in OUT/results.csv are not run again. Writes
    OUT/results.md (tables, and findings (a)-(d) under each mode) and
    OUT/plots/utility-DECODER.png. See docs/utility.md.
    """
    from vesper.coordinator.processes import ServiceStartError
    from vesper.coordinator.run_client import RunClientError

    preset = QUICK if quick else FULL
    if in_process and party_a is not None:
        raise typer.BadParameter("choose one of --in-process and --party-a", param_hint="--in-process")
    options = UtilityOptions(
        datasets=list(dict.fromkeys(dataset or preset.datasets)),
        extractors=list(dict.fromkeys(extractor or preset.extractors or installed_extractors())),
        decoders=_choices(decoder or preset.decoders, DECODERS, "--decoder"),
        epsilons=parse_epsilons(epsilon) if epsilon else list(preset.epsilons),
        accountings=_choices(accounting or preset.accountings, ACCOUNTINGS, "--accounting"),
        seeds=seeds or preset.seeds,
        base=base_run(config, epochs if epochs is not None else preset.epochs),
        jobs=jobs or preset.jobs, in_process=in_process, party_a=party_a, out=out,
        synthetic_nodes=synthetic_nodes, quick=quick,
    )
    try:
        run = run_utility(options, console)
    except SpecMismatch as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    except (ServiceStartError, RunClientError) as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    found = write_report(run, options)
    console.print((options.out / "results.md").read_text(), highlight=False)
    console.print(
        f"wrote {options.out / 'results.csv'}, {options.out / 'results.md'} and {options.out / 'plots'}; "
        + ", ".join(f"({f.key}) {f.accounting}/{f.decoder}: {f.outcome}" for f in found),
        highlight=False,
    )

