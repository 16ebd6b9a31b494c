"""``vesper bench results``: regenerate docs/results.md from scratch, with one command.

Two benchmarks through the real services, each resumable on its own CSV under OUT:

1. the privacy–utility grid (``vesper bench utility``, OUT/utility): the curves of [VESPER, Fig. 2] and
   whether VESPER's findings (a)–(d) hold under hidden-batch and under visible-batch;
2. the audit (``vesper bench audit``, OUT/audit): membership and edge inference AUC against
   ε ([VESPER, Fig. 4]) and the one-run canary lower bound beside the accountant's ε.

Then REPORT (docs/results.md) is written from the two CSVs: nothing in it is typed by hand.
"""

from __future__ import annotations

import math
import os
import platform
import time
from pathlib import Path

import typer
from rich.console import Console

from vesper.common.config import RunConfig

console = Console()

UTILITY_EXTRACTORS = ["mlp", "pmp-gin", "pmp-gcn", "gap", "vfgnn"]
AUDIT_EXTRACTORS = ["pmp-gcn", "gap"]
ALL_EPSILONS = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, math.inf]


class Plan:
    """The grid of one preset: what the utility benchmark and the audit each run."""

    def __init__(
        self, utility_datasets: list[str], utility_epsilons: list[float], seeds: int, epochs: int,
        audit_datasets: list[str], audit_epsilons: list[float], audit_epochs: int, canaries: int,
    ) -> None:
        self.utility_datasets = utility_datasets
        self.utility_epsilons = utility_epsilons
        self.seeds = seeds
        self.epochs = epochs
        self.audit_datasets = audit_datasets
        self.audit_epsilons = audit_epsilons
        self.audit_epochs = audit_epochs
        self.canaries = canaries


# Cora (sparse) and Tolokers (dense) decide finding (b) between them; the synthetic graphs
# would double the time (`vesper bench utility` runs them by default)
DEFAULT = Plan(
    utility_datasets=["cora", "tolokers"], utility_epsilons=ALL_EPSILONS,
    seeds=3, epochs=20, audit_datasets=["cora", "tolokers"], audit_epsilons=[1.0, 4.0, 16.0, math.inf],
    audit_epochs=20, canaries=500,
)
QUICK = Plan(
    utility_datasets=["cora", "tolokers"], utility_epsilons=[4.0, 16.0, math.inf], seeds=2, epochs=10,
    audit_datasets=["cora"], audit_epsilons=[1.0, 4.0, 16.0, math.inf], audit_epochs=10, canaries=300,
)


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()}"


def _relative(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


def results_command(
    out: Path = typer.Option(Path("docs/results"), "--out", help="Where the two benchmarks keep CSVs, plots and services."),
    report: Path = typer.Option(Path("docs/results.md"), "--report", help="The markdown file to write."),
    quick: bool = typer.Option(False, "--quick", help="Smaller grid (under 10 minutes on 2 cores): Cora and Tolokers, ε 4, 16, inf, 2 seeds, 10 epochs; audit on Cora."),
    jobs: int = typer.Option(2, "--jobs", help="Runs at a time, each with its own services.", min=1),
    seeds: int | None = typer.Option(None, "--seeds", help="Seeds per utility cell (default 3; --quick 2).", min=2),
    in_process: bool = typer.Option(False, "--in-process", help="The same code in one process instead of the services."),
) -> None:
    """Regenerate docs/results.md: the privacy–utility grid with VESPER's findings (a)–(d)
    under both accounting modes, and the audit (membership and edge inference, one-run
    canary bound). Resumable: rows already in OUT's CSVs are not run again; delete OUT to
    start from scratch. See docs/utility.md and docs/audit.md.
    """
    from vesper.benchmarks import audit_bench, utility_bench
    from vesper.benchmarks.findings import graph_density
    from vesper.coordinator.processes import ServiceStartError
    from vesper.coordinator.run_client import RunClientError

    plan = QUICK if quick else DEFAULT
    started = time.monotonic()
    utility_out, audit_out = out / "utility", out / "audit"
    options = utility_bench.UtilityOptions(
        datasets=[d for d in plan.utility_datasets if d != "tolokers" or utility_bench.TOLOKERS.exists()],
        extractors=UTILITY_EXTRACTORS, decoders=["concat"], epsilons=plan.utility_epsilons,
        accountings=list(utility_bench.ACCOUNTINGS), seeds=seeds or plan.seeds, base=RunConfig(epochs=plan.epochs),
        jobs=jobs, in_process=in_process, out=utility_out,
    )
    audit_datasets = [
        str(utility_bench.TOLOKERS) if d == "tolokers" else d
        for d in plan.audit_datasets if d != "tolokers" or utility_bench.TOLOKERS.exists()
    ]
    missing = [d for d in (*plan.utility_datasets, *plan.audit_datasets) if d == "tolokers" and not utility_bench.TOLOKERS.exists()]
    if missing:
        console.print(f"Tolokers is not at {utility_bench.TOLOKERS}: the report covers the other datasets only")
    quick_flag = " --quick" if quick else ""
    command = f"vesper bench results{quick_flag} --jobs {jobs}" + (f" --seeds {seeds}" if seeds else "") + (
        " --in-process" if in_process else "")
    try:
        console.rule("privacy–utility grid")
        utility = utility_bench.run_utility(options, console)
        found = utility_bench.write_report(utility, options)
        console.rule("audit")
        audit_rows = audit_bench.run_audit_bench(
            RunConfig(epochs=plan.audit_epochs), audit_datasets, AUDIT_EXTRACTORS, list(audit_bench.MODES),
            plan.audit_epsilons, 1, audit_out,
            lambda stack: audit_bench.audited_drivers(stack, audit_out, jobs, in_process, console), console,
            canaries=plan.canaries,
        )
    except (ServiceStartError, RunClientError, utility_bench.SpecMismatch) as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
    audit_plots = audit_bench.plot_rows(audit_rows, audit_out)
    from vesper.benchmarks import findings as findings_module

    densities = {d.label: graph_density(d.label, d.path) for d in utility.datasets}
    minutes = (time.monotonic() - started) / 60
    run_minutes = (sum(r.seconds for r in utility.rows) + sum(r.seconds for r in audit_rows)) / 60 / jobs
    text = render(
        command, minutes, run_minutes, options, utility_out, report.parent, findings_module.markdown(found, densities),
        audit_bench.markdown(
            audit_rows, AUDIT_EXTRACTORS, list(audit_bench.MODES), plan.audit_epsilons, 1,
            command,
            [_relative(p, report.parent) for p in audit_plots],
        ),
    )
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(text)
    console.print(f"wrote {report} ({minutes:.1f} min)", highlight=False)


def render(
    command: str, minutes: float, run_minutes: float, options, utility_out: Path, report_dir: Path,
    findings_section: str, audit_section: str,
) -> str:
    """docs/results.md from the sections the two benchmarks rendered."""
    plots = sorted((utility_out / "plots").glob("*.png"))
    lines = [
        "# Results: privacy–utility and the audit",
        "",
        f"Generated by `{command}` (`make results`) on {_machine()}. Every number below comes from runs "
        "through the three services on loopback, charged by the accountant, and is recomputed from the CSVs "
        "next to this file. Rows already in the CSVs are reused (delete "
        f"`{_relative(utility_out.parent, report_dir)}/` to regenerate everything): this invocation took "
        f"{minutes:.0f} minutes; the runs behind the CSVs took about {run_minutes:.0f} minutes at "
        f"{options.jobs} jobs (their seconds summed and divided by the jobs; service start-up not included).",
        "",
        f"Utility grid: {', '.join(options.datasets)} × {', '.join(options.extractors)} × decoder concat × "
        f"ε ∈ {{{', '.join('∞' if math.isinf(e) else f'{e:g}' for e in options.epsilons)}}} × hidden-batch and "
        f"visible-batch, {options.seeds} seeds, {options.base.epochs} epochs (extractor recipes of "
        "`vesper bench extractors` on top). Full tables: "
        f"[{_relative(utility_out / 'results.md', report_dir)}]({_relative(utility_out / 'results.md', report_dir)}).",
        "",
        "**Read first.** `visible-batch` is the default and the only accounting that holds against party B, who "
        "sees every batch's node ids. `hidden-batch` is the paper's accounting (subsampling amplification, "
        "Theorem 2.1), shown to reproduce the paper, not as a guarantee. The accountant charges the larger of "
        "the paper's bound (6) and dp-accounting's ε of the events, and bound (6) has a floor (docs/accounting.md "
        "§5): hidden-batch budgets below it are refused, so those cells are *not measured*, not zero.",
        "",
        findings_section.rstrip(),
        "",
        "## Figure 2: test metric against ε",
        "",
        *[f"![{p.stem}]({_relative(p, report_dir)})" for p in plots],
        "",
        audit_section.rstrip(),
        "",
    ]
    return "\n".join(lines)
