"""``vesper bench soak``: a long run through the three services, watching them for leaks.

One run of PMP-GCN (the core method) at a finite ε under visible-batch accounting, on a
synthetic graph (:mod:`vesper.benchmarks.synthetic`), through a :class:`LocalCluster`:
the accountant charges and commits every step's release, party B decodes it, party A
trains on B's gradients. A sampler thread reads, from ``/proc``, each service's resident
memory (``VmRSS``), open file descriptors (``/proc/PID/fd``) and threads
(``/proc/PID/task``), and the same of this process, the coordinator:

* the **start** sample once the warm-up is over (the first 5 % of the steps by default:
  the graph is loaded, the first epochs' tensors, buffers and gRPC streams exist);
* periodic samples, so the plot shows a trend and not two points;
* the **end** sample at the last training step, while the training stream is still open:
  the same state as the start sample, before the evaluation pass and the shutdown.

The goals: each process's RSS at the end within ±10 % of the start, and no more file
descriptors or threads at the end than at the start. They are judged by :func:`judge`,
reported as a table and as docs/soak.md with a plot of RSS over the steps, and the
command exits 6 when a goal fails (1 when the run itself failed).

How the step count is met: the graph's B-side training nodes T are cut into batches of
``ceil(T / steps_per_epoch)`` roots, which gives ``ceil(T / batch)`` steps per epoch (the
requested ``steps_per_epoch`` whenever T allows), and the run trains ``ceil(steps / that)``
epochs: exactly the requested steps when they are a multiple of the steps per epoch, else
less than one epoch more (:func:`plan_steps`).

This module runs the soak and holds the command; the rest is split by concern:
:mod:`soak_sampling` (/proc and the sampler thread), :mod:`soak_verdict` (the goals),
:mod:`soak_plan` (options, graph, steps), :mod:`soak_report` (what a soak found) and
:mod:`soak_output` (docs/soak.md, the plot, the terminal table).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

import typer
from rich.console import Console

from vesper.benchmarks.harness import Machine
from vesper.benchmarks.soak_output import markdown, plot, print_table, write_report
from vesper.benchmarks.soak_plan import DATASET_NAME, SoakOptions, SoakPlan, plan_steps, run_config, synthetic_graph
from vesper.benchmarks.soak_report import RunOutcome, SoakReport
from vesper.benchmarks.soak_sampling import (
    ProcessGone,
    ProcessSample,
    Sample,
    StepSampler,
    command_line,
    read_process,
)
from vesper.benchmarks.soak_verdict import RSS_TOLERANCE, Goal, judge
from vesper.common.config import RunSummary

# the soak's pieces, importable from here as before the split
__all__ = [
    "EXIT_GOAL_FAILED", "EXIT_RUN_FAILED", "RSS_TOLERANCE", "Goal", "ProcessGone", "ProcessSample", "RunOutcome",
    "Sample", "SoakError", "SoakOptions", "SoakPlan", "SoakReport", "StepSampler", "judge", "markdown", "plan_steps",
    "plot", "print_table", "read_process", "run_soak", "soak_command", "write_report",
]

console = Console()

EXIT_RUN_FAILED = 1
EXIT_GOAL_FAILED = 6
SERVICES = ("accountant", "party-b", "party-a")
COORDINATOR = "coordinator"


# -- the run ----------------------------------------------------------------------------------
class SoakError(RuntimeError):
    """The soak could not run (services did not start, a process died, the run failed)."""


def run_soak(options: SoakOptions, out: Console) -> SoakReport:
    """Start the services, train, sample, stop the services; the report (not yet written)."""
    from vesper.coordinator.processes import LocalCluster, ServiceStartError
    from vesper.coordinator.run_client import RunClientError, drive_run

    started = time.monotonic()
    path, nodes, edges, train_nodes = synthetic_graph(options)
    batch, per_epoch, epochs = plan_steps(options.steps, train_nodes, options.steps_per_epoch)
    plan = SoakPlan(
        requested_steps=options.steps, nodes=nodes, edges=edges, train_nodes=train_nodes, batch_size=batch,
        steps_per_epoch=per_epoch, epochs=epochs,
    )
    total = plan.total_steps
    warmup_step = max(1, math.ceil(options.warmup * total))
    every = max(1, (total - warmup_step) // options.samples)
    out.print(
        f"soak: {total} steps = {epochs} epochs × {per_epoch} steps ({train_nodes} training roots, batch {batch}) "
        f"on a sparse synthetic graph of {nodes} nodes and {edges} edges; start sample at step {warmup_step}, "
        f"then every {every} steps", highlight=False,
    )
    summary: RunSummary | None = None
    failure = ""
    first_step_at: list[float] = []
    last_step_at: list[float] = []
    cluster_dir = (options.workdir / "cluster").resolve()
    # a fresh ledger and fresh workdirs: every soak measures the same start, not the runs before it
    shutil.rmtree(cluster_dir, ignore_errors=True)
    try:
        with LocalCluster(cluster_dir, datasets={DATASET_NAME: str(path.resolve())}) as cluster:
            pids = {name: cluster.services[name].process.pid for name in SERVICES} | {COORDINATOR: os.getpid()}
            lines = {name: command_line(pid) for name, pid in pids.items()}
            sampler = StepSampler(pids, warmup_step, every)
            sampler.start()
            finished = False

            def on_step(step: int, run_total: int) -> None:
                nonlocal finished
                now = time.monotonic()
                if not first_step_at:
                    first_step_at.append(now)
                last_step_at[:] = [now]
                sampler.advance(step)
                if step >= run_total and not finished:
                    finished = True
                    sampler.finish()  # inside the stream: the state the start sample saw

            try:
                summary = drive_run(
                    cluster.party_a_address, run_config(options, plan), out,
                    on_progress=lambda p: on_step(p.step, p.total_steps) if p.phase == "train" and p.total_steps else None,
                )
            finally:
                if not finished:
                    sampler.finish()  # the run ended early: sample what is left of it
            if sampler.error is not None:
                failure = f"a service died during the soak: {sampler.error}"
            elif len(sampler.judged) < 2:
                done = sampler.samples[-1].step if sampler.samples else 0
                failure = f"the run ended after {done} steps, before its start sample at step {warmup_step}"
            elif summary.status != "completed":
                failure = f"the run ended {summary.status}: {summary.message}"
    except (ServiceStartError, RunClientError, ProcessGone) as exc:
        raise SoakError(str(exc)) from exc
    samples = sampler.samples
    training = last_step_at[0] - first_step_at[0] if first_step_at else 0.0
    return SoakReport(
        command=options.command(), machine=Machine.here(), plan=plan, run=RunOutcome.of(summary) if summary else None,
        failure=failure, warmup_fraction=options.warmup, warmup_step=warmup_step, sample_every=every,
        training_seconds=training, wall_seconds=time.monotonic() - started, pids=pids, command_lines=lines,
        samples=samples, goals=judge(samples) if len(sampler.judged) >= 2 else [],
    )


# -- the command ------------------------------------------------------------------------------
def soak_command(
    steps: int = typer.Option(20_000, "--steps", help="Training steps (at least; see --steps-per-epoch).", min=1),
    nodes: int = typer.Option(20_000, "--nodes", help="Nodes of the sparse synthetic graph (half are B's training roots).", min=100),
    steps_per_epoch: int = typer.Option(
        100, "--steps-per-epoch", help="Batches per epoch: batch size = ceil(training roots / this).", min=1
    ),
    epsilon: float = typer.Option(8.0, "--epsilon", help="Edge-level ε budget of the run (finite: every step is charged).", min=1e-6),
    samples: int = typer.Option(100, "--samples", help="Periodic samples between the start and the end sample.", min=2),
    warmup: float = typer.Option(0.05, "--warmup", help="Fraction of the steps before the start sample.", min=0.0, max=0.9),
    workdir: Path = typer.Option(
        Path(".vesper/soak"), "--workdir", help="The graph, and the services' configs, logs and ledger (cluster/, made afresh)."
    ),
    report: Path = typer.Option(
        Path("docs/soak.md"), "--report", help="The markdown to write; the plot (.png) and samples (.json) go next to it."
    ),
) -> None:
    """Train a long run through the three services and watch them for leaks.

    Samples the RSS, open file descriptors and threads of the accountant, party B, party A
    and this process from /proc; goals: RSS flat within 10 % from the end of the warm-up to
    the last step, no more FDs or threads at the end. Exit 6 if a goal fails, 1 if the run
    failed.
    """
    options = SoakOptions(
        steps=steps, nodes=nodes, steps_per_epoch=steps_per_epoch, epsilon=epsilon, samples=samples,
        warmup=warmup, workdir=workdir,
    )
    try:
        result = run_soak(options, console)
    except SoakError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(EXIT_RUN_FAILED) from None
    written = write_report(result, report)
    print_table(result, console)
    console.print(f"wrote {', '.join(str(p) for p in written)}", highlight=False)
    if result.failure:
        raise typer.Exit(EXIT_RUN_FAILED)
    if not result.passed:
        raise typer.Exit(EXIT_GOAL_FAILED)
