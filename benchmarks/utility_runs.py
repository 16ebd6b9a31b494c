"""The runs of ``vesper bench utility``: plan the grid (:mod:`extractor_sweep`), say what is about
to happen, and run what is missing through one driver per job: a LocalCluster each (the
default), running services (``--party-a``), or the same code in one process (``--in-process``)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

from pydantic import BaseModel
from rich.console import Console

from vesper.benchmarks.extractor_sweep import (
    Drive,
    GridCell,
    GridPlan,
    Traits,
    grid_cells,
    plan_grid,
    registry_traits,
    run_grid,
)
from vesper.benchmarks.extractor_table import TableRow, dataset_label, drop_superseded, read_rows
from vesper.benchmarks.utility_datasets import BenchDataset, resolve_datasets
from vesper.benchmarks.utility_options import UtilityOptions

console = Console()


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


# Both parties' secret seeds in the clusters a benchmark starts: a run's secrets then depend on its
# seed alone, so the MLP run and an extractor's edge-free path of one seed draw the same dropout
# keys (common random numbers, docs/utility.md section 7), and a run repeats exactly. Services at
# --party-a keep their own settings.
BENCH_SECRETS = {"secret_seed": 0}


@contextmanager
def open_drivers(options: UtilityOptions, say: Console) -> Iterator[list[Drive]]:
    """One driver per job: its own LocalCluster, the running services at --party-a, or in process
    (the clusters with both parties' ``secret_seed`` set: ``BENCH_SECRETS``)."""
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
                stack.enter_context(InProcessCluster(
                    (options.out / f"in-process-{i}").resolve(), party_a=BENCH_SECRETS, party_b=BENCH_SECRETS,
                ))
                for i in range(options.jobs)
            ]
            yield [cluster.drive for cluster in clusters]
        else:
            clusters = [
                stack.enter_context(LocalCluster(
                    (options.out / f"cluster-{i}").resolve(), party_a=BENCH_SECRETS, party_b=BENCH_SECRETS,
                )) for i in range(options.jobs)
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
    # only the cells this invocation ran: a completed run kept from before stays, even where another
    # completed run shares its key (runs of other days merged into one file, e.g. more MLP seeds)
    kept = {r.run_id for r in plan.done}
    drop_superseded(options.out / "results.csv", (r.key for r in rows if r.run_id not in kept))
    return UtilityRun(datasets=datasets, plan=plan, rows=rows)
