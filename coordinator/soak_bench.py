"""``vesper bench soak``: a long run through the three services, watching them for leaks.

One run of PMP-GCN (the core method) at a finite ε under visible-batch accounting, on a
synthetic graph (:mod:`vesper.coordinator.synthetic`), through a :class:`LocalCluster`:
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
"""

from __future__ import annotations

import math
import os
import shlex
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Literal

import typer
from pydantic import BaseModel, Field
from rich import box
from rich.console import Console
from rich.table import Table

from vesper.common.config import RunConfig, RunSummary
from vesper.coordinator.machine_info import Machine

console = Console()

EXIT_RUN_FAILED = 1
EXIT_GOAL_FAILED = 6
RSS_TOLERANCE = 0.10
SERVICES = ("accountant", "party-b", "party-a")
COORDINATOR = "coordinator"
DATASET_NAME = "soak-synthetic"
Measure = Literal["rss", "fds", "threads"]


# -- sampling /proc ---------------------------------------------------------------------------
class ProcessGone(RuntimeError):
    """A sampled process no longer exists: a service died during the soak."""


class ProcessSample(BaseModel):
    rss_kib: int = Field(description="VmRSS of /proc/PID/status")
    fds: int = Field(description="entries of /proc/PID/fd")
    threads: int = Field(description="entries of /proc/PID/task")
    thread_names: dict[str, int] = Field(
        default_factory=dict,
        description="threads per name (/proc/PID/task/TID/comm): which kind of thread a change is "
        "(gRPC's own threads are named; Python's are not, and show as the process's name)",
    )
    fd_kinds: dict[str, int] = Field(
        default_factory=dict, description="open file descriptors per target: socket, pipe, anon_inode:..., or the file"
    )


class Sample(BaseModel):
    step: int = Field(description="training steps done when the sample was taken")
    seconds: float = Field(description="since the run's first training step")
    kind: Literal["warmup", "start", "periodic", "end"]
    processes: dict[str, ProcessSample]


def read_process(pid: int) -> ProcessSample:
    """One process's RSS, open file descriptors and threads, from /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds_listed = os.listdir(f"/proc/{pid}/fd")
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        raise ProcessGone(f"process {pid} has exited") from None
    kinds: Counter[str] = Counter()
    for fd in fds_listed:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except (FileNotFoundError, OSError):
            continue  # closed between the listing and the read
        kinds[target.split(":[", 1)[0] if ":[" in target else target] += 1
    names: Counter[str] = Counter()
    for task in tasks:
        try:
            names[Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()] += 1
        except FileNotFoundError:
            continue  # the thread ended between the listing and the read
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            if unit != "kB":
                raise ValueError(f"/proc/{pid}/status reports VmRSS in {unit!r}, expected kB")
            return ProcessSample(
                rss_kib=int(value), fds=len(fds_listed), threads=len(tasks), thread_names=dict(names), fd_kinds=dict(kinds),
            )
    raise ProcessGone(f"process {pid} has no VmRSS (a zombie: it has exited)")


def command_line(pid: int) -> str:
    """What the process runs, so the report shows that each PID was the service named."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        raise ProcessGone(f"process {pid} has exited") from None
    return shlex.join(part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0"))


class StepSampler:
    """Samples the processes from a thread of its own, at step thresholds the run crosses.

    The main thread follows the run's progress events and calls :meth:`advance`; the
    sampler wakes when the step reaches the next threshold and reads /proc at the step
    the run is then at: from step 1 every ``every`` steps during the warm-up (for the
    plot), the start sample at ``warmup_step``, then every ``every`` steps. :meth:`finish`
    takes the end sample and stops the thread.
    """

    def __init__(self, pids: dict[str, int], warmup_step: int, every: int) -> None:
        self.pids = pids
        self.warmup_step = max(1, warmup_step)
        self.every = max(1, every)
        self.samples: list[Sample] = []
        self.error: ProcessGone | None = None
        self._step = 0
        self._started_at: float | None = None
        self._final = False
        self._condition = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="soak-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def advance(self, step: int) -> None:
        with self._condition:
            if self._started_at is None:
                self._started_at = time.monotonic()
            self._step = step
            self._condition.notify()

    def finish(self) -> list[Sample]:
        """The end sample (at the current step), then the thread stops."""
        with self._condition:
            self._final = True
            self._condition.notify()
        self._thread.join()
        return self.samples

    def _take(self, step: int, kind: Literal["warmup", "start", "periodic", "end"]) -> None:
        elapsed = 0.0 if self._started_at is None else time.monotonic() - self._started_at
        processes = {name: read_process(pid) for name, pid in self.pids.items()}
        self.samples.append(Sample(step=step, seconds=elapsed, kind=kind, processes=processes))

    def _next_threshold(self, step: int, started: bool) -> int:
        if not started:
            return min(self.warmup_step, 1 + (step - 1) // self.every * self.every + self.every)
        # the next multiple of `every` after this step, counted from the start sample
        return self.warmup_step + (step - self.warmup_step) // self.every * self.every + self.every

    def _loop(self) -> None:
        threshold, started = min(1, self.warmup_step), False
        try:
            while True:
                with self._condition:
                    self._condition.wait_for(lambda: self._final or self._step >= threshold)  # noqa: B023 (called within this iteration)
                    step, final = self._step, self._final
                if final:
                    if started:
                        if self.samples[-1].kind == "periodic" and self.samples[-1].step == step:
                            self.samples.pop()  # the last step crossed a threshold too: one sample of it
                        self._take(step, "end")
                    return
                kind = "periodic" if started else ("start" if step >= self.warmup_step else "warmup")
                self._take(step, kind)
                started = started or kind == "start"
                threshold = self._next_threshold(step, started)
        except ProcessGone as exc:
            self.error = exc

    @property
    def judged(self) -> list[Sample]:
        """The start sample and what follows it: what the goals are judged on."""
        return [s for s in self.samples if s.kind != "warmup"]


# -- the verdict ------------------------------------------------------------------------------
class Goal(BaseModel):
    process: str
    measure: Measure
    start: int
    end: int
    peak: int
    passed: bool
    rule: str
    change: str = Field("", description="FDs and threads: which kinds changed from start to end, e.g. '+1 socket'")
    last_change_step: int | None = Field(
        None, description="the step of the last sample whose count differed from the one before: a count that "
        "moved once and then stayed is a pool growing to its size, one that keeps moving is a leak",
    )

    @property
    def ratio(self) -> float:
        return self.end / self.start if self.start else math.inf


def judge(samples: list[Sample], rss_tolerance: float = RSS_TOLERANCE) -> list[Goal]:
    """Per process: RSS flat (end within ±tolerance of start), no more FDs or threads at the end.

    Warm-up samples are left out; the first sample left is the start and the last the
    end. Fewer FDs or threads at the end is not a leak (a connection the start had open
    may have closed).
    """
    samples = [s for s in samples if s.kind != "warmup"]
    if len(samples) < 2:
        raise ValueError(f"{len(samples)} sample(s): a start and an end are needed (did the run end before its warm-up?)")
    first, last = samples[0], samples[-1]
    goals: list[Goal] = []
    for name, start in first.processes.items():
        end = last.processes.get(name)
        if end is None:
            raise ValueError(f"the end sample has no entry for {name}")
        series = [s.processes[name] for s in samples if name in s.processes]
        # |end - start| <= tolerance × start: the ratio's float error would fail exactly +10 %
        flat = abs(end.rss_kib - start.rss_kib) <= rss_tolerance * start.rss_kib
        goals.append(Goal(
            process=name, measure="rss", start=start.rss_kib, end=end.rss_kib,
            peak=max(p.rss_kib for p in series), passed=flat,
            rule=f"RSS end/start within 1 ± {rss_tolerance:g}",
        ))
        for measure, kinds in (("fds", "fd_kinds"), ("threads", "thread_names")):
            before, after = getattr(start, measure), getattr(end, measure)
            goals.append(Goal(
                process=name, measure=measure, start=before, end=after,
                peak=max(getattr(p, measure) for p in series), passed=after <= before,
                rule=f"{'file descriptors' if measure == 'fds' else 'threads'} at the end ≤ at the start",
                change=_kind_change(getattr(start, kinds), getattr(end, kinds)),
                last_change_step=_last_change([(s.step, getattr(s.processes[name], measure)) for s in samples if name in s.processes]),
            ))
    return goals


def _last_change(series: list[tuple[int, int]]) -> int | None:
    changes = [step for (_, before), (step, value) in zip(series, series[1:]) if value != before]
    return changes[-1] if changes else None


def _kind_change(before: dict[str, int], after: dict[str, int]) -> str:
    """'+1 socket, -1 pipe': the kinds whose count differs between two samples."""
    changes = [(kind, after.get(kind, 0) - before.get(kind, 0)) for kind in sorted(set(before) | set(after))]
    return ", ".join(f"{delta:+d} {kind}" for kind, delta in changes if delta)


# -- the plan ---------------------------------------------------------------------------------
class SoakPlan(BaseModel):
    requested_steps: int
    nodes: int
    edges: int
    train_nodes: int
    batch_size: int
    steps_per_epoch: int
    epochs: int

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch


def plan_steps(requested_steps: int, train_nodes: int, steps_per_epoch: int) -> tuple[int, int, int]:
    """(batch size, steps per epoch, epochs) that train at least ``requested_steps``.

    Exactly that many when it is a multiple of the steps per epoch, else less than one
    epoch more: party A cuts each epoch's T roots into ``ceil(T / batch)`` batches.
    """
    if requested_steps < 1 or train_nodes < 1 or steps_per_epoch < 1:
        raise ValueError("steps, training nodes and steps per epoch must all be at least 1")
    batch = math.ceil(train_nodes / min(steps_per_epoch, train_nodes))
    per_epoch = math.ceil(train_nodes / batch)
    return batch, per_epoch, math.ceil(requested_steps / per_epoch)


# -- the report -------------------------------------------------------------------------------
class RunOutcome(BaseModel):
    run_id: str
    status: str
    message: str
    extractor: str
    accounting: str
    epsilon_budget: float
    epsilon_spent: float
    delta: float
    noise_multiplier: float | None
    steps: int

    @classmethod
    def of(cls, summary: RunSummary) -> RunOutcome:
        return cls(
            run_id=summary.run_id, status=summary.status, message=summary.message, extractor=summary.extractor,
            accounting=summary.accounting, epsilon_budget=summary.epsilon_budget, epsilon_spent=summary.epsilon_spent,
            delta=summary.delta, noise_multiplier=summary.noise_multiplier, steps=summary.steps,
        )


class SoakReport(BaseModel):
    command: str
    machine: Machine
    plan: SoakPlan
    run: RunOutcome | None
    failure: str = ""
    warmup_fraction: float
    warmup_step: int
    sample_every: int
    training_seconds: float
    wall_seconds: float
    pids: dict[str, int]
    command_lines: dict[str, str]
    samples: list[Sample]
    goals: list[Goal]

    @property
    def judged(self) -> list[Sample]:
        return [s for s in self.samples if s.kind != "warmup"]

    @property
    def steps_done(self) -> int:
        return self.samples[-1].step if self.samples else 0

    @property
    def steps_per_second(self) -> float:
        return self.steps_done / self.training_seconds if self.training_seconds > 0 else 0.0

    def window_rates(self) -> tuple[tuple[int, int, float], tuple[int, int, float]] | None:
        """(first step, last step, steps/s) over the first and the last fifth of the judged
        samples: a step that slows as the ledger grows shows here."""
        judged = self.judged
        span = len(judged) // 5
        if span < 1:
            return None

        def rate(a: Sample, b: Sample) -> tuple[int, int, float]:
            seconds = b.seconds - a.seconds
            return a.step, b.step, (b.step - a.step) / seconds if seconds > 0 else 0.0

        return rate(judged[0], judged[span]), rate(judged[-1 - span], judged[-1])

    @property
    def passed(self) -> bool:
        return not self.failure and bool(self.goals) and all(goal.passed for goal in self.goals)


# -- the run ----------------------------------------------------------------------------------
class SoakOptions(BaseModel):
    steps: int = Field(20_000, ge=1)
    nodes: int = Field(20_000, ge=100)
    steps_per_epoch: int = Field(100, ge=1)
    epsilon: float = Field(8.0, gt=0)
    samples: int = Field(100, ge=2, description="periodic samples between the start and the end")
    warmup: float = Field(0.05, ge=0.0, lt=1.0, description="fraction of the steps before the start sample")
    seed: int = 0
    workdir: Path = Path(".vesper/soak")

    def command(self) -> str:
        return (
            f"vesper bench soak --steps {self.steps} --nodes {self.nodes} --steps-per-epoch {self.steps_per_epoch} "
            f"--epsilon {self.epsilon:g} --samples {self.samples} --warmup {self.warmup:g}"
        )


class SoakError(RuntimeError):
    """The soak could not run (services did not start, a process died, the run failed)."""


def synthetic_graph(options: SoakOptions) -> tuple[Path, int, int, int]:
    """(path, nodes, edges, B's training nodes) of the soak's graph, generated once per spec."""
    from vesper.coordinator.synthetic import SyntheticSpec, generate, save_npz

    spec = SyntheticSpec(num_nodes=options.nodes, profile="sparse", seed=options.seed)
    path = options.workdir / "data" / f"synthetic-sparse-{options.nodes}-seed{options.seed}.npz"
    graph = generate(spec)  # cheap next to the run (20,000 nodes: under a second), and gives the counts
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        save_npz(graph, path)
    return path, graph.num_nodes, graph.num_edges, int(graph.train_masks.sum())


def run_config(options: SoakOptions, plan: SoakPlan) -> RunConfig:
    """PMP-GCN, visible-batch, finite ε: every step is charged and committed before it is sent."""
    return RunConfig.model_validate({
        "dataset": DATASET_NAME, "epochs": plan.epochs, "batch_size": plan.batch_size, "seed": options.seed,
        "privacy": {"epsilon": options.epsilon, "accounting": "visible-batch"},
        "extractor": {"name": "pmp-gcn"},
    })


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


# -- output -----------------------------------------------------------------------------------
def rss_trend(samples: list[Sample], process: str) -> float | None:
    """Least-squares slope of RSS over the judged samples, in KiB per 1,000 steps: a leak
    too slow to cross the 10 % band in this run still shows as a steady positive slope."""
    points = [(s.step, s.processes[process].rss_kib) for s in samples if s.kind != "warmup" and process in s.processes]
    if len(points) < 3:
        return None
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return None
    return 1000 * sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def _mib(kib: int) -> str:
    return f"{kib / 1024:.1f}"


def _verdict(passed: bool) -> str:
    return "pass" if passed else "FAIL"


def goal_rows(report: SoakReport) -> list[list[str]]:
    """One row per process: RSS start, end, peak, end/start; FDs and threads start → end; verdict."""
    rows = []
    for name in report.pids:
        goals = {g.measure: g for g in report.goals if g.process == name}
        if not goals:
            continue
        rss, fds, threads = goals["rss"], goals["fds"], goals["threads"]
        failed = [measure for measure, goal in goals.items() if not goal.passed]
        trend = rss_trend(report.samples, name)
        rows.append([
            name, str(report.pids[name]), f"{_mib(rss.start)} → {_mib(rss.end)}", _mib(rss.peak), f"{rss.ratio:.3f}",
            "-" if trend is None else f"{trend:+.0f}",
            f"{fds.start} → {fds.end}", f"{threads.start} → {threads.end}",
            "FAIL: " + ", ".join(failed) if failed else "pass",
        ])
    return rows


HEADERS = ["process", "PID", "RSS MiB start → end", "RSS MiB peak", "end/start", "KiB/1k steps", "FDs", "threads", "goals"]


def print_table(report: SoakReport, out: Console) -> None:
    """The table of docs/soak.md, narrowed to fit a terminal (no PID, no peak)."""
    table = Table(box=box.SIMPLE_HEAD, title=f"soak: {report.steps_done} steps, {report.steps_per_second:.1f} steps/s")
    for header in ("process", "RSS MiB", "end/start", "KiB/1k", "FDs", "threads", "goals"):
        table.add_column(header, justify="left" if header in ("process", "goals") else "right", no_wrap=True)
    for name, _pid, rss, _peak, ratio, trend, fds, threads, verdict in goal_rows(report):
        table.add_row(name, rss.replace(" ", ""), ratio, trend, fds.replace(" ", ""), threads.replace(" ", ""), verdict)
    out.print(table)
    if report.failure:
        out.print(f"[bold red]{report.failure}[/]", highlight=False)
    out.print(
        "[bold green]all goals met[/]" if report.passed else "[bold red]a goal failed[/]: see the table", highlight=False
    )


def _window_text(report: SoakReport) -> str:
    windows = report.window_rates()
    if windows is None:
        return ""
    (a0, a1, early), (b0, b1, late) = windows
    return (
        f" Throughput {early:.1f} steps/s over steps {a0}–{a1} and {late:.1f} over steps {b0}–{b1} (not a goal: "
        "the machine is shared, so it also measures what else ran)."
    )


def markdown(report: SoakReport, plot_name: str) -> str:
    plan, run = report.plan, report.run
    exact = "exactly the requested number" if plan.total_steps == plan.requested_steps else (
        f"{plan.total_steps - plan.requested_steps} more than the {plan.requested_steps} requested (less than one epoch)"
    )
    privacy = (
        f"{run.extractor}, {run.accounting}, ε budget {run.epsilon_budget:g} at δ = {run.delta:.3g}, ε spent "
        f"{run.epsilon_spent:.4g}, noise multiplier z = {run.noise_multiplier:.4g}; run `{run.run_id}` ended "
        f"**{run.status}**" if run else "no run summary"
    )
    table = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    table += ["| " + " | ".join(row) + " |" for row in goal_rows(report)]
    goals = [
        f"- {g.process}: {g.rule}: "
        + (f"{_mib(g.start)} → {_mib(g.end)} MiB (×{g.ratio:.3f})" if g.measure == "rss" else f"{g.start} → {g.end}")
        + (f" ({g.change})" if g.change else "")
        + (f"; last changed at step {g.last_change_step}" if g.last_change_step is not None else "")
        + f" — **{_verdict(g.passed)}**"
        for g in report.goals
    ]
    lines = [
        "# Soak: the services over a long run",
        "",
        f"Generated by `{report.command}` (`make bench-soak`) on {report.machine.cores} CPUs "
        f"({report.machine.cpu_model}), Python {report.machine.python}, {report.machine.system}. Nothing below is "
        "typed by hand; the samples are in "
        f"[{Path(plot_name).with_suffix('.json').name}]({Path(plot_name).with_suffix('.json').name}).",
        "",
        f"**Verdict: {'every goal met' if report.passed else 'a goal FAILED'}.**"
        + (f" {report.failure}" if report.failure else ""),
        "",
        "## What ran",
        "",
        f"The accountant, party B and party A as three processes on loopback (`LocalCluster`), one run through "
        f"them: {privacy}. Every training step's release is charged at the accountant and committed to its SQLite "
        f"ledger before A sends it to B. Graph: sparse synthetic CSBM (`vesper data synth --profile sparse`), "
        f"{plan.nodes} nodes, {plan.edges} edges, {plan.train_nodes} of them B's training roots. Steps: batch "
        f"{plan.batch_size} gives {plan.steps_per_epoch} steps per epoch, × {plan.epochs} epochs = "
        f"{plan.total_steps} steps, {exact}.",
        "",
        f"Training took {report.training_seconds:.0f} s ({report.steps_per_second:.1f} steps/s, from the first "
        f"to the last training step); the whole command {report.wall_seconds:.0f} s."
        + _window_text(report),
        "",
        "## When each process was sampled",
        "",
        f"From `/proc/PID/status` (VmRSS), `/proc/PID/fd` and `/proc/PID/task`, by a sampler thread of the "
        f"coordinator following the run's progress events. **Start**: step {report.warmup_step}, after a warm-up "
        f"of {report.warmup_fraction:.0%} of the steps (graph loaded, the first epochs' tensors, buffers and gRPC "
        f"streams made; the accountant's SQLite page cache, at most 2 MiB by default, may still be filling as the "
        f"ledger grows); the warm-up's own samples (from step 1, every {report.sample_every} "
        f"steps) are plotted, not judged. Periodic samples follow every {report.sample_every} steps. **End**: at "
        "the last training step, while the training stream is still open — the state the start sample saw — "
        "before the evaluation "
        "pass and before the services stop.",
        "",
        "## Result",
        "",
        *table,
        "",
        "Goals: RSS at the end within ±10 % of the start (flat); no more file descriptors and no more threads "
        "at the end than at the start (no leak). *KiB/1k steps* is the least-squares slope of RSS over the judged "
        "samples (not a goal): a leak too slow to leave the band in this run shows as a steady positive slope.",
        "",
        *goals,
        "",
        f"![RSS over the steps]({plot_name})",
        "",
        "The coordinator is the process running this command (it holds the progress stream and the sampler).",
        "",
    ]
    return "\n".join(lines)


def plot(report: SoakReport, path: Path) -> None:
    """RSS over the steps, one panel per process, with the ±10 % band around the start."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    names = list(report.pids)
    figure, axes = plt.subplots(2, 2, figsize=(10, 6.5), dpi=110, squeeze=False)
    for axis, name in zip(axes.flat, names, strict=False):
        steps = [s.step for s in report.samples if name in s.processes]
        rss = [s.processes[name].rss_kib / 1024 for s in report.samples if name in s.processes]
        judged = [s.processes[name].rss_kib / 1024 for s in report.judged if name in s.processes]
        if not judged:
            continue
        start = judged[0]
        axis.axvspan(0, report.warmup_step, color="0.5", alpha=0.12, label="warm-up (not judged)")
        axis.axhspan(start * (1 - RSS_TOLERANCE), start * (1 + RSS_TOLERANCE), color="tab:green", alpha=0.12,
                     label="start ± 10 %")
        axis.plot(steps, rss, marker=".", markersize=3, color="tab:blue", label="RSS")
        axis.axhline(start, color="tab:green", linestyle="--", linewidth=0.8)
        ratio = judged[-1] / start if start else math.inf
        axis.set_title(f"{name} (PID {report.pids[name]}): end/start {ratio:.3f}", fontsize=10)
        axis.set_xlabel("training steps")
        axis.set_ylabel("RSS (MiB)")
        # zoomed on the band, so that growth inside it shows; what lies outside still shows whole
        axis.set_ylim(min(min(rss), start * (1 - RSS_TOLERANCE)) * 0.97, max(max(rss), start * (1 + RSS_TOLERANCE)) * 1.03)
        axis.set_xlim(left=0)
        axis.grid(alpha=0.3)
        axis.legend(loc="lower right", fontsize=8)
    figure.suptitle(f"vesper soak: {report.steps_done} steps, {report.steps_per_second:.1f} steps/s", fontsize=11)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    plt.close(figure)


def write_report(report: SoakReport, markdown_path: Path) -> tuple[Path, Path, Path]:
    """docs/soak.md, the plot and the samples (JSON) next to it."""
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    png, data = markdown_path.with_suffix(".png"), markdown_path.with_suffix(".json")
    data.write_text(report.model_dump_json(indent=1) + "\n")
    plot(report, png)
    markdown_path.write_text(markdown(report, png.name))
    return markdown_path, png, data


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
