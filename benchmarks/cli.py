"""`vesper bench`: every benchmark and report generator as a command (loaded by the `vesper`
command line only when `bench` is asked for: coordinator/cli/__init__.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.table import Table

from vesper.benchmarks.anchors import anchors_command
from vesper.benchmarks.audit_bench import audit_bench_command
from vesper.benchmarks.degradation import degradation_command
from vesper.benchmarks.demo_table import demo_table_command
from vesper.benchmarks.import_bench import import_command
from vesper.benchmarks.label_privacy_table import label_privacy_command
from vesper.benchmarks.perf.command import perf_command
from vesper.benchmarks.perf.device_check import device_command
from vesper.benchmarks.results_report import results_command
from vesper.benchmarks.soak_bench import soak_command
from vesper.benchmarks.utility_bench import utility_command
from vesper.common.config import RunConfig, RunSummary
from vesper.coordinator.cli.shared import (
    PLAIN_HELP,
    Accounting,
    console,
    errors,
    fail,
    load_settings,
    parse_epsilon,
    run_settings,
)

bench_app = typer.Typer(
    help="Benchmarks: commands that measure, not tests.", no_args_is_help=True, add_completion=False, **PLAIN_HELP
)



@bench_app.command("accounting")
def bench_accounting(
    steps: list[int] = typer.Option([1000, 10000], "--steps", help="Run lengths to calibrate (repeat the flag).", min=1),
) -> None:
    """Time and peak memory of calibrating long runs under the pld and rdp accountants."""
    from vesper.benchmarks.accounting_bench import main as run_benchmark

    run_benchmark(steps)


@bench_app.command("extractors")
def bench_extractors(
    dataset: list[str] = typer.Option(["cora"], "--dataset", help="A bundled name or an .npz path (repeat the flag)."),
    extractor: Optional[list[str]] = typer.Option(
        None, "--extractor", help="Extractors to compare (repeat; default mlp, pmp-gin, pmp-gcn, gap, vfgnn, dpar-edge)."
    ),
    seeds: int = typer.Option(5, "--seeds", help="Seeds per cell (0, 1, ...).", min=1),
    epsilon: list[str] = typer.Option(
        ["4"], "--epsilon", help="Budget of the runs; 'inf' = no noise. Repeat for a sweep: a column per ε."
    ),
    accounting: Accounting = typer.Option(Accounting.visible_batch, "--accounting", help="Accounting mode of every run."),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Training epochs (default: the [run] section's, else 50).", min=1),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file whose [run] section every run starts from; each extractor's own defaults (vesper extractors) apply over it."),
    out: Path = typer.Option(Path("bench/extractors"), "--out", help="Directory for results.csv, results.md and results.png."),
    jobs: int = typer.Option(1, "--jobs", help="Runs at a time, each with its own services on loopback.", min=1),
    party_a: Optional[str] = typer.Option(
        None, "--party-a", help="Use running services at this party A address instead of starting them on loopback."
    ),
) -> None:
    """Extractors side by side (mean ± std over seeds), through the real services.

    One --epsilon: a table at that budget. Several: a table per dataset with a column per ε
    and a plot of the metric against ε; an extractor that reads no edge (the MLP) runs once
    per seed and is shown in every column. Resumable: cells already in OUT/results.csv are
    not run again.
    """
    from vesper.benchmarks import extractor_table as table
    from vesper.coordinator.processes import LocalCluster, ServiceStartError
    from vesper.coordinator.run_client import RunClientError, drive_run

    budgets = list(dict.fromkeys(parse_epsilon(e) for e in epsilon))
    base = run_settings(load_settings(config), {
        "privacy.epsilon": budgets[0], "privacy.accounting": accounting, "epochs": epochs,
    })
    names = extractor or list(table.DEFAULT_EXTRACTORS)
    command = " ".join(
        ["vesper bench extractors", *(f"--dataset {d}" for d in dataset), *(f"--extractor {e}" for e in names),
         f"--seeds {seeds}", *(f"--epsilon {e}" for e in epsilon), f"--accounting {accounting.value}",
         f"--epochs {base.epochs}"]
    )
    if len(budgets) > 1 or jobs > 1:
        _bench_sweep(base, budgets, dataset, names, seeds, out, jobs, party_a, command)
        return

    def report(rows: list[table.TableRow]) -> None:
        (out / "results.md").write_text(table.markdown(rows, base, seeds, command) + "\n")
        table.plot(rows, out / "results.png")
        console.print((out / "results.md").read_text(), highlight=False)
        console.print(f"wrote {out / 'results.csv'}, {out / 'results.md'} and {out / 'results.png'}", highlight=False)

    try:
        if party_a is not None:
            rows = table.run_table(base, dataset, names, seeds, out, lambda c: drive_run(party_a, c, console), console)
        else:
            with LocalCluster((out / "cluster").resolve()) as cluster:
                rows = table.run_table(
                    base, dataset, names, seeds, out, lambda c: drive_run(cluster.party_a_address, c, console), console
                )
    except (ServiceStartError, RunClientError) as exc:
        fail(str(exc), getattr(exc, "exit_code", 1))
    report(rows)


def _bench_sweep(
    base: RunConfig, budgets: list[float], datasets: list[str], names: list[str], seeds: int, out: Path, jobs: int,
    party_a: str | None, command: str,
) -> None:
    from contextlib import ExitStack

    from vesper.benchmarks import extractor_sweep as sweep
    from vesper.coordinator.processes import LocalCluster, ServiceStartError
    from vesper.coordinator.run_client import RunClientError, drive_run

    def driver(address: str) -> Callable[[RunConfig], RunSummary]:
        return lambda config: drive_run(address, config, console)

    try:
        with ExitStack() as stack:
            if party_a is not None:
                drivers = [driver(party_a)] * jobs
            else:
                clusters = [stack.enter_context(LocalCluster((out / f"cluster-{i}").resolve())) for i in range(jobs)]
                drivers = [driver(c.party_a_address) for c in clusters]
            rows = sweep.run_sweep(base, budgets, datasets, names, seeds, out, drivers, console)
    except (ServiceStartError, RunClientError) as exc:
        fail(str(exc), getattr(exc, "exit_code", 1))
    (out / "results.md").write_text(sweep.markdown(rows, base, budgets, seeds, command) + "\n")
    sweep.plot(rows, budgets, out / "results.png")
    console.print((out / "results.md").read_text(), highlight=False)
    console.print(f"wrote {out / 'results.csv'}, {out / 'results.md'} and {out / 'results.png'}", highlight=False)


bench_app.command("label-privacy")(label_privacy_command)


bench_app.command("audit")(audit_bench_command)


bench_app.command("utility")(utility_command)


bench_app.command("degradation")(degradation_command)


bench_app.command("anchors")(anchors_command)


bench_app.command("demo-table")(demo_table_command)


bench_app.command("results")(results_command)


bench_app.command("soak")(soak_command)


bench_app.command("perf")(perf_command)


bench_app.command("device")(device_command)


bench_app.command("import")(import_command)


@bench_app.command("snr")
def bench_snr(
    dataset: str = typer.Option("cora", "--dataset", help="A bundled name or an .npz path."),
    extractor: Optional[list[str]] = typer.Option(
        None, "--extractor", help="Extractors to profile (repeat; default pmp-gin, pmp-gcn, gap)."
    ),
    epsilon: str = typer.Option("4", "--epsilon", help="The run's budget, for calibrating z."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file whose [run] section sets the run (epochs, dim, fanout, ...)."),
    dim: Optional[int] = typer.Option(None, "--dim", help="d, width of every released embedding.", min=1),
    fanout: Optional[int] = typer.Option(None, "--fanout", help="D, neighbours sampled per node and layer (0 = all).", min=0),
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Training epochs of the planned run.", min=1),
) -> None:
    """Neighbourhood signal against noise per degree, at the z the accountant would calibrate.

    Local and free: nothing is released or charged. Shows where an extractor's noisy
    aggregate can carry information (signal norm above the noise norm θ√d).
    """
    from vesper.benchmarks.signal_to_noise import profile
    from vesper.common.dataset_files import DatasetError, resolve_dataset

    run = run_settings(load_settings(config), {
        "privacy.epsilon": parse_epsilon(epsilon), "extractor.dim": dim, "extractor.fanout": fanout, "epochs": epochs,
    })
    try:
        path = resolve_dataset(dataset)
    except DatasetError as exc:
        fail(str(exc))
    for name in extractor or ["pmp-gin", "pmp-gcn", "gap"]:
        try:
            found = profile(run, path, name)
        except (ValueError, KeyError) as exc:
            errors.print(f"{name}: cannot profile: {exc}")
            continue
        table = Table(box=box.SIMPLE_HEAD, title=(
            f"{name} on {dataset} at ε={epsilon}, {run.epochs} epochs: z={found.noise_multiplier:.3g}, "
            f"θ={found.noise_std:.3g}, d={found.dim}"
        ))
        for column in ("degree", "nodes", "mean ‖a_v‖", "noise θ√d", "signal/noise", "nodes above noise"):
            table.add_column(column, justify="right")
        for b in found.buckets:
            degree = str(b.low) if b.low == b.high else (f"{b.low}–{b.high}" if b.high < 10**9 else f"≥{b.low}")
            table.add_row(
                degree, str(b.nodes), f"{b.signal:.3g}", f"{b.noise:.3g}", f"{b.signal / b.noise:.3f}",
                f"{100 * b.readable:.1f} %",
            )
        console.print(table)
