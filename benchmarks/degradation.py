"""The degradation rule (issue #21; docs/utility.md, section 6): ``vesper bench degradation``.

A user who picks a graph extractor must never get a worse model than not using the graph. For
every edge-level extractor, development graph and ε, the rule compares its test metric over
seeds with the MLP's (the feature-only model, which reads no edge and serves every ε):

    below  ⇔  Welch's one-sided test of "mean(MLP) > mean(extractor)" gives p < 0.05
              (findings.welch_one_sided, eqs. W1–W3)

and holds where no cell is below. The grid is ``vesper bench utility``'s (the same runs,
resumable, through the services or ``--in-process``), restricted to ``visible-batch`` and the
concat decoder; each cell also says which of its heads party B kept in how many runs
(party_b.decoders.FallbackDecoder).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel
from rich.console import Console

from vesper.benchmarks.extractor_sweep import registry_traits
from vesper.benchmarks.extractor_table import TableRow
from vesper.benchmarks.findings import SIGNIFICANCE, welch_one_sided
from vesper.benchmarks.utility_options import SHARED_FILES, SYNTHETIC_NODES, SYNTHETIC_PROFILES, UtilityOptions

console = Console()

BASELINE = "mlp"
DEGRADATION_DATASETS = ("cora", *SHARED_FILES, *SYNTHETIC_PROFILES)
DEGRADATION_EPSILONS = (1.0, 4.0, 8.0, math.inf)
MIN_SEEDS = 2  # Welch's test needs a spread on each side
BEGIN, END = "<!-- degradation:begin (vesper bench degradation) -->", "<!-- degradation:end -->"


class DegradationCell(BaseModel):
    """One extractor at one ε on one graph, against the MLP."""

    dataset: str
    extractor: str
    epsilon: float
    values: list[float]
    baseline: list[float]
    kept: dict[str, int] = {}  # how many runs B kept each head in (party_b.decoders.HEADS)
    p_below: float | None = None  # p of "MLP above the extractor"; None: not enough seeds

    @property
    def below(self) -> bool:
        return self.p_below is not None and self.p_below < SIGNIFICANCE

    @property
    def text(self) -> str:
        if not self.values:
            return "—"
        mean = statistics.fmean(self.values)
        spread = f" ± {statistics.stdev(self.values):.3f}" if len(self.values) > 1 else ""
        test = "n < 2" if self.p_below is None else f"p = {self.p_below:.2g}"
        mark = " **below**" if self.below else ""
        kept = ", ".join(f"{head} {count}" for head, count in sorted(self.kept.items(), key=lambda kv: -kv[1]))
        return f"{mean:.3f}{spread} ({len(self.values)}; {test}; kept {kept or '—'}){mark}"


def completed_runs(rows: Sequence[TableRow], dataset: str, extractor: str, epsilon: float | None) -> list[TableRow]:
    return [
        r for r in rows
        if r.dataset == dataset and r.extractor == extractor and r.status == "completed" and r.test is not None
        and r.decoder == "concat" and (epsilon is None or r.epsilon_budget == epsilon)
        and (r.accounting == "visible-batch" or epsilon is None)
    ]


def cell(rows: Sequence[TableRow], dataset: str, extractor: str, epsilon: float) -> DegradationCell:
    """The extractor's runs at ε against every MLP run of the graph (the MLP reads no edge: one run
    serves every ε), and the test."""
    mine = completed_runs(rows, dataset, extractor, epsilon)
    baseline = [r.test for r in completed_runs(rows, dataset, BASELINE, None) if r.test is not None]
    values = [r.test for r in mine if r.test is not None]
    p = None
    if len(values) >= MIN_SEEDS and len(baseline) >= MIN_SEEDS:
        p = welch_one_sided(baseline, values).p
    return DegradationCell(
        dataset=dataset, extractor=extractor, epsilon=epsilon, values=values, baseline=baseline,
        kept=dict(Counter(r.head for r in mine if r.head)), p_below=p,
    )


def cells(
    rows: Sequence[TableRow], datasets: Sequence[str], extractors: Sequence[str], epsilons: Sequence[float],
) -> list[DegradationCell]:
    return [cell(rows, d, e, eps) for d in datasets for e in extractors if e != BASELINE for eps in epsilons]


def own_epochs(found: Sequence[DegradationCell]) -> str:
    """The table's extractors that declare their own epochs, as "gap: 20 (its edge-free path 30
    alone first), …" (none: "none does"); the path's stage is docs/privacy.md section 2.5's."""
    from vesper.benchmarks.extractor_table import RECIPES
    from vesper.common.config import RunConfig
    from vesper.party_a.extractors.edge_free_path import path_stage_epochs
    from vesper.party_a.extractors.registry import lookup

    own = []
    for name in sorted({c.extractor for c in found}):
        epochs = RECIPES.get(name, {}).get("epochs")
        if epochs is None:
            continue
        stage = path_stage_epochs(lookup(name).spec.cost_model, RunConfig.model_validate({"epochs": epochs}))
        own.append(f"{name}: {epochs}" + (f" (its edge-free path {stage} alone first)" if stage > 0 else ""))
    return ", ".join(own) or "none does"


def markdown(found: Sequence[DegradationCell], options: UtilityOptions, datasets: Sequence[str]) -> str:
    """The table per graph (a column per ε), then the verdict."""
    epsilons = sorted({c.epsilon for c in found})
    header = " | ".join("∞" if math.isinf(e) else f"ε = {e:g}" for e in epsilons)
    measured = [c for c in found if c.p_below is not None]
    below = [c for c in found if c.below]
    missing = [c for c in found if c.p_below is None]
    lines = [
        BEGIN, "",
        f"Generated by `{command_line(options)}`. Each cell: the test "
        "metric's mean ± std over seeds (n; p of Welch's one-sided test that the MLP's mean is above it; how "
        "many runs party B kept each of its heads: graph = the extractor's slices, edge-free = the MLP's, "
        f"combined = all). **below**: p < {SIGNIFICANCE:g}. visible-batch, concat "
        f"decoder, {options.base.epochs} epochs unless the extractor declares its own ({own_epochs(found)}; "
        "`vesper extractors` lists every default)" + (", in one process (`--in-process`)" if options.in_process else
                                                   ", through the three services") + ".", "",
    ]
    for dataset in datasets:
        mine = [c for c in found if c.dataset == dataset]
        if not mine:
            continue
        baseline = mine[0].baseline
        mlp = (f"{statistics.fmean(baseline):.3f} ± {statistics.stdev(baseline):.3f} ({len(baseline)})"
               if len(baseline) > 1 else "not measured")
        lines += [f"## {dataset}", "", f"MLP (every ε): {mlp}.", "", f"| extractor | {header} |",
                  "|---|" + "---|" * len(epsilons)]
        for extractor in dict.fromkeys(c.extractor for c in mine):
            entries = [next((c.text for c in mine if c.extractor == extractor and c.epsilon == e), "—") for e in epsilons]
            lines.append(f"| {extractor} | " + " | ".join(entries) + " |")
        lines.append("")
    verdict = (
        f"**Verdict:** {len(below)} of {len(measured)} measured cells are below the MLP"
        + (f"; {len(missing)} cells not measured (fewer than {MIN_SEEDS} seeds)" if missing else "") + ". "
        + ("The rule holds on every measured cell." if not below and measured else
           "Below: " + "; ".join(f"{c.extractor} on {c.dataset} at ε = {c.epsilon:g}" for c in below) + "."
           if below else "Nothing measured yet.")
    )
    return "\n".join([*lines, verdict, "", *chance_note(measured), END])


def chance_note(measured: Sequence[DegradationCell]) -> list[str]:
    """What the cells where B kept the edge-free head in every run compare. Made with common
    random numbers (the same seeds and secrets as the MLP's runs, docs/utility.md section 7),
    their runs are the MLP's runs themselves, so they cannot test below. Otherwise they compare
    the MLP with the MLP's layers trained in other runs: were that head the MLP exactly, such a
    cell would test below with probability SIGNIFICANCE, so about SIGNIFICANCE x (their number)
    of them by chance (the cells of one graph share the MLP's runs, so they tend to err together;
    the expected count is the same)."""
    fallback = [c for c in measured if c.kept.get("edge-free", 0) == len(c.values)]
    if not fallback:
        return []
    same = [c for c in fallback if sorted(c.values) == sorted(c.baseline)]
    other = [c for c in fallback if c not in same]
    lines = []
    if same:
        lines.append(
            f"In {len(same)} of the measured cells B kept the edge-free head in every run and the cell's test metrics "
            "are the MLP's runs' own, value for value (common random numbers: the same seeds and secrets, "
            f"docs/utility.md section 7): none of them can test below. {sum(c.below for c in same)} of them are below."
        )
    if other:
        lines.append(
            f"Chance: in {len(other)} of the measured cells B kept the edge-free head in every run, but its runs are not "
            f"the MLP's own, so the cell compares the MLP with the MLP's layers trained in other runs; were that head "
            f"the MLP exactly, about {SIGNIFICANCE * len(other):.1f} of them would test below at p < {SIGNIFICANCE:g} "
            f"by chance alone (the cells of one graph share the MLP's runs and err together). "
            f"{sum(c.below for c in other)} of them are below."
        )
    return [" ".join(lines), ""]


def command_line(options: UtilityOptions) -> str:
    """The command that reproduces this table, flag by flag."""
    parts = [
        "vesper bench degradation", *(f"--dataset {d}" for d in options.datasets),
        *(f"--extractor {e}" for e in options.extractors if e != BASELINE),
        *(f"--epsilon {'inf' if math.isinf(e) else f'{e:g}'}" for e in options.epsilons),
        f"--seeds {options.seeds}", f"--epochs {options.base.epochs}", f"--jobs {options.jobs}",
    ]
    if any(d in SYNTHETIC_PROFILES for d in options.datasets):
        parts.append(f"--synthetic-nodes {options.synthetic_nodes}")
    return " ".join(parts + (["--in-process"] if options.in_process else []))


def edge_level_extractors() -> list[str]:
    """Every installed edge-level extractor, the MLP first."""
    from vesper.party_a.extractors.registry import installed

    names = [entry.name for entry in installed() if entry.extractor is not None]
    return [BASELINE, *(n for n in names if n != BASELINE and registry_traits(n).privacy_unit == "edge")]


def degradation_command(
    dataset: Optional[list[str]] = typer.Option(
        None, "--dataset", help="Graphs (repeat; default cora, tolokers, twitch-engb and the three synthetic ones)."
    ),
    extractor: Optional[list[str]] = typer.Option(
        None, "--extractor", help="Edge-level extractors (repeat; default every one installed; the MLP is always run)."
    ),
    epsilon: Optional[list[str]] = typer.Option(None, "--epsilon", help="Budgets (repeat; default 1 4 8 inf)."),
    seeds: int = typer.Option(5, "--seeds", help="Seeds per cell.", min=2),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Training epochs (default: the run's, 50).", min=1),
    jobs: int = typer.Option(1, "--jobs", help="Runs at a time.", min=1),
    in_process: bool = typer.Option(False, "--in-process", help="A, B and the accountant in this process."),
    out: Path = typer.Option(Path("bench/degradation"), "--out", help="results.csv and degradation.md go here."),
    synthetic_nodes: int = typer.Option(SYNTHETIC_NODES, "--synthetic-nodes", min=100),
    report_only: bool = typer.Option(False, "--report-only", help="Write the table from OUT/results.csv; run nothing."),
    update: Optional[Path] = typer.Option(
        None, "--update", help=f"Also replace the {BEGIN} … {END} section of this file (e.g. docs/utility.md)."
    ),
) -> None:
    """Is any edge-level extractor significantly below the MLP? (issue #21's degradation rule)

    Runs the grid (resumable: finished runs in OUT/results.csv are kept) and writes
    OUT/degradation.md: per graph and ε, each extractor against the MLP by Welch's
    one-sided test over seeds, and which head B kept in how many runs.
    """
    from vesper.benchmarks.harness import parse_epsilons
    from vesper.benchmarks.utility_bench import _run_or_exit, base_run
    from vesper.benchmarks.utility_datasets import resolve_datasets

    names = list(dict.fromkeys([BASELINE, *(extractor or edge_level_extractors())]))
    options = UtilityOptions(
        datasets=list(dict.fromkeys(dataset or DEGRADATION_DATASETS)), extractors=names, decoders=["concat"],
        epsilons=parse_epsilons(epsilon) if epsilon else list(DEGRADATION_EPSILONS), accountings=["visible-batch"],
        seeds=seeds, base=base_run(None, epochs), jobs=jobs, in_process=in_process, out=out,
        synthetic_nodes=synthetic_nodes,
    )
    if report_only:
        from vesper.benchmarks.extractor_table import read_rows

        rows = read_rows(out / "results.csv")
        labels = [d.label for d in resolve_datasets(options.datasets, out / "data", synthetic_nodes, set(), console)]
    else:
        run = _run_or_exit(options)
        rows, labels = run.rows, [d.label for d in run.datasets]
    text = markdown(cells(rows, labels, names, options.epsilons), options, labels)
    (out / "degradation.md").write_text(text + "\n")
    if update is not None:
        from vesper.benchmarks.doc_sections import DocSectionError, replace_section

        try:
            update.write_text(replace_section(update.read_text(), text, BEGIN, END))
        except DocSectionError as exc:
            raise typer.BadParameter(str(exc), param_hint="--update") from None
    console.print(text, highlight=False)
    console.print(f"wrote {out / 'degradation.md'}" + (f" and updated {update}" if update else ""), highlight=False)
