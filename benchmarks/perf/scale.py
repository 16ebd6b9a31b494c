"""Scale: one epoch on synthetic graphs of 10M (and 100M) edges through the three services,
and each service's peak memory (issue #9, item 3; issue #25, item 4).

Graphs from :mod:`vesper.benchmarks.synthetic` (16 float32 features, 2 classes, homophily
0.8, seed 0); the first two are the default runs:

* ``sparse-1m``: 1,000,000 nodes, 10,000,000 edges, the sparse profile (half the nodes
  isolated, lognormal sigma 1): mean degree 20 over all nodes, about 40 over the active ones;
* ``dense-100k``: 100,000 nodes, 10,000,000 edges, the dense profile: mean degree 200;
* ``sparse-10m``: ten times sparse-1m, 10,000,000 nodes and 100,000,000 edges, the same
  profile and mean degree (``--scale-profile sparse-10m``; its file is about 2.4 GB).

Each run has a count W of party A's worker processes (``party_a.workers``, default 1;
``--scale-workers 1 --scale-workers 2`` runs each profile with both). With W > 1 the sampler
also reads each worker process, found by its id in A's ``runs/<id>/workers.json``, and the
figures add each worker's peak and the sum over A's processes.

Per graph, in order:

1. **Generate** it in a child process (``python -m vesper.benchmarks.perf.scale generate``),
   timed, with the child's peak RSS; reused when the file and its spec sidecar exist.
2. **Start** the accountant, party B and party A (:class:`LocalCluster`) with the file as a
   dataset of both parties. With ``cold_cache`` (the default) party A's CSR cache of the file
   is dropped first, so A builds it on its first load, in its own process, as a deployment
   does the first time: A's peak then covers the build too.
3. **One epoch**: PMP-GCN at ε = ``epsilon`` under visible-batch accounting (every step is
   charged and committed before its release is sent), batch 256, over B's training roots:
   B's split of the synthetic file, 50 % of all nodes (500,000 on sparse-1m, 50,000 on
   dense-100k; isolated nodes are roots too), then the evaluation pass over B's validation
   and test nodes (the other 50 %), charged and sent like any release.
4. **Memory**: a thread reads ``/proc/PID/status`` of each service every ``sample_every_s``:
   ``VmRSS`` (sampled maximum per phase) and ``VmHWM`` (the kernel's own peak of resident
   memory, which no sampling interval can miss). A's VmHWM is read once more at A's first
   progress event (the graph is loaded by then: the load's peak) and each service's at the
   run's summary (the lifetime peak). Resident memory counts the pages of the memory-mapped
   CSR that A has touched.

Times are read from A's progress stream at the coordinator: *load* = StartRun to A's first
event (A loads the graph before it answers); *epoch* = the event before the first training
step to the last training step (set-up with B and the calibration are a few ms of it);
*evaluation* = last training step to the summary.

The goal: party A's peak (VmHWM) on sparse-1m with W = 1 under 4 GB (4096 MiB); everything
else is reported. Command: ``vesper bench perf --only scale`` (``--scale-profile sparse-10m
--scale-workers 1 --scale-workers 2`` for the 100M-edge runs), or this module alone:
``python -m vesper.benchmarks.perf.scale run --workdir .vesper/perf/scale``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from vesper.benchmarks.perf.figures import PerfFigure
from vesper.benchmarks.perf.process_memory import MemoryReading, PeakSampler, read_memory  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from vesper.benchmarks.synthetic import SyntheticSpec
    from vesper.common.config import RunConfig

GOAL_A_PEAK_MIB = 4096.0
GOAL_PROFILE = "sparse-1m"  # the goal is stated for 1M nodes / 10M edges
DATASET_ALIAS = "perf-scale"
COMMAND = "vesper bench perf --only scale"
SERVICES = ("accountant", "party-b", "party-a")
KIB_PER_MIB = 1024.0


class ScaleProfile(BaseModel):
    """One synthetic graph of the scale runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    nodes: int = Field(ge=2)
    edges: int = Field(ge=0)
    profile: Literal["sparse", "dense"]
    features: int = 16
    classes: int = 2
    seed: int = 0

    def spec(self) -> SyntheticSpec:
        from vesper.benchmarks.synthetic import SyntheticSpec  # numpy only when a graph is made

        return SyntheticSpec(
            num_nodes=self.nodes, num_classes=self.classes, num_features=self.features, profile=self.profile,
            mean_degree=2.0 * self.edges / self.nodes, seed=self.seed,
        )

    def file_name(self) -> str:
        return f"synthetic-{self.name}-f{self.features}-seed{self.seed}.npz"


DEFAULT_PROFILES = ("sparse-1m", "dense-100k")  # what the command runs unless told (--scale-profile)
PROFILES: dict[str, ScaleProfile] = {
    "sparse-1m": ScaleProfile(name="sparse-1m", nodes=1_000_000, edges=10_000_000, profile="sparse"),
    "dense-100k": ScaleProfile(name="dense-100k", nodes=100_000, edges=10_000_000, profile="dense"),
    # ten times sparse-1m (issue #25, item 4); not in the default runs: run it with --scale-profile sparse-10m
    "sparse-10m": ScaleProfile(name="sparse-10m", nodes=10_000_000, edges=100_000_000, profile="sparse"),
    # small ones: the tests, and trying the command out
    "sparse-20k": ScaleProfile(name="sparse-20k", nodes=20_000, edges=200_000, profile="sparse"),
    "dense-2k": ScaleProfile(name="dense-2k", nodes=2_000, edges=100_000, profile="dense"),
}


# -- the graph --------------------------------------------------------------------------------
class GraphFile(BaseModel):
    """A generated graph and what its generation cost (the spec sidecar of the file)."""

    profile: ScaleProfile
    path: Path
    nodes: int
    edges: int
    train_roots: int
    eval_nodes: int
    generate_seconds: float
    save_seconds: float
    generate_peak_mib: float = Field(description="the generating process's peak RSS (ru_maxrss)")
    reused: bool = False


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def generate_graph(profile: ScaleProfile, path: Path) -> GraphFile:
    """Generate and save ``profile`` to ``path`` in this process (the child's side of :func:`graph_file`)."""
    import numpy as np

    from vesper.benchmarks.synthetic import generate, save_npz

    started = time.perf_counter()
    graph = generate(profile.spec())
    generated = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_npz(graph, path)
    saved = time.perf_counter()
    record = GraphFile(
        profile=profile, path=path, nodes=graph.num_nodes, edges=graph.num_edges,
        train_roots=int(np.count_nonzero(graph.train_masks[0])),
        eval_nodes=int(np.count_nonzero(graph.val_masks[0]) + np.count_nonzero(graph.test_masks[0])),
        generate_seconds=generated - started, save_seconds=saved - generated,
        generate_peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB_PER_MIB,
    )
    tmp = _sidecar(path).with_suffix(".tmp")
    tmp.write_text(record.model_dump_json(indent=1))
    os.replace(tmp, _sidecar(path))
    return record


def graph_file(profile: ScaleProfile, data_dir: Path) -> GraphFile:
    """``profile``'s file in ``data_dir``: reused when its sidecar names the same profile and
    the file exists, else generated in a child process (its own peak RSS, not this process's)."""
    path = (data_dir / profile.file_name()).resolve()
    sidecar = _sidecar(path)
    if path.is_file() and sidecar.is_file():
        try:
            record = GraphFile.model_validate_json(sidecar.read_text())
        except ValueError:
            record = None
        if record is not None and record.profile == profile:
            return record.model_copy(update={"reused": True, "path": path})
    command = [sys.executable, "-m", "vesper.benchmarks.perf.scale", "generate", profile.model_dump_json(), str(path)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"generating {profile.name} failed ({done.returncode}): {done.stderr[-2000:]}")
    return GraphFile.model_validate_json(sidecar.read_text())


# -- one run ----------------------------------------------------------------------------------
class ScaleOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epsilon: float = Field(8.0, gt=0)
    batch_size: int = Field(256, ge=1)
    extractor: str = "pmp-gcn"
    cold_cache: bool = Field(True, description="drop A's CSR cache of the file first: A builds it on its first load")
    sample_every_s: float = Field(0.25, gt=0)
    threads: int | None = Field(
        1, ge=1,
        description="torch intra-op threads of each service (OMP_NUM_THREADS); None: torch's default, all "
        "cores. One: three services on two cores with two threads each spin against each other (measured at "
        "load 5: sparse-1m's epoch took 777 s with torch's default and 70 s with one thread; cProfile of one "
        "release + backward on sparse-20k: 232 ms with two threads, 17 ms with one, the time in torch's linear)",
    )
    seed: int = 0
    workers: int = Field(
        1, ge=1,
        description="party A's worker processes (party_a.workers = W): rank 0 in A's own process and W - 1 "
        "workers, each sampling and encoding its share of every step's roots",
    )

    @property
    def label(self) -> str:
        """How a run's figures name it beside its profile: nothing for one process, ``W=2`` for two."""
        return "" if self.workers == 1 else f"W={self.workers}"


class ScaleRun(BaseModel):
    """What one profile's run measured."""

    graph: GraphFile
    options: ScaleOptions
    status: str
    message: str = ""
    steps: int = 0
    epsilon_spent: float = 0.0
    load_seconds: float = 0.0
    epoch_seconds: float = 0.0
    eval_seconds: float = 0.0
    run_seconds: float = 0.0
    warm_open_seconds: float | None = Field(None, description="the coordinator opening A's cache once A built it")
    cache_build_seconds: float | None = Field(None, description="A's build of the CSR cache (its manifest)")
    a_load_peak_mib: float = Field(0.0, description="A's VmHWM at its first progress event: through the graph load")
    peak_mib: dict[str, float] = Field(
        default_factory=dict, description="VmHWM at the summary (or a larger sampled VmRSS), per service",
    )
    end_split_mib: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="(RssAnon, RssFile) at the summary, per service",
    )
    max_rss_mib: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="phase -> service -> max sampled VmRSS",
    )
    step_phases_ms: dict[str, float] = Field(
        default_factory=dict, description="median ms per phase of A's training steps (A's step_timings.json)",
    )
    worker_peak_mib: dict[str, float] = Field(
        default_factory=dict,
        description="VmHWM of each of A's worker processes (runs/<id>/workers.json), at its last reading",
    )
    samples: int = 0
    load_average: tuple[float, float] = (0.0, 0.0)
    cpus: int = 0


@contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """``name=value`` in os.environ while the services start (they inherit it)."""
    if value is None:
        yield
        return
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def run_config(options: ScaleOptions) -> RunConfig:
    from vesper.common.config import RunConfig

    return RunConfig.model_validate({
        "dataset": DATASET_ALIAS, "epochs": 1, "batch_size": options.batch_size, "seed": options.seed,
        "privacy": {"epsilon": options.epsilon, "accounting": "visible-batch"},
        "extractor": {"name": options.extractor},
    })


def run_profile(graph: GraphFile, workdir: Path, options: ScaleOptions) -> ScaleRun:
    """One epoch of ``graph`` through a fresh LocalCluster in ``workdir``, sampled."""
    import grpc

    from vesper.common.config import RunSummary
    from vesper.common.csr_cache import drop_csr_cache
    from vesper.common.grpc_server import channel_options
    from vesper.coordinator.processes import LocalCluster
    from vesper.proto.v1 import graph_party_pb2 as pb
    from vesper.proto.v1 import graph_party_pb2_grpc as pb_grpc

    if options.cold_cache:
        drop_csr_cache(graph.path)
    from vesper.party_a.workers.group import WORKERS_FILE

    cluster_dir = workdir / "cluster"
    shutil.rmtree(cluster_dir, ignore_errors=True)  # a fresh ledger and fresh run directories
    load_before = os.getloadavg()[0]
    config = run_config(options)
    result = ScaleRun(graph=graph, options=options, status="not started", cpus=os.cpu_count() or 0)
    with _environment("OMP_NUM_THREADS", None if options.threads is None else str(options.threads)):
        cluster = LocalCluster(
            cluster_dir, datasets={DATASET_ALIAS: str(graph.path)},
            party_a={"workers": options.workers} if options.workers > 1 else None,
        )
        with cluster:
            pids = {name: cluster.services[name].process.pid for name in SERVICES}
            workers = _WorkerFinder(cluster_dir / "party_a" / "runs", WORKERS_FILE, options.workers - 1)
            with PeakSampler(pids, options.sample_every_s, discover=workers) as sampler:
                sampler.phase("load")
                started = time.monotonic()
                first_event = train_start = first_step = last_step = last_event = None
                summary = None
                request = pb.StartRunRequest(run_config_json=config.model_dump_json())
                try:
                    with grpc.insecure_channel(cluster.party_a_address, options=channel_options(16)) as channel:
                        for event in pb_grpc.GraphPartyStub(channel).StartRun(request):
                            now = time.monotonic()
                            if first_event is None:
                                first_event = now
                                reading = sampler.sample().get("party-a")
                                result.a_load_peak_mib = reading.hwm_kib / KIB_PER_MIB if reading else 0.0
                                sampler.phase("setup")
                            if event.HasField("summary_json"):
                                summary = RunSummary.model_validate_json(event.summary_json)
                                break
                            progress = event.progress
                            if progress.phase == "train" and progress.step:
                                if first_step is None:
                                    first_step, train_start = now, last_event or now
                                    sampler.phase("train")
                                last_step = now
                                if progress.step >= progress.total_steps:
                                    sampler.phase("eval")
                            last_event = now
                except grpc.RpcError as error:
                    result.status, result.message = "failed", f"party A: {error.code().name}: {error.details()}"
                ended = time.monotonic()
                _record_memory(result, sampler, workers.names)
    result.load_average = (load_before, os.getloadavg()[0])
    result.run_seconds = ended - started
    if first_event is not None:
        result.load_seconds = first_event - started
    if first_step is not None and last_step is not None and train_start is not None:
        result.epoch_seconds = last_step - train_start
        result.eval_seconds = ended - last_step
    if summary is not None:
        result.status, result.message = summary.status, summary.message + result.message
        result.steps, result.epsilon_spent = summary.steps, summary.epsilon_spent
        result.step_phases_ms = step_phases(cluster_dir / "party_a" / "runs" / summary.run_id)
    elif result.status == "not started":
        result.status, result.message = "failed", "party A ended the run without a summary" + result.message
    _record_cache(result, graph)
    return result


class _WorkerFinder:
    """Party A's worker processes, found by their ids in ``runs/<id>/workers.json`` once A has
    started them (the sampler asks at every sample until all are found)."""

    def __init__(self, runs_dir: Path, file_name: str, expected: int) -> None:
        self.runs_dir, self.file_name, self.expected = runs_dir, file_name, expected
        self.names: list[str] = []

    def __call__(self) -> dict[str, int]:
        if len(self.names) >= self.expected:
            return {}
        for path in sorted(self.runs_dir.glob(f"*/{self.file_name}")):
            try:
                pids = [int(pid) for pid in json.loads(path.read_text())["pids"]]
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written: the next sample reads it
            self.names = [f"party-a worker {rank}" for rank in range(1, len(pids) + 1)]
            return dict(zip(self.names, pids, strict=True))
        return {}


def _record_memory(result: ScaleRun, sampler: PeakSampler, workers: Sequence[str] = ()) -> None:
    """The services' memory into ``result``, sampled while they still live: lifetime peaks, the
    heap/file split at the end and each phase's largest RSS; a service gone fails the run. A's
    workers may have ended with the run: each one's peak is its last reading's VmHWM."""
    final = sampler.sample()  # the services still live: their lifetime peaks
    result.worker_peak_mib = {name: sampler.peak_kib(name) / KIB_PER_MIB for name in workers}
    if len(workers) < result.options.workers - 1:
        result.status = "failed"
        result.message += f" (found {len(workers)} of party A's {result.options.workers - 1} worker processes)"
    final = {name: reading for name, reading in final.items() if name not in workers}
    result.peak_mib = {name: sampler.peak_kib(name) / KIB_PER_MIB for name in final}
    result.end_split_mib = {
        name: (reading.anon_kib / KIB_PER_MIB, reading.file_kib / KIB_PER_MIB)
        for name, reading in final.items()
    }
    result.max_rss_mib = {
        phase: {name: kib / KIB_PER_MIB for name, kib in per.items()}
        for phase, per in sampler.max_rss_kib.items()
    }
    result.samples = sampler.samples
    gone = sampler.gone - set(workers)
    if gone:
        result.status = "failed"
        result.message += f" (gone during the run: {', '.join(sorted(gone))})"


def _record_cache(result: ScaleRun, graph: GraphFile) -> None:
    """How long the graph's CSR cache took to build (its manifest) and takes to open warm, into
    ``result``; nothing when no cache could be written (A then built its graph in memory)."""
    from vesper.common.csr_cache import MANIFEST, load_csr_part

    try:
        before = time.perf_counter()
        part = load_csr_part(graph.path)
        if part.entry is not None:  # (None: no cache could be written, A built its graph in memory)
            result.warm_open_seconds = time.perf_counter() - before
            manifest = json.loads((part.entry / MANIFEST).read_text())
            result.cache_build_seconds = float(manifest["build_seconds"])
        del part
    except (OSError, ValueError, KeyError):
        pass


def step_phases(run_dir: Path) -> dict[str, float]:
    """Median milliseconds per phase of A's training steps, from the timings A's trainer
    saves (party_a.run.step_timings.StepTimings); empty when it saved none."""
    import statistics

    try:
        timings = json.loads((run_dir / "step_timings.json").read_text())
        columns = list(zip(*timings["steps"], strict=True))
        return {
            phase: statistics.median(column) * 1000.0 for phase, column in zip(timings["phases"], columns, strict=True)
        } | {"step": statistics.median(sum(row) for row in timings["steps"]) * 1000.0}
    except (OSError, ValueError, KeyError, TypeError, statistics.StatisticsError):
        return {}


def scale_figures(
    workdir: Path, profiles: Sequence[str] | None = None, options: ScaleOptions | None = None,
    log: Callable[[str], object] = print, workers: Sequence[int] | None = None,
) -> list[PerfFigure]:
    """Generate (or reuse) each profile's graph in ``workdir/data`` (``profiles``: default
    sparse-1m and dense-100k), run one epoch through the services with each count of party A's
    workers in ``workers`` (default: ``options.workers``), and return the figures: A's peak
    against the goal on sparse-1m with one process, the rest reported. A run that cannot be made
    (generation fails, a service does not start) gives one failed figure saying why, and the
    others still run. Each run is kept as ``workdir/PROFILE[-wW]/scale_run.json``."""
    from vesper.benchmarks.perf.scale_report import figures_of, run_name

    options = options or ScaleOptions()
    workdir = Path(workdir)
    unknown = sorted(set(profiles or ()) - set(PROFILES))
    if unknown:
        raise ValueError(f"unknown scale profile(s) {', '.join(unknown)}; known: {', '.join(sorted(PROFILES))}")
    out: list[PerfFigure] = []
    for profile_name in profiles or DEFAULT_PROFILES:
        profile = PROFILES[profile_name]
        for count in workers or (options.workers,):
            run_options = options.model_copy(update={"workers": count})
            name = run_name(profile_name, run_options)
            goal = name == GOAL_PROFILE
            try:
                log(f"scale {name}: generating (or reusing) the graph")
                graph = graph_file(profile, workdir / "data")
                log(f"scale {name}: one epoch through the services ({graph.train_roots:,} training roots)")
                run_dir = workdir / (profile_name if count == 1 else f"{profile_name}-w{count}")
                run = run_profile(graph, run_dir, run_options)
            except Exception as exc:  # noqa: BLE001 (a benchmark reports what stopped it, and goes on)
                out.append(PerfFigure(
                    name=f"scale {name}: party A peak RSS (VmHWM)", value=0.0, unit="MiB", measured="not measured",
                    goal=f"< {GOAL_A_PEAK_MIB:.0f} MiB" if goal else "",
                    passed=False if goal else None, direction="lower" if goal else "none",
                    bound=f"the run could not be made: {type(exc).__name__}: {exc}", command=COMMAND,
                ))
                continue
            (run_dir / "scale_run.json").write_text(run.model_dump_json(indent=1))
            out.extend(figures_of(run))
    return out


# -- command line -----------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vesper.benchmarks.perf.scale")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate one profile's graph in this process (the bench's child)")
    gen.add_argument("profile", help="a ScaleProfile as JSON")
    gen.add_argument("path", type=Path)
    run = commands.add_parser("run", help="the scale figures")
    run.add_argument("--workdir", type=Path, default=Path(".vesper/perf/scale"))
    run.add_argument(
        "--profile", action="append", choices=sorted(PROFILES), help="repeatable; default sparse-1m and dense-100k",
    )
    run.add_argument(
        "--workers", action="append", type=int, help="party A's worker processes (repeatable: one run each); default 1",
    )
    run.add_argument("--epsilon", type=float, default=8.0)
    run.add_argument("--warm-cache", action="store_true", help="keep A's CSR cache of the file when it exists")
    run.add_argument("--threads", type=int, default=1, help="torch threads per service; 0: torch's default")
    args = parser.parse_args(argv)
    if args.command == "generate":
        record = generate_graph(ScaleProfile.model_validate_json(args.profile), args.path)
        print(record.model_dump_json())
        return 0
    if any(count < 1 for count in args.workers or ()):
        parser.error(f"--workers must be >= 1, got {args.workers}")
    options = ScaleOptions(epsilon=args.epsilon, cold_cache=not args.warm_cache, threads=args.threads or None)
    figures = scale_figures(args.workdir, args.profile, options, workers=args.workers)
    for figure in figures:
        verdict = "" if figure.passed is None else (" PASS" if figure.passed else " FAIL")
        print(f"{figure.name}: {figure.value:,.1f} {figure.unit}{verdict}  [{figure.goal}]\n    {figure.measured}")
    return 0 if all(f.passed is not False for f in figures) else 1


if __name__ == "__main__":
    sys.exit(main())
