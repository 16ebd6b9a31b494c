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

This module writes the report and holds the command; the rest is split by concern:
:mod:`utility_options` (axes, presets, options), :mod:`utility_datasets` (datasets and the
synthetic specs), :mod:`utility_runs` (planning and running the grid), :mod:`utility_report`
(results.md) and :mod:`utility_plot` (the figures).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from pydantic import ValidationError

from vesper.benchmarks.extractor_sweep import Traits, registry_traits
from vesper.benchmarks.harness import parse_epsilons
from vesper.benchmarks.utility_datasets import (
    BenchDataset,
    SpecMismatch,
    array_digest,
    ensure_synthetic,
    resolve_datasets,
    synthetic_spec,
)
from vesper.benchmarks.utility_options import (
    ACCOUNTINGS,
    DATASETS,
    DECODERS,
    EPSILONS,
    FIRST_EXTRACTORS,
    FULL,
    QUICK,
    SYNTHETIC_NODES,
    SYNTHETIC_PROFILES,
    TOLOKERS,
    Preset,
    UtilityOptions,
    format_epsilon,
    installed_extractors,
)
from vesper.benchmarks.utility_plot import plot
from vesper.benchmarks.utility_report import SERVED_MARK, markdown
from vesper.benchmarks.utility_runs import UtilityRun, console, estimated_seconds, open_drivers, plan_text, run_utility
from vesper.common.config import RunConfig, load_config

if TYPE_CHECKING:
    from vesper.benchmarks.findings import Finding

# the benchmark's pieces, importable from here as before the split
__all__ = [
    "ACCOUNTINGS", "DATASETS", "DECODERS", "EPSILONS", "FIRST_EXTRACTORS", "FULL", "QUICK", "SERVED_MARK",
    "SYNTHETIC_NODES", "SYNTHETIC_PROFILES", "TOLOKERS", "BenchDataset", "Preset", "SpecMismatch", "UtilityOptions",
    "UtilityRun", "array_digest", "base_run", "console", "ensure_synthetic", "estimated_seconds", "format_epsilon",
    "installed_extractors", "markdown", "open_drivers", "plan_text", "plot", "resolve_datasets", "run_utility",
    "synthetic_spec", "utility_command", "write_report",
]


# -- the report -----------------------------------------------------------------------------------
def write_report(
    run: UtilityRun, options: UtilityOptions, *, traits: Traits = registry_traits,
) -> list[Finding]:
    """Write OUT/results.md and OUT/plots/utility-<decoder>.png; return the findings (for docs/results.md:
    ``findings.markdown(found, densities)`` renders them)."""
    from vesper.benchmarks import findings

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
        help="cora, tolokers, synthetic-dense, synthetic-sparse, or an .npz path (repeat; default all four); "
        "also twitch-engb, synthetic-heterophilous, and synthetic-dense-100k / synthetic-sparse-100k "
        "(100,000 nodes whatever --synthetic-nodes says).",
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
        None, "--config", "-c", help="TOML file whose [run] section every run starts from; each extractor's own defaults (vesper extractors) apply over it."
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
    run = _run_or_exit(options)
    found = write_report(run, options)
    console.print((options.out / "results.md").read_text(), highlight=False)
    console.print(
        f"wrote {options.out / 'results.csv'}, {options.out / 'results.md'} and {options.out / 'plots'}; "
        + ", ".join(f"({f.key}) {f.accounting}/{f.decoder}: {f.outcome}" for f in found),
        highlight=False,
    )



def _run_or_exit(options: UtilityOptions) -> UtilityRun:
    """:func:`run_utility`, its errors printed and turned into the command's exit status: 2 when
    OUT/data holds another synthetic graph, 1 when the services fail."""
    from vesper.coordinator.processes import ServiceStartError
    from vesper.coordinator.run_client import RunClientError

    try:
        return run_utility(options, console)
    except SpecMismatch as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    except (ServiceStartError, RunClientError) as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(1) from None
