"""Two-party training throughput against the same math in one process, and what pipelining
gains (issue #9, items 1a and 2).

**Two-party**: the three services as processes on loopback (:class:`LocalCluster`), one run
of ``epochs`` epochs; party A records where each training step's time goes
(``runs/<id>/step_timings.json``, party_a.run.step_timings.StepTimings) and the step ends on its
monotonic clock. Steady state: steps/s from the end of the ``warmup_steps``-th step to the
last training step (set-up, calibration and the evaluation pass are outside it).

**One process**, the same math: A's extractor release (sampling, encoder, PMP, noise), B's
decoder step (``LabelSession.train_step``: decode, loss, update, dLoss/dH) and A's backward
and optimiser step, called directly in this process, no gRPC and no serialisation, with the
same batches, calibrated noise and seeds. Charging is stated, not hidden:

* ``one process, charged``: every step also charges an accountant in this process
  (``Accountant.charge``: the same rules, its SQLite commit with ``synchronous=FULL``),
  write-ahead as in the product; this is the reference of the goal (ratio ≥ 0.85);
* ``one process, math only``: no charge, so the cost of each layer is visible.

Party A's release journal (``releases.jsonl``, synced per release) has no counterpart in
the one-process loop: it is durability of the two-party product, and its cost shows as its
own phase of the two-party profile.

**Pipelining**: the same two-party run with ``pipeline = false`` in party A's settings
(A samples step t+1 only after step t) against the default (A samples step t+1 while B
computes step t). Both clusters run side by side and the runs alternate, so load drifts hit
both alike. Torch's intra-op threads are pinned (``threads``) in this process, in both
parties (their ``torch_threads``) and, through ``OMP_NUM_THREADS``, in the accountant too
(its numpy, which reads it when it loads).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from vesper.benchmarks.perf.figures import PerfFigure

GOAL_RATIO = 0.85
DATASET_ALIAS = "perf-data"
COMMAND = "vesper bench perf --only throughput"


class ThroughputOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dataset: str = Field("cora", description="a bundled name or an .npz path")
    extractor: str = "pmp-gcn"
    epsilon: float = 8.0
    epochs: int = Field(10, ge=1)
    batch_size: int = Field(256, ge=1)
    layers: int = Field(1, ge=1)
    fanout: int = Field(10, ge=0)
    threads: int = Field(1, ge=1, description="torch intra-op threads here and in each service")
    warmup_steps: int = Field(6, ge=1, description="steps before the timed window")
    repeats: int = Field(3, ge=1)
    seed: int = 0
    secret_seed: int = 0
    noise_multiplier: float | None = Field(None, gt=0, description="fixed z (no calibration); unset: calibrated for ε")

    def run_config(self, dataset: str) -> dict:
        extractor = {"name": self.extractor, "layers": self.layers, "fanout": self.fanout}
        if self.noise_multiplier is not None:
            extractor["noise_multiplier"] = self.noise_multiplier
        return {
            "dataset": dataset, "epochs": self.epochs, "batch_size": self.batch_size, "seed": self.seed,
            "privacy": {"epsilon": self.epsilon}, "extractor": extractor,
        }


@dataclass
class Rate:
    """A run's steady state: steps/s over the timed window and per-phase seconds of its steps."""

    steps_per_second: float
    timed_steps: int
    phases: dict[str, list[float]] = field(default_factory=dict)


def steady_rate(ends: list[float], warmup_steps: int) -> tuple[float, int]:
    """(steps/s, steps) from the end of step ``warmup_steps`` to the last step's end."""
    if len(ends) <= warmup_steps:
        raise ValueError(f"the run made {len(ends)} steps, not more than the {warmup_steps} warm-up steps")
    window = ends[-1] - ends[warmup_steps - 1]
    steps = len(ends) - warmup_steps
    return steps / window, steps


@contextmanager
def pinned_threads(threads: int) -> Iterator[None]:
    """``threads`` intra-op threads in this process and in the processes it starts."""
    before, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        if env is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env


# -- two parties through the services ---------------------------------------------------------
def two_party_rate(cluster: object, options: ThroughputOptions) -> Rate:
    """One run through ``cluster`` (a started LocalCluster); its steady state from A's timings."""
    from rich.console import Console

    from vesper.common.config import RunConfig
    from vesper.coordinator.run_client import drive_run
    from vesper.party_a.run.step_timings import STEP_TIMINGS_FILE

    config = RunConfig.model_validate(options.run_config(DATASET_ALIAS))
    summary = drive_run(cluster.party_a_address, config, Console(quiet=True))
    if summary.status != "completed":
        raise RuntimeError(f"the two-party run ended {summary.status}: {summary.message}")
    timings = json.loads((cluster.workdir / "party_a" / "runs" / summary.run_id / STEP_TIMINGS_FILE).read_text())
    rate, steps = steady_rate(timings["ends"], options.warmup_steps)
    timed = timings["steps"][options.warmup_steps:]
    phases = {name: [row[i] for row in timed] for i, name in enumerate(timings["phases"])}
    return Rate(rate, steps, phases)


# -- the same math in one process -------------------------------------------------------------
class OneProcess:
    """A's extractor, B's session and (optionally) an accountant, all in this process."""

    def __init__(
        self, options: ThroughputOptions, dataset_path: Path, workdir: Path, charged: bool, device: str = "cpu",
    ) -> None:
        """``device``: where A's extractor and B's session compute (both, as one process would)."""
        from vesper.accountant.budget import Accountant
        from vesper.accountant.ledger_store import LedgerStore
        from vesper.common.config import RunConfig
        from vesper.common.optim import build_optimizer
        from vesper.common.privacy.events import event_to_json
        from vesper.common.privacy.ledger import ChargeRule
        from vesper.common.secret_randomness import secret_base
        from vesper.party_a.extractors.base import ExtractorSetup, RootPlan
        from vesper.party_a.extractors.edge_free_path import build_extractor, edge_free_layers
        from vesper.party_a.extractors.registry import lookup, validated_params
        from vesper.party_a.run import GraphData
        from vesper.party_b.label_data import load_labels
        from vesper.party_b.session import LabelSession

        cfg = RunConfig.model_validate(options.run_config(str(dataset_path)))
        self.config = cfg
        device = torch.device(device)
        data = GraphData.load(dataset_path, device)
        store = load_labels(dataset_path, cfg.split_seed)
        split = store.split
        train, val, test = (torch.from_numpy(getattr(split, name)) for name in ("train", "val", "test"))
        chunks = math.ceil(val.numel() / cfg.eval_chunk) + math.ceil(test.numel() / cfg.eval_chunk)
        self.roots = RootPlan(train, val, test, math.ceil(train.numel() / cfg.batch_size), chunks)
        delta = cfg.privacy.delta
        # the trainer's secret generators (party_a.run.secrets.SecretGenerators), same seeds
        base = secret_base(options.secret_seed, cfg.seed)
        cls = lookup(cfg.extractor.name)
        setup = ExtractorSetup(
            config=cfg, params=validated_params(cls.spec, cfg), graph=data.graph, features=data.features,
            device=device, sampling_generator=torch.Generator().manual_seed(base),
            noise_generator=torch.Generator(device=device).manual_seed(base ^ 0x5DEECE66D), delta=delta,
        )
        self.extractor = build_extractor(cls, setup)  # as party A builds it: with its edge-free path
        plan = self.extractor.charge_plan(self.roots)
        z = None
        if math.isfinite(cfg.privacy.epsilon) and any(r.mechanism != "no-op" for r in plan.rules):
            z = cfg.extractor.noise_multiplier or Accountant.calibrate_gaussian(
                plan.passes(cfg.epochs, self.roots), plan.rules, cfg.privacy.epsilon, delta,
                cfg.privacy.accounting, cfg.privacy.accountant,
            )[0]
        self.extractor.bind(z)
        self.optimizer = build_optimizer(cfg.optimizer, self.extractor.trainable_parameters())
        self.session = LabelSession(
            "one-process", store, cfg.decoder, cfg.optimizer, cfg.extractor.dim, self.extractor.output_layers,
            cfg.wire_dtype, cfg.seed, device, edge_free_layers=edge_free_layers(self.extractor),
        )
        self.accountant = None
        self.store = None
        self.event_json = ""
        if charged:
            if z is None:
                raise ValueError("the charged one-process loop needs a finite ε and a costly extractor")
            rules = [
                ChargeRule(kind=r.kind, release_event=event_to_json(r.event(z)), participation_bound=r.participation_bound)
                for r in plan.rules
            ]
            self.event_json = {r.kind: r.release_event for r in rules}["train"]
            workdir.mkdir(parents=True, exist_ok=True)
            self.store = LedgerStore(workdir / f"ledger-{time.time_ns()}.sqlite")
            self.accountant = Accountant(self.store)
            self.accountant.create_run(
                "one-process", self.extractor.spec.privacy_unit, cfg.privacy.accounting, cfg.privacy.accountant,
                cfg.privacy.epsilon, delta, rules, cfg.extractor.name, {},
            )

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def run(self, warmup_steps: int, max_steps: int | None = None) -> Rate:
        """Train ``epochs`` epochs as the trainer does (or stop after ``max_steps`` steps); the
        steady state after the warm-up."""
        from vesper.common.accountant_client import nodes_digest

        cfg = self.config
        extractor, session, optimizer = self.extractor, self.session, self.optimizer
        extractor.train()
        root_order = torch.Generator().manual_seed(cfg.seed)
        phases: dict[str, list[float]] = {"release": [], "charge": [], "label party": [], "update": []}
        ends: list[float] = []
        for epoch in range(cfg.epochs):
            index = 0
            for batch in extractor.root_batches(self.roots.train_ids, cfg.batch_size, root_order):
                if batch.numel() == 0:
                    continue
                started = time.perf_counter()
                embeddings = extractor.release(batch, "train")
                released = time.perf_counter()
                if self.accountant is not None:
                    pass_id = f"train-{epoch}"
                    self.accountant.charge(
                        "one-process", f"{pass_id}/{index}", pass_id, "train", batch.numel(), nodes_digest(batch),
                        self.event_json,
                    )
                charged = time.perf_counter()
                gradient, _ = session.train_step(batch, embeddings)
                answered = time.perf_counter()
                if embeddings.requires_grad:
                    optimizer.zero_grad(set_to_none=True)
                    embeddings.backward(gradient)
                    optimizer.step()
                ended = time.perf_counter()
                for name, seconds in zip(
                    phases, (released - started, charged - released, answered - charged, ended - answered), strict=True
                ):
                    phases[name].append(seconds)
                ends.append(ended)
                index += 1
                if max_steps is not None and len(ends) >= max_steps:
                    break
            if max_steps is not None and len(ends) >= max_steps:
                break
        rate, steps = steady_rate(ends, warmup_steps)
        return Rate(rate, steps, {name: values[warmup_steps:] for name, values in phases.items()})


def one_process_rate(options: ThroughputOptions, dataset_path: Path, workdir: Path, charged: bool) -> Rate:
    loop = OneProcess(options, dataset_path, workdir, charged)
    try:
        return loop.run(options.warmup_steps)
    finally:
        loop.close()


# -- serialisation alone ---------------------------------------------------------------------
def serialisation_seconds(batch_size: int, dim: int, layers: int, dtype: str = "float32", repeats: int = 30) -> float:
    """Median seconds of one step's serialisation work at both ends, without transport: A's
    release into a TrainStep and its bytes; B parsing them, checking the ids and decoding the
    tensor; B's gradient into a TrainStepReply and its bytes; A parsing and decoding them."""
    from vesper.common.wire import decode_tensor, encode_tensor, validate_node_ids
    from vesper.proto.v1 import label_party_pb2 as lp_pb

    generator = torch.Generator().manual_seed(0)
    release = torch.randn((batch_size, dim, layers), generator=generator)
    gradient = torch.randn((batch_size, dim, layers), generator=generator)
    ids = list(range(0, 2 * batch_size, 2))
    num_nodes = 2 * batch_size
    times = []
    for step in range(repeats):
        started = time.perf_counter()
        wire = lp_pb.TrainStep(
            run_id="0123456789ab", step=step, node_ids=ids, embeddings=encode_tensor(release, dtype)
        ).SerializeToString()
        received = lp_pb.TrainStep.FromString(wire)
        validate_node_ids(received.node_ids, name="batch", num_nodes=num_nodes)
        decode_tensor(received.embeddings, name="embeddings", expected_shape=release.shape, expected_dtype=dtype)
        answer = lp_pb.TrainStepReply(
            run_id="0123456789ab", step=step, gradient=encode_tensor(gradient, dtype), loss=1.0
        ).SerializeToString()
        reply = lp_pb.TrainStepReply.FromString(answer)
        decode_tensor(reply.gradient, name="gradient", expected_shape=gradient.shape, expected_dtype=dtype)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


# -- the figures ------------------------------------------------------------------------------
@dataclass
class Measurements:
    pipelined: list[Rate]
    sequential: list[Rate]
    charged: list[Rate]
    math_only: list[Rate]
    serialisation: float = 0.0  # seconds per step, both ends, without transport
    pings: list[float] = field(default_factory=list)  # seconds per no-work gRPC round trip to B
    # (alone, beside a process keeping another core busy): steps/s of the one-process loop
    interference: list[tuple[float, float]] = field(default_factory=list)

    @staticmethod
    def median_rate(rates: list[Rate]) -> float:
        return statistics.median(r.steps_per_second for r in rates)


def measure(options: ThroughputOptions, workdir: Path) -> Measurements:
    """Every variant ``repeats`` times, interleaved (load drifts hit all alike)."""
    from vesper.common.dataset_files import resolve_dataset
    from vesper.coordinator.processes import LocalCluster

    path = resolve_dataset(options.dataset).resolve()
    datasets = {DATASET_ALIAS: str(path)}
    party_a = {"secret_seed": options.secret_seed, "torch_threads": options.threads}
    party_b = {"torch_threads": options.threads}
    result = Measurements([], [], [], [])
    with pinned_threads(options.threads), ExitStack() as clusters:
        pipelined = clusters.enter_context(
            LocalCluster(workdir / "pipelined", party_a=party_a, party_b=party_b, datasets=datasets)
        )
        sequential = clusters.enter_context(LocalCluster(
            workdir / "sequential", party_a={**party_a, "pipeline": False}, party_b=party_b, datasets=datasets
        ))
        for _ in range(options.repeats):
            result.pipelined.append(two_party_rate(pipelined, options))
            result.sequential.append(two_party_rate(sequential, options))
            result.charged.append(one_process_rate(options, path, workdir / "one-process", charged=True))
            result.math_only.append(one_process_rate(options, path, workdir / "one-process", charged=False))
        result.serialisation = serialisation_seconds(options.batch_size, 64, options.layers)
        result.pings = health_round_trips(pipelined.services["party-b"].grpc_address, 300)
    result.interference = neighbour_interference(options, path, workdir / "one-process", min(options.repeats, 2))
    return result


_SPIN = "import numpy as np\nx = np.random.rand(512, 512)\nwhile True:\n    x @ x\n"


def neighbour_interference(
    options: ThroughputOptions, dataset_path: Path, workdir: Path, pairs: int = 2
) -> list[tuple[float, float]]:
    """Steps/s of the one-process loop (math only) alone, and beside a process that keeps one
    other core busy (numpy matmul, one thread): how much the work of B, the accountant and
    gRPC's threads on the other core can slow party A's math on this machine."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    results = []
    with pinned_threads(options.threads):
        for _ in range(pairs):
            alone = one_process_rate(options, dataset_path, workdir, charged=False).steps_per_second
            spinner = subprocess.Popen([sys.executable, "-c", _SPIN], env=env)
            try:
                time.sleep(0.3)
                beside = one_process_rate(options, dataset_path, workdir, charged=False).steps_per_second
            finally:
                spinner.kill()
                spinner.wait()
            results.append((alone, beside))
    return results


def health_round_trips(address: str, count: int) -> list[float]:
    """Seconds per gRPC health check to a service: a round trip that does no work."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        request = health_pb2.HealthCheckRequest()
        for _ in range(20):
            check(request, timeout=10)
        seconds = []
        for _ in range(count):
            started = time.perf_counter()
            check(request, timeout=10)
            seconds.append(time.perf_counter() - started)
    return seconds


def _interference_sentence(pairs: list[tuple[float, float]]) -> str:
    if not pairs:
        return ""
    ratios = [beside / alone for alone, beside in pairs]
    listed = ", ".join(f"{alone:.1f} → {beside:.1f}" for alone, beside in pairs)
    return (
        f"The one-process loop beside a process keeping another core busy runs at {statistics.median(ratios):.2f}x "
        f"its rate alone (steps/s {listed}): in the two-party run B, the accountant and gRPC's threads are that "
        f"neighbour to A's math. "
    )


def overhead_lines(measurements: Measurements) -> str:
    """Where the two-party step's extra milliseconds are, phase against phase."""
    two, one = _pooled(measurements.pipelined), _pooled(measurements.charged)

    def ms(phases: dict[str, list[float]], *names: str) -> float:
        return sum(statistics.median(phases[name]) for name in names) * 1000

    a_two, a_one = ms(two, "release", "prefetch", "update"), ms(one, "release", "update")
    b_two, b_one = ms(two, "wait"), ms(one, "label party")
    extra = ms(two, "charge", "encode", "journal", "send", "other")
    pings = sorted(measurements.pings)
    floor = (
        f"p50 {statistics.median(pings) * 1000:.2f} ms, p99 {pings[int(len(pings) * 0.99) - 1] * 1000:.2f} ms "
        f"over {len(pings)}" if pings else "not measured"
    )
    return (
        f"Two-party step {ms(two, *two) :.2f} ms against {ms(one, *one):.2f} ms in one process (medians per phase, "
        f"summed). A's own math (release with sampling, update): {a_two:.2f} ms in the service against "
        f"{a_one:.2f} ms in one process. Waiting for B after the prefetch: {b_two:.2f} ms against B's math "
        f"{b_one:.2f} ms. Work only the product does: {extra:.2f} ms (charge receipt, encode, journal fsync, "
        f"handing to gRPC, progress), against the one process's charge {ms(one, 'charge'):.2f} ms. A gRPC round "
        f"trip that does no work (health check to party B's service, after the runs): {floor}. "
        f"{_interference_sentence(measurements.interference)}Party A's per-phase timings: the table above."
    )


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.2f}" if values else "-"


def _pooled(rates: list[Rate]) -> dict[str, list[float]]:
    return {name: [v for r in rates for v in r.phases[name]] for name in rates[0].phases}


def phase_table(measurements: Measurements) -> str:
    """Median milliseconds per phase of a step: the two-party runs (party A's timings, with
    and without pipelining) beside the one-process loop."""
    two, seq, one = (_pooled(m) for m in (measurements.pipelined, measurements.sequential, measurements.charged))
    steps = [[sum(v) for v in zip(*phases.values(), strict=True)] for phases in (two, seq, one)]
    b_math = statistics.median(one["label party"])
    turn = statistics.median(seq["wait"])
    rows = [
        ("A: release (sampling unless prefetched, encoder, PMP, noise)", "release", "release"),
        ("A: write-ahead charge (two-party: Charge RPC; one process: Accountant.charge)", "charge", "charge"),
        ("A: encode the release for the wire", "encode", None),
        ("A: journal (digest appended to releases.jsonl, fsync)", "journal", None),
        ("A: hand the step to gRPC", "send", None),
        ("A: sample the next step, gather its features and dropout masks while B computes (pipelining)", "prefetch", None),
        ("A: wait for B's answer (one process: B's math)", "wait", "label party"),
        ("A: back-propagate B's gradient, optimiser step", "update", "update"),
        ("A: progress report, checkpoints", "other", None),
    ]
    lines = [
        "| phase | two-party, pipelined | two-party, not pipelined | one process, charged |",
        "|---|---|---|---|",
    ]
    for label, two_party, single in rows:
        lines.append(f"| {label} | {_ms(two[two_party])} | {_ms(seq[two_party])} | {_ms(one[single]) if single else '-'} |")
    lines += [
        f"| **step** | **{_ms(steps[0])}** | **{_ms(steps[1])}** | **{_ms(steps[2])}** |",
        "",
        "Median milliseconds per phase of the timed steps (party A's own timings, "
        "party_a.run.step_timings.StepTimings). Without pipelining, A's wait is B's whole turn: "
        f"{turn * 1000:.2f} ms, of which B's math in one process is {b_math * 1000:.2f} ms; the rest, "
        f"{(turn - b_math) * 1000:.2f} ms, is the transport: serialisation at both ends (measured alone: "
        f"{measurements.serialisation * 1000:.2f} ms per step, both messages, both ends, A's encode included), "
        "gRPC on loopback both ways, B's service code (receipt log, session lock) and the switch between "
        "processes. With pipelining, A samples the next step during B's turn and waits only for what is left of it.",
    ]
    return "\n".join(lines)


def repeat_ratios(two_party: list[Rate], one_process: list[Rate]) -> str:
    """Each repeat's ratio: its two-party run against the one-process run made right after it
    (``measure`` interleaves them), so a reader sees how far one repeat moves the figure."""
    ratios = [t.steps_per_second / o.steps_per_second for t, o in zip(two_party, one_process, strict=True)]
    if len(ratios) < 2:
        return ""
    values = ", ".join(f"{r:.3f}" for r in ratios)
    return (
        f"Repeat by repeat (each two-party run against the one-process run made right after it): {values}; "
        f"from {min(ratios):.3f} to {max(ratios):.3f}."
    )


def throughput_figures(
    dataset: str = "cora", epochs: int = 10, repeats: int = 5, threads: int = 1, warmup_steps: int = 6,
    extractor: str = "pmp-gcn", epsilon: float = 8.0, workdir: Path | None = None, quick: bool = False,
) -> list[PerfFigure]:
    """Two-party steps/s against one process (charged; and math only), and pipelining's gain."""
    if quick:
        epochs, repeats = min(epochs, 3), 1
    options = ThroughputOptions(
        dataset=dataset, epochs=epochs, repeats=repeats, threads=threads, warmup_steps=warmup_steps,
        extractor=extractor, epsilon=epsilon,
    )
    with tempfile.TemporaryDirectory(prefix="vesper-perf-throughput-") as scratch:
        measurements = measure(options, Path(workdir) if workdir is not None else Path(scratch))
    two = measurements.median_rate(measurements.pipelined)
    sequential = measurements.median_rate(measurements.sequential)
    charged = measurements.median_rate(measurements.charged)
    math_only = measurements.median_rate(measurements.math_only)
    setting = (
        f"{extractor} on {dataset}, ε = {epsilon:g}, {epochs} epochs of batch {options.batch_size}, "
        f"{measurements.pipelined[0].timed_steps} timed steps per run after {warmup_steps} warm-up steps, "
        f"median of {repeats} runs each, {threads} torch thread(s) per process"
    )
    table = phase_table(measurements)
    ratio = two / charged
    spread = repeat_ratios(measurements.pipelined, measurements.charged)
    passed = ratio >= GOAL_RATIO
    command = f"{COMMAND} (dataset {dataset}, {epochs} epochs, {repeats} repeats)"
    return [
        PerfFigure(
            name="two-party steps/s against one process (both charge write-ahead)", value=round(ratio, 3), unit="x",
            measured=(
                f"{two:.1f} steps/s through the three services on loopback vs {charged:.1f} steps/s in one process "
                f"charging an in-process accountant ({setting}). {spread} Where a step's time goes:\n\n{table}"
            ),
            goal=f">= {GOAL_RATIO:g}", passed=passed, direction="higher",
            bound="" if passed else overhead_lines(measurements),  # the table is in ``measured`` already
            command=command,
        ),
        PerfFigure(
            name="one process: charged against math only", value=round(charged / math_only, 3), unit="x",
            measured=(
                f"{charged:.1f} steps/s with an in-process accountant's write-ahead charge (SQLite commit, "
                f"synchronous=FULL) vs {math_only:.1f} steps/s without ({setting})"
            ),
            command=command,
        ),
        PerfFigure(
            name="two-party steps/s against one process (math only, no accountant)", value=round(two / math_only, 3),
            unit="x", measured=f"{two:.1f} vs {math_only:.1f} steps/s ({setting})", command=command,
        ),
        PerfFigure(
            name="pipelining: two-party steps/s with against without", value=round(two / sequential, 3), unit="x",
            measured=(
                f"{two:.1f} steps/s when A samples step t+1 while B computes step t vs {sequential:.1f} steps/s "
                f"when it samples after (party_a.pipeline = false); the same releases either way "
                f"(tests/test_perf_bench.py) ({setting})"
            ),
            direction="higher", command=command,
        ),
    ]
