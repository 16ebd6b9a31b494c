"""The README's demo table (issue #21 item 3): ``vesper bench demo-table``.

Per ε and seed, what ``vesper demo --epsilon EPS --seed SEED`` runs with no other flag: the
default extractor (``run.extractor.name``'s default, with that extractor's own run defaults)
and the MLP baseline, through the three real services on loopback (one LocalCluster for the
whole table, as the demo starts one), on the demo's dataset. ``--extractor`` adds rows for
other extractors, each with its own defaults. Rows are written to ``--out`` as each run
ends (a rerun skips the cells it holds); ``--update README.md`` replaces the table between
the markers.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import typer
from pydantic import BaseModel
from rich.console import Console

from vesper.benchmarks.doc_sections import DocSectionError, replace_section
from vesper.common.config import ExtractorConfig, RunConfig, RunSummary

console = Console()

BEGIN, END = "<!-- demo-table:begin (vesper bench demo-table) -->", "<!-- demo-table:end -->"
BASELINE = "mlp"
DEFAULT_EXTRACTOR: str = ExtractorConfig.model_fields["name"].default


class DemoRow(BaseModel):
    """One run of the table."""

    extractor: str
    epsilon_budget: float
    seed: int
    status: str
    metric: str = ""
    test: float | None = None
    head: str = ""
    epsilon_spent: float = 0.0
    noise_multiplier: float | None = None
    sensitivity: float | None = None
    seconds: float = 0.0
    run_id: str = ""
    message: str = ""

    @property
    def key(self) -> tuple[str, float, int]:
        return (self.extractor, self.epsilon_budget, self.seed)


def row_of(summary: RunSummary, seed: int) -> DemoRow:
    return DemoRow(
        extractor=summary.extractor, epsilon_budget=summary.epsilon_budget, seed=seed, status=summary.status,
        metric=summary.test_metric.name if summary.test_metric else "",
        test=summary.test_metric.value if summary.test_metric else None, head=summary.decoder_head,
        epsilon_spent=summary.epsilon_spent, noise_multiplier=summary.noise_multiplier,
        sensitivity=summary.sensitivity, seconds=summary.seconds, run_id=summary.run_id, message=summary.message,
    )


def read_rows(path: Path) -> list[DemoRow]:
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        return [
            DemoRow.model_validate({k: (None if v == "" and k in ("test", "noise_multiplier", "sensitivity") else v)
                                    for k, v in row.items()})
            for row in csv.DictReader(handle)
        ]


def append_row(path: Path, row: DemoRow) -> None:
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(DemoRow.model_fields))
        if new:
            writer.writeheader()
        writer.writerow(row.model_dump())


def demo_run(epsilon: float, seed: int, extractor: str | None) -> RunConfig:
    """The run ``vesper demo --epsilon EPSILON --seed SEED [--extractor NAME]`` makes."""
    from vesper.common.config import VesperConfig
    from vesper.coordinator.cli.runs import demo_settings

    overrides = {"privacy.epsilon": epsilon, "seed": seed, "extractor.name": extractor}
    run, _ = demo_settings(VesperConfig(), overrides, extractor, None, True)
    return run


def baseline_of(run: RunConfig) -> RunConfig:
    """The demo's MLP baseline of ``run`` (as `vesper demo` makes it)."""
    return run.model_copy(update={"extractor": run.extractor.model_copy(update={"name": BASELINE, "params": {}})})


def _fmt(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:g}"


def _noise(rows: Sequence[DemoRow]) -> str:
    done = [r for r in rows if r.noise_multiplier is not None and r.sensitivity is not None]
    if not done:
        return "—"
    z, s = done[0].noise_multiplier, done[0].sensitivity
    return f"{z * s:.2f} = {z:.2f} × {s:.3f}"


def markdown(rows: Sequence[DemoRow], extractors: Sequence[str], epsilons: Sequence[float], seeds: Sequence[int]) -> str:
    """The table, a row per (ε, extractor): every seed's test metric, mean ± std, the head B kept,
    the largest ε spent, the noise and the median seconds of a run (its own wall time at party A)."""
    by_key = {row.key: row for row in rows}
    metric = next((r.metric for r in rows if r.metric), "test metric")
    seed_names = " / ".join(str(s) for s in seeds)
    lines = [
        BEGIN, "",
        f"| extractor | ε budget | test {metric}, seeds {seed_names} | mean ± std | head B kept | ε spent | noise std θ = z × S | seconds per run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for epsilon in epsilons:
        for extractor in extractors:
            cell = [by_key.get((extractor, epsilon, seed)) for seed in seeds]
            done = [r for r in cell if r is not None and r.status == "completed" and r.test is not None]
            values = " / ".join(f"{r.test:.3f}" if r in done else "—" for r in cell)
            tests = [r.test for r in done]
            mean = (f"{statistics.mean(tests):.3f} ± {statistics.stdev(tests):.3f}" if len(tests) > 1
                    else (f"{tests[0]:.3f}" if tests else "—"))
            heads = " / ".join(r.head or "—" for r in done) if any(r.head for r in done) else "—"
            spent = _fmt(float(f"{max(r.epsilon_spent for r in done):.4g}")) if done else "—"
            seconds = f"{statistics.median(r.seconds for r in done):.1f}" if done else "—"
            lines.append(f"| {extractor} | {_fmt(epsilon)} | {values} | {mean} | {heads} | {spent} | {_noise(done)} | {seconds} |")
    failed = [r for r in rows if r.status != "completed"]
    lines.append("")
    for row in failed:
        lines.append(f"- {row.extractor}, ε = {_fmt(row.epsilon_budget)}, seed {row.seed}: {row.status}: {row.message}")
    if failed:
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def demo_table_command(
    epsilon: list[str] = typer.Option(["8", "inf"], "--epsilon", help="ε budgets (repeat; inf: non-private)."),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Seeds 0 .. N-1 per cell."),
    extractor: Optional[list[str]] = typer.Option(
        None, "--extractor", help="Extractors beside the default one and the MLP (repeat), each with its own defaults."
    ),
    out: Path = typer.Option(Path(".vesper/demo-table/results.csv"), "--out", help="The runs' rows (a rerun skips those it holds)."),
    workdir: Path = typer.Option(Path(".vesper/demo-table"), "--workdir", help="The services' ledger, logs and runs."),
    update: Optional[Path] = typer.Option(None, "--update", help=f"Replace the {BEGIN} … {END} section of this file (README.md)."),
    report_only: bool = typer.Option(False, "--report-only", help="Run nothing: render the table from --out."),
) -> None:
    """The README's demo table: `vesper demo` with no flag but --epsilon and --seed (the default
    extractor, with its own defaults, and the MLP baseline), through the real services."""
    try:
        epsilons = [float(e) for e in epsilon]
    except ValueError:
        raise typer.BadParameter(f"ε must be numbers or inf, got {epsilon}", param_hint="--epsilon") from None
    names = [DEFAULT_EXTRACTOR, *[e for e in extractor or [] if e not in (DEFAULT_EXTRACTOR, BASELINE)], BASELINE]
    seed_list = list(range(seeds))
    if update is not None and not update.is_file():
        raise typer.BadParameter(f"no such file: {update}", param_hint="--update")
    if not report_only:
        _run_cells(names, epsilons, seed_list, out, workdir)
    text = markdown(read_rows(out), names, epsilons, seed_list)
    console.print(text, highlight=False)
    if update is not None:
        try:
            update.write_text(replace_section(update.read_text(), text, BEGIN, END))
        except DocSectionError as exc:
            raise typer.BadParameter(str(exc), param_hint="--update") from None
        console.print(f"updated {update}", highlight=False)


def _run_cells(names: Sequence[str], epsilons: Sequence[float], seeds: Sequence[int], out: Path, workdir: Path) -> None:
    from vesper.coordinator.processes import LocalCluster
    from vesper.coordinator.run_client import drive_run

    held = {row.key for row in read_rows(out)}
    todo = [(e, s, n) for e in epsilons for s in seeds for n in names if (n, e, s) not in held]
    if not todo:
        return
    with LocalCluster(workdir.resolve()) as cluster:
        for index, (epsilon, seed, name) in enumerate(todo, 1):
            if name == BASELINE:  # the demo's baseline: its default run with the MLP
                run = baseline_of(demo_run(epsilon, seed, None))
            else:
                run = demo_run(epsilon, seed, None if name == DEFAULT_EXTRACTOR else name)
            console.print(f"[{index}/{len(todo)}] {name}, ε = {_fmt(epsilon)}, seed {seed}", highlight=False)
            append_row(out, row_of(drive_run(cluster.party_a_address, run, console), seed))
