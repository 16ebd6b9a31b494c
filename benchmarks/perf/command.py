"""``vesper bench perf``: every performance figure of issue #9, measured in one run, printed as
a table and written to docs/performance.md.

Each figure comes from a source module that returns ``list[PerfFigure]``
(benchmarks/perf/figures.py) and is imported only when it runs, so a module that is
missing, or a source that fails, becomes a line of the report that says so instead of
ending the command:

    throughput   two-party steps/s against one process; pipelining   (perf/throughput.py)
    wire         bytes per step float32 vs bfloat16; the metric       (perf/wire_bytes.py)
    accountant   charge latency p50/p99                               (perf/accountant_latency.py)
    sampler      sampler epoch on Tolokers against DGL, same run      (perf/kernels.py, perf/dgl_peer.py)
    layer        PMP layer forward+backward against a sparse GCN      (perf/layer_figure.py)
    scale        1M/10M and 100k/10M graphs: epoch time, peak RSS     (perf/scale.py; --scale-profile
                 sparse-10m for 10M/100M, --scale-workers for A's workers)

The document states the machine (CPU, cores, RAM, torch and its threads, the load average
before and after), the command, and every figure with its raw numbers, goal, pass/fail and,
for a missed goal, what bounds it. The command exits 0 whether goals are met or not: the
document carries pass/fail.
"""

from __future__ import annotations

import datetime as dt
import importlib
import inspect
import os
import shlex
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import BaseModel, Field
from rich import box
from rich.console import Console
from rich.table import Table

from vesper.benchmarks.harness import Machine
from vesper.benchmarks.perf.figures import PerfFigure

console = Console()

DEFAULT_OUT = Path("docs/performance.md")
DEFAULT_WORKDIR = Path(".vesper/perf")
DEFAULT_TOLOKERS = Path("../shared/data/tolokers.npz")


@dataclass(frozen=True)
class Source:
    """Where one group of figures comes from: ``module.function``, imported when it runs."""

    name: str
    module: str
    function: str
    what: str


SOURCES: tuple[Source, ...] = (
    Source("throughput", "vesper.benchmarks.perf.throughput", "throughput_figures",
           "two-party steps/s against one process; pipelining's gain"),
    Source("wire", "vesper.benchmarks.perf.wire_bytes", "wire_figures",
           "bytes per training step, float32 against bfloat16; the test metric with each"),
    Source("accountant", "vesper.benchmarks.perf.accountant_latency", "accountant_latency_figures",
           "write-ahead charge latency p50/p99 to a real accountant process"),
    Source("sampler", "vesper.benchmarks.perf.kernels", "sampler_figures",
           "one sampler epoch on Tolokers against DGL 2.1's, measured in the same run (--peer-env)"),
    Source("layer", "vesper.benchmarks.perf.layer_figure", "layer_figures",
           "PMP layer forward + backward against a torch sparse-matrix GCN layer"),
    Source("scale", "vesper.benchmarks.perf.scale", "scale_figures",
           "1M nodes / 10M edges and 100k / 10M (or the --scale-profile graphs, e.g. 10M / 100M): one epoch's "
           "time, each service's peak RSS"),
)
SOURCE_NAMES = tuple(source.name for source in SOURCES)


# -- running the sources ----------------------------------------------------------------------
class SourceOutcome(BaseModel):
    source: str
    what: str = ""
    figures: list[PerfFigure] = Field(default_factory=list)
    error: str = Field("", description="why this source gave no figures (missing module, an exception)")
    seconds: float = 0.0
    load_before: tuple[float, float, float] | None = Field(None, description="load average as the source started")
    load_after: tuple[float, float, float] | None = Field(None, description="load average as it ended")
    steal: float | None = Field(None, description="share of the CPU time the hypervisor gave other guests meanwhile")


class RunContext(BaseModel):
    """What every source may be given; each gets the arguments its signature names."""

    quick: bool = False
    workdir: Path
    tolokers: Path
    peer_env: Path | None = None  # DGL 2.1's environment, for the sampler's peer (make bench-peer)
    scale_profiles: list[str] | None = None  # the scale graphs (None: the source's default)
    scale_workers: list[int] | None = None  # party A's worker processes per scale run (None: one)


FRESH_WORKDIRS = ("throughput", "wire", "accountant")  # fresh services and ledgers every run; scale keeps its graphs


def _arguments(function: Callable[..., Any], context: RunContext, source: str) -> dict[str, Any]:
    """The keyword arguments ``function`` accepts among what the context offers."""
    parameters = inspect.signature(function).parameters
    if source in FRESH_WORKDIRS:
        shutil.rmtree(context.workdir / source, ignore_errors=True)
    offered: dict[str, Any] = {"workdir": context.workdir / source}
    if context.quick:
        offered["quick"] = True
    if source in ("sampler", "layer"):
        offered["dataset_path"] = context.tolokers
    if source == "sampler":
        offered["peer_env"] = context.peer_env
        if context.quick:
            offered["repeats"] = 1
    if source == "scale":
        if "workdir" in parameters:
            (context.workdir / source).mkdir(parents=True, exist_ok=True)
        if context.scale_profiles:
            offered["profiles"] = tuple(context.scale_profiles)
        if context.scale_workers:
            offered["workers"] = tuple(context.scale_workers)
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return {key: value for key, value in offered.items() if accepts_any or key in parameters}


def run_source(source: Source, context: RunContext, out: Console | None = None) -> SourceOutcome:
    """The source's figures, or why there are none; never raises for the source's sake."""
    started = time.monotonic()
    outcome = SourceOutcome(source=source.name, what=source.what, load_before=load_average())
    times_before = cpu_times()
    try:
        module = importlib.import_module(source.module)
        function = getattr(module, source.function)
    except (ImportError, AttributeError) as exc:
        outcome.error = f"not available: {source.module}.{source.function} ({type(exc).__name__}: {exc})"
        return outcome
    if source.name in ("sampler", "layer") and not context.tolokers.is_file():
        outcome.error = f"not measured: Tolokers not found at {context.tolokers} (--tolokers PATH)"
        return outcome
    try:
        arguments = _arguments(function, context, source.name)
        if context.quick and source.name == "scale" and "quick" not in arguments:
            outcome.error = "skipped under --quick: scale_figures has no quick mode (a full-size run takes minutes)"
            return outcome
        figures = function(**arguments)
        outcome.figures = [PerfFigure.model_validate(f) if not isinstance(f, PerfFigure) else f for f in figures]
    except Exception as exc:  # noqa: BLE001 — a failed source is reported, the others still run
        last = traceback.format_exception(exc)[-3:]
        outcome.error = f"failed: {type(exc).__name__}: {exc}\n" + "".join(last).rstrip()
        if out is not None:
            out.print(f"[red]{source.name} failed:[/red] {type(exc).__name__}: {exc}", highlight=False)
    finally:
        outcome.seconds = round(time.monotonic() - started, 1)
        outcome.load_after = load_average()
        outcome.steal = steal_share(times_before, cpu_times())
    return outcome


# -- the machine ------------------------------------------------------------------------------
def load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def cpu_times() -> tuple[int, int] | None:
    """(all CPU time, steal time) in jiffies since boot, from /proc/stat's first line; None off Linux.
    Steal is time a virtual CPU was ready but the hypervisor ran another guest: a busy host
    slows every figure of a source alike, which the load average inside the guest does not show."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return (sum(fields[:8]), fields[7]) if len(fields) >= 8 else None


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """Steal's share of the CPU time between two ``cpu_times`` readings."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return (after[1] - before[1]) / (after[0] - before[0])


class PerfReport(BaseModel):
    command: str
    started_at: str
    seconds: float
    machine: Machine
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    quick: bool = False
    outcomes: list[SourceOutcome]

    @property
    def figures(self) -> list[PerfFigure]:
        return [figure for outcome in self.outcomes for figure in outcome.figures]

    @property
    def goals(self) -> list[PerfFigure]:
        return [figure for figure in self.figures if figure.passed is not None]


# -- output -----------------------------------------------------------------------------------
def verdict(figure: PerfFigure) -> str:
    if figure.passed is None:
        return "reported"
    return "pass" if figure.passed else "FAIL"


def value_text(figure: PerfFigure) -> str:
    value = figure.value
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return f"{text} {figure.unit}".rstrip() if figure.unit not in ("", "x") else (f"{text}×" if figure.unit == "x" else text)


def print_table(report: PerfReport, out: Console) -> None:
    table = Table(title="vesper bench perf", box=box.SIMPLE_HEAVY)
    for column in ("figure", "value", "goal", "result"):
        table.add_column(column, overflow="fold")
    styles = {"pass": "green", "FAIL": "bold red", "reported": "dim"}
    for outcome in report.outcomes:
        if outcome.error:
            table.add_row(f"{outcome.source}: {outcome.what}", "-", "-", f"[yellow]{outcome.error.splitlines()[0]}[/yellow]")
        for figure in outcome.figures:
            result = verdict(figure)
            table.add_row(figure.name, value_text(figure), figure.goal or "-", f"[{styles[result]}]{result}[/{styles[result]}]")
    out.print(table)
    goals = report.goals
    missed = [f.name for f in goals if not f.passed]
    out.print(
        f"{len(goals) - len(missed)} of {len(goals)} goals met"
        + (f"; missed: {', '.join(missed)}" if missed else "")
        + (f"; {sum(1 for o in report.outcomes if o.error)} source(s) gave no figures" if any(o.error for o in report.outcomes) else ""),
        highlight=False,
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _load_short(values: tuple[float, float, float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def _load(values: tuple[float, float, float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values) + " (1 / 5 / 15 min)"


def markdown(report: PerfReport) -> str:
    """docs/performance.md: the machine, the command, a summary table, every figure in full."""
    m = report.machine
    goals = report.goals
    met = sum(1 for f in goals if f.passed)
    lines = [
        "# Performance",
        "",
        f"Generated by `{report.command}` on {report.started_at}, in {report.seconds:.0f} s (`make bench-perf` "
        "runs the full measurement); "
        "do not edit by hand. Every figure is a ratio or a quantity measured in this one run; "
        "each goal is from issue #9. The command exits 0 either way: this document carries pass/fail. "
        "Earlier measurements behind choices in the code, not re-measured here: performance-notes.md.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {m.cpu_model}, {m.cores} cores |",
        f"| RAM | {m.ram_gib:g} GiB |",
        f"| system | {m.system}, Python {m.python} |",
        f"| torch | {m.torch}, {m.torch_threads} intra-op threads in the command's process (each figure states its own) |",
        f"| load average before | {_load(report.load_before)} |",
        f"| load average after | {_load(report.load_after)} |",
        "",
    ]
    if report.quick:
        lines += ["**`--quick`**: small sizes for a smoke test; these numbers are not the issue's measurements.", ""]
    lines += [
        "## Summary",
        "",
        f"{met} of {len(goals)} goals met.",
        "",
        "| figure | value | goal | result |",
        "|---|---|---|---|",
    ]
    for outcome in report.outcomes:
        if outcome.error:
            lines.append(f"| {_cell(outcome.source + ': ' + outcome.what)} | - | - | {_cell(outcome.error.splitlines()[0])} |")
        for f in outcome.figures:
            result = verdict(f)
            lines.append(f"| {_cell(f.name)} | {_cell(value_text(f))} | {_cell(f.goal or '-')} | {'**FAIL**' if result == 'FAIL' else result} |")
    lines += ["", "## Figures", ""]
    for outcome in report.outcomes:
        load = ""
        if outcome.load_before is not None and outcome.load_after is not None:
            load = f" Load average (1 / 5 / 15 min) {_load_short(outcome.load_before)} as it started, {_load_short(outcome.load_after)} as it ended."
        if outcome.steal is not None:
            load += f" CPU time taken by the host for other guests (steal, /proc/stat): {outcome.steal:.1%}."
        lines += [f"### {outcome.source}: {outcome.what}", "", f"Source run time: {outcome.seconds:.0f} s.{load}", ""]
        if outcome.error:
            lines += ["**No figures.** " + outcome.error.splitlines()[0], ""]
            rest = outcome.error.splitlines()[1:]
            if rest:
                lines += ["```", *rest, "```", ""]
        for f in outcome.figures:
            lines += [
                f"#### {f.name}",
                "",
                f"* value: **{value_text(f)}**" + (f"; goal {f.goal}: **{verdict(f)}**" if f.goal else " (reported, no goal)"),
            ]
            if f.command:
                lines.append(f"* command: `{f.command}`")
            lines += ["", f.measured, ""]
            if f.bound:
                lines += ["**What bounds it:**", "", _as_block(f.bound), ""]
    return "\n".join(lines).rstrip() + "\n"


def _as_block(text: str) -> str:
    """Markdown tables stay tables; profile output goes in a code block."""
    if any(line.lstrip().startswith(("ncalls", "Name", "---", "-----")) for line in text.splitlines()):
        head, _, tail = text.partition("\n")
        return f"{head}\n\n```\n{tail}\n```"
    return text


# Records measured elsewhere than by this command's run, each between its markers: the GPU check
# (make gpu-check on a lent GPU machine, issue #25 item 5) and the 10M-node scale run (hours, on
# a machine of its own). A new report carries each recorded section over, word for word, from
# the document it replaces, after its own figures.
GPU_BEGIN, GPU_END = "<!-- gpu-check:begin (make gpu-check, recorded) -->", "<!-- gpu-check:end -->"
SCALE_10M_BEGIN = "<!-- scale-10m:begin (vesper bench perf --only scale --scale-profile sparse-10m, recorded) -->"
SCALE_10M_END = "<!-- scale-10m:end -->"
RECORDED_SECTIONS = ((SCALE_10M_BEGIN, SCALE_10M_END), (GPU_BEGIN, GPU_END))


def recorded_sections(path: Path) -> list[str]:
    """The recorded sections of the document at ``path`` (markers included), in
    ``RECORDED_SECTIONS``' order; none where the document or a section is absent."""
    text = path.read_text() if path.exists() else ""
    kept = []
    for begin, end in RECORDED_SECTIONS:
        start, stop = text.find(begin), text.find(end)
        if 0 <= start < stop:
            kept.append(text[start:stop + len(end)])
    return kept


def write_report(report: PerfReport, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = "".join(f"\n{section}\n" for section in recorded_sections(path))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(markdown(report) + kept)
    tmp.replace(path)
    return path


# -- the command ------------------------------------------------------------------------------
def run_perf(sources: list[Source], context: RunContext, command: str, out: Console) -> PerfReport:
    started_at = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    started = time.monotonic()
    load_before = load_average()
    machine = Machine.here()
    outcomes = []
    for source in sources:
        out.print(f"[bold]{source.name}[/bold]: {source.what}", highlight=False)
        outcomes.append(run_source(source, context, out))
    return PerfReport(
        command=command, started_at=started_at, seconds=round(time.monotonic() - started, 1), machine=machine,
        load_before=load_before, load_after=load_average(), quick=context.quick, outcomes=outcomes,
    )


def _check_scale_options(profiles: list[str] | None, workers: list[int] | None) -> None:
    """Refuse unknown scale profiles and worker counts below one before anything runs."""
    from vesper.benchmarks.perf.scale import PROFILES  # pydantic only: no numpy or torch here

    unknown = sorted(set(profiles or ()) - set(PROFILES))
    if unknown:
        raise typer.BadParameter(
            f"unknown scale profile(s) {', '.join(unknown)}; known: {', '.join(sorted(PROFILES))}",
            param_hint="--scale-profile",
        )
    bad = [count for count in workers or () if count < 1]
    if bad:
        raise typer.BadParameter(
            f"party A's worker processes must be at least 1, got {bad}; e.g. --scale-workers 1 --scale-workers 2",
            param_hint="--scale-workers",
        )


def perf_command(
    quick: bool = typer.Option(False, "--quick", help="Small sizes (a smoke test of every source, minutes)."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Where the report goes (markdown)."),
    only: Optional[list[str]] = typer.Option(
        None, "--only", help=f"Run only these sources (repeat): {', '.join(SOURCE_NAMES)}."
    ),
    tolokers: Path = typer.Option(
        DEFAULT_TOLOKERS, "--tolokers", help="Tolokers .npz, for the sampler and layer figures."
    ),
    workdir: Path = typer.Option(
        DEFAULT_WORKDIR, "--workdir",
        help="Services, ledgers and the scale graphs (kept: a later run reuses the graphs).",
    ),
    scale_profile: Optional[list[str]] = typer.Option(
        None, "--scale-profile",
        help="The scale source's graphs (repeat): sparse-1m, dense-100k (the default pair), sparse-10m "
        "(10M nodes / 100M edges), sparse-20k, dense-2k.",
    ),
    scale_workers: Optional[list[int]] = typer.Option(
        None, "--scale-workers",
        help="Party A's worker processes in the scale runs (repeat: one run per count, e.g. 1 and 2); default 1.",
    ),
    peer_env: Optional[Path] = typer.Option(
        None, "--peer-env",
        help="A virtual environment with DGL 2.1 and its torch (make bench-peer builds .peer-env): the sampler "
        "figure times DGL there, in this run. Without it DGL is not measured.",
    ),
) -> None:
    """Measure every figure of issue #9 in one run: two-party throughput against one process,
    pipelining, the sampler and the PMP layer against their references, wire bytes float32 vs
    bfloat16, the accountant's charge latency, scale; print them with their goals and write
    docs/performance.md. Exits 0 whether goals are met or not: the document carries pass/fail
    (and, for a missed goal, what bounds it)."""
    unknown = sorted(set(only or ()) - set(SOURCE_NAMES))
    if unknown:
        raise typer.BadParameter(f"unknown source(s) {', '.join(unknown)}; known: {', '.join(SOURCE_NAMES)}", param_hint="--only")
    chosen = [s for s in SOURCES if not only or s.name in only]
    command = shlex.join(["vesper", "bench", "perf", *sys.argv[3:]]) if sys.argv[1:3] == ["bench", "perf"] else "vesper bench perf"
    _check_scale_options(scale_profile, scale_workers)
    if peer_env is not None and not (peer_env / "bin" / "python").exists():
        raise typer.BadParameter(f"{peer_env} has no bin/python: build it with make bench-peer", param_hint="--peer-env")
    context = RunContext(
        quick=quick, workdir=workdir.resolve(), tolokers=tolokers.expanduser(),
        peer_env=peer_env.resolve() if peer_env is not None else None,
        scale_profiles=scale_profile or None, scale_workers=scale_workers or None,
    )
    report = run_perf(chosen, context, command, console)
    # the sources left out by --only are listed as such, so the document says what it does not hold
    report.outcomes += [
        SourceOutcome(source=s.name, what=s.what, error="not run in this invocation (--only)")
        for s in SOURCES if s not in chosen
    ]
    print_table(report, console)
    path = write_report(report, out)
    console.print(f"wrote {path}", highlight=False)
