"""Accountant charge latency (issue #9, item 1e): how long party A waits for a write-ahead charge.

A real accountant process on loopback (``vesper serve accountant``, the SQLite ledger with
``synchronous=FULL``), one run created with the charge rules of a Cora PMP-GCN run at ε = 8
(visible-batch, the per-pass form: the first release of a pass is counted, the others cost
nothing more), then ``charges`` Charge RPCs one after the other, as party A makes them, each
timed on the client from the call to the receipt. Goal: p99 < 5 ms.

Beside it, the same charges made in this process (``Accountant.charge`` on a ledger file of
the same settings, no gRPC), the SQLite commit alone, and a run whose every release is
counted (L ≥ 2 without a degree bound: ε is recomputed at every charge): what the RPC, the
commit and the ε composition each cost. When the goal is missed, ``bound`` holds the top
lines of a cProfile of the in-process charges and the accountant process's share.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from vesper.benchmarks.perf.figures import PerfFigure

if TYPE_CHECKING:
    from vesper.accountant.budget import Accountant
    from vesper.accountant.ledger_store import LedgerStore

GOAL_P99_MS = 5.0
WARMUP = 10  # charges before the timed ones: the channel and SQLite's page cache warm up
COMMAND = "vesper bench perf --only accountant"
PACE_S = 0.03  # about one Cora training step between two charges
CORA_TRAIN_STEPS_PER_PASS = 6  # ceil(1354 training nodes / 256)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@lru_cache(maxsize=2)
def _rules(every_release_counted: bool) -> tuple[list, float]:
    """Charge rules of Cora PMP-GCN at ε = 8 (L = 1, D = 10, D_min = 1), calibrated as A's
    trainer does, and δ. ``every_release_counted``: participation bound None (each charge
    recomputes ε)."""
    from vesper.accountant.budget import Accountant
    from vesper.common.privacy.events import event_to_json
    from vesper.common.privacy.ledger import ChargeRule, PlannedPass, PlanRule
    from vesper.party_a.extractors.sensitivity import charge_rule

    rule = charge_rule("pmp-gcn", 1, 10, 1, 0)
    bound = None if every_release_counted else rule.participation_bound
    plan = [PlanRule(kind=kind, participation_bound=bound) for kind in ("train", "eval")]
    passes = [PlannedPass(kind="train", releases=CORA_TRAIN_STEPS_PER_PASS)] * 50 + [PlannedPass(kind="eval", releases=2)]
    delta = 1 / 5278
    z, _, _, _ = Accountant.calibrate_gaussian(passes, plan, 8.0, delta, "visible-batch", "pld")
    rules = [
        ChargeRule(kind=r.kind, release_event=event_to_json(r.event(z)), participation_bound=r.participation_bound)
        for r in plan
    ]
    return rules, delta


def _charge_arguments(index: int) -> tuple[str, str, str, int, str]:
    """(release key, pass id, kind, nodes, digest) of training release ``index``, as A makes them."""
    epoch, position = divmod(index, CORA_TRAIN_STEPS_PER_PASS)
    pass_id = f"train-{epoch}"
    return f"{pass_id}/{position}", pass_id, "train", 256, f"{index:064x}"


def counted_split(durations: list[float], participation_bound: int | None) -> tuple[list[float], list[float]]:
    """The timed charges (indices from WARMUP on) split into those the ledger counts (the
    first ``participation_bound`` of each pass: ε is recomputed) and the others."""
    counted, free = [], []
    for offset, seconds in enumerate(durations):
        position = (WARMUP + offset) % CORA_TRAIN_STEPS_PER_PASS
        (counted if participation_bound is None or position < participation_bound else free).append(seconds)
    return counted, free


def _timed(charge: Callable[[int], object], count: int, pace_s: float = 0.0) -> list[float]:
    """Seconds of each of ``count`` charges after the warm-up; ``pace_s`` untimed seconds between
    two charges (a training step's worth: the ledger's fsync then meets whatever else the
    machine wrote meanwhile, as in a run)."""
    for index in range(WARMUP):
        charge(index)
    durations = []
    for index in range(WARMUP, WARMUP + count):
        if pace_s:
            time.sleep(pace_s)
        started = time.perf_counter()
        charge(index)
        durations.append(time.perf_counter() - started)
    return durations


@contextmanager
def _accountant_process(workdir: Path) -> Iterator[tuple[object, str]]:
    """A real accountant process on loopback over a fresh ledger in ``workdir``, and a client of
    it holding the charge token (stopped after)."""
    from vesper.common.accountant_client import AccountantClient
    from vesper.common.charge_token import ensure_distinct_tokens
    from vesper.coordinator.processes import start_service, write_section

    workdir.mkdir(parents=True, exist_ok=True)
    token, _ = ensure_distinct_tokens(workdir / "charge.token", workdir / "label-charge.token")
    config = workdir / "accountant.toml"
    write_section(config, "accountant", {
        "listen": "127.0.0.1:0", "rest_listen": "127.0.0.1:0", "ledger": str(workdir / "ledger.sqlite"),
        "charge_token_file": str(workdir / "charge.token"), "label_charge_token_file": str(workdir / "label-charge.token"),
    })
    service = start_service("accountant", config, workdir)
    try:
        service.wait_ready()
        client = AccountantClient(service.grpc_address, token)
        try:
            yield client, f"latency-{int(time.time() * 1000)}"
        finally:
            client.close()
    finally:
        service.stop()


def _health_check(client: object) -> Callable[[], object]:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    check = health_pb2_grpc.HealthStub(client.channel).Check
    return lambda: check(health_pb2.HealthCheckRequest(service="vesper.v1.Accountant"), timeout=10)


def over_grpc(
    workdir: Path, count: int, every_release_counted: bool = False, pace_s: float = 0.0, pings: list[float] | None = None,
) -> list[float]:
    """Seconds per Charge RPC to a real accountant process on loopback. ``pings``: if given,
    filled with the seconds of as many gRPC health checks to the same process, alternating
    with the charges (the round trip of a call that does no work: the transport's floor)."""
    with _accountant_process(workdir) as (client, run_id):
        rules, delta = _rules(every_release_counted)
        client.create_run(run_id, 1e9, delta, rules, "pmp-gcn", "visible-batch", "pld", {})
        event = {r.kind: r.release_event for r in rules}["train"]
        if pings is None:
            return _timed(lambda i: client.charge(run_id, *_charge_arguments(i), event), count, pace_s)
        check = _health_check(client)
        durations: list[float] = []

        def charge_then_ping(index: int) -> None:
            started = time.perf_counter()
            check()
            if index >= WARMUP:
                pings.append(time.perf_counter() - started)
            started = time.perf_counter()
            client.charge(run_id, *_charge_arguments(index), event)
            durations.append(time.perf_counter() - started)

        _timed(charge_then_ping, count, pace_s)
        return durations[WARMUP:]


def paced_pings(workdir: Path, count: int, pace_s: float) -> list[float]:
    """Seconds per gRPC health check (no work) to a real accountant process, ``pace_s`` untimed
    seconds apart: the transport's floor when both processes have idled since the last call,
    as they have between two of a run's charges."""
    with _accountant_process(workdir) as (client, _):
        check = _health_check(client)
        return _timed(lambda _: check(), count, pace_s)


def in_process(workdir: Path, count: int, every_release_counted: bool = False) -> tuple[list[float], list[float], str]:
    """Seconds per ``Accountant.charge`` called directly (no gRPC) on a ledger file of the
    service's settings; seconds per SQLite commit of a ledger row alone; the cProfile top lines."""
    with _ledger_with_a_run(workdir, every_release_counted) as (store, accountant, event):
        profile = cProfile.Profile()
        profile.enable()
        charges = _timed(lambda i: accountant.charge("latency", *_charge_arguments(i), event), count)
        profile.disable()
        commits = commit_seconds(store, store.charges("latency")[-1], min(count, 500))
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(12)
    return charges, commits, _top_lines(text.getvalue())


def commit_seconds(store: object, row: object, count: int, pace_s: float = 0.0, first_seq: int = 10**6) -> list[float]:
    """Seconds per SQLite commit of a copy of ledger ``row`` alone (LedgerStore.append_charge),
    ``pace_s`` untimed seconds apart."""
    from vesper.common.privacy.ledger import LedgerRow

    durations = []
    for index in range(count):
        if pace_s:
            time.sleep(pace_s)
        copy = LedgerRow(**{**row.model_dump(), "seq": first_seq + index, "release_key": f"c{first_seq + index}"})
        started = time.perf_counter()
        store.append_charge(copy)
        durations.append(time.perf_counter() - started)
    return durations


def paced_commits(workdir: Path, count: int, pace_s: float) -> list[float]:
    """SQLite commits alone, ``pace_s`` apart, on a fresh ledger of the service's settings."""
    with _ledger_with_a_run(workdir, False) as (store, accountant, event):
        accountant.charge("latency", *_charge_arguments(0), event)
        return commit_seconds(store, store.charges("latency")[-1], count, pace_s)


@contextmanager
def _ledger_with_a_run(workdir: Path, every_release_counted: bool) -> Iterator[tuple[LedgerStore, Accountant, str]]:
    """A fresh ledger file of the service's settings in ``workdir``, an accountant over it
    with the run "latency" created, and that run's training release event; closed after."""
    from vesper.accountant.budget import Accountant
    from vesper.accountant.ledger_store import LedgerStore

    workdir.mkdir(parents=True, exist_ok=True)
    store = LedgerStore(workdir / f"ledger-{time.time_ns()}.sqlite")
    try:
        accountant = Accountant(store)
        rules, delta = _rules(every_release_counted)
        accountant.create_run("latency", "edge", "visible-batch", "pld", 1e9, delta, rules, "pmp-gcn", {})
        yield store, accountant, {r.kind: r.release_event for r in rules}["train"]
    finally:
        store.close()


def _top_lines(report: str, lines: int = 14) -> str:
    """The table of a pstats report, without its header noise."""
    kept = [line.rstrip() for line in report.splitlines() if line.strip()]
    start = next((i for i, line in enumerate(kept) if line.lstrip().startswith("ncalls")), 0)
    return "\n".join(kept[start : start + lines])


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _summary(values: list[float]) -> str:
    return (
        f"p50 {_ms(percentile(values, 50)):.2f} ms, p99 {_ms(percentile(values, 99)):.2f} ms, "
        f"max {_ms(max(values)):.2f} ms over {len(values)}"
    )


def _paced_figure(
    rpc_paced: list[float], bound_per_pass: int | None, p99: float, pings_paced: list[float], pings: list[float],
    commits_paced: list[float], commits: list[float],
) -> PerfFigure:
    """The p99 of charges ``PACE_S`` seconds apart; where it misses the goal, the transport and the commit
    after the same idle time beside their back-to-back figures."""
    paced_p99 = _ms(percentile(rpc_paced, 99))
    paced_counted, paced_free = counted_split(rpc_paced, bound_per_pass)
    paced_passed = paced_p99 < GOAL_P99_MS
    return PerfFigure(
        name=f"accountant charge latency p99 (loopback, per-pass rules, one charge every {PACE_S * 1000:g} ms)",
        value=round(paced_p99, 3), unit="ms",
        measured=(
            f"over gRPC {_summary(rpc_paced)}, {PACE_S * 1000:g} ms untimed between two charges (a training "
            f"step's worth); counted charges {_summary(paced_counted)}; the others "
            f"{_summary(paced_free) if paced_free else 'none'}"
        ),
        goal=f"p99 < {GOAL_P99_MS:g} ms", passed=paced_passed, direction="lower",
        bound="" if paced_passed else (
            f"The same charges back-to-back: p99 {p99:.2f} ms. Both halves of a charge are slower after "
            f"{PACE_S * 1000:g} ms idle than back-to-back. The transport: a gRPC health check (no work) to an "
            f"accountant process, {PACE_S * 1000:g} ms apart: {_summary(pings_paced)}; back-to-back, "
            f"alternating with charges: {_summary(pings)}. The SQLite commit of a ledger row alone (WAL, "
            f"synchronous=FULL: an fsync per commit), {PACE_S * 1000:g} ms apart: {_summary(commits_paced)}; "
            f"back-to-back: {_summary(commits)}. In a two-party run party A starts each charge on a worker "
            "thread while it updates its parameters after the step before (WriteAheadCharger.charge_ahead), "
            "so this latency is off the step's critical path there (the throughput section's charge phase)"
        ),
        command=COMMAND,
    )


def accountant_latency_figures(charges: int = 2000, workdir: Path | None = None, quick: bool = False) -> list[PerfFigure]:
    """Charge latency p99 (and p50) to a real accountant process, with what bounds it."""
    if quick:
        charges = min(charges, 200)
    with tempfile.TemporaryDirectory(prefix="vesper-perf-accountant-") as scratch:
        base = Path(workdir) if workdir is not None else Path(scratch)
        pings: list[float] = []
        rpc = over_grpc(base / "service", charges, pings=pings)
        rpc_counted = over_grpc(base / "service-counted", max(charges // 4, 50), every_release_counted=True)
        rpc_paced = over_grpc(base / "service-paced", max(charges // 4, 50), pace_s=PACE_S)
        commits_paced = paced_commits(base / "in-process-paced", max(charges // 10, 50), PACE_S)
        pings_paced = paced_pings(base / "service-pings-paced", max(charges // 10, 50), PACE_S)
        local, commits, profile = in_process(base / "in-process", charges)
        local_counted, _, profile_counted = in_process(base / "in-process-counted", max(charges // 4, 50), True)
    p50, p99 = _ms(percentile(rpc, 50)), _ms(percentile(rpc, 99))
    bound_per_pass = _rules(False)[0][0].participation_bound
    counted, free = counted_split(rpc, bound_per_pass)
    split = (
        f"{len(counted)} of {len(rpc)} charges are counted (the first {bound_per_pass} of each pass of "
        f"{CORA_TRAIN_STEPS_PER_PASS}): ε is recomputed for them, {_summary(counted)}; the others "
        f"{_summary(free) if free else 'none'}"
    )
    breakdown = (
        f"over gRPC {_summary(rpc)}; the same charges in one process (no gRPC) {_summary(local)}; "
        f"the SQLite commit of a row alone (WAL, synchronous=FULL) {_summary(commits)}; "
        f"every release counted (ε recomputed per charge): over gRPC {_summary(rpc_counted)}, "
        f"in one process {_summary(local_counted)}; a gRPC health check (no work) {_summary(pings)}"
    )
    passed = p99 < GOAL_P99_MS
    bound = "" if passed else (
        f"Over gRPC, {split}. Of the p50 {p50:.2f} ms, {_ms(percentile(local, 50)):.2f} ms is the accountant's own "
        f"work (in one process), of which the SQLite commit is {_ms(percentile(commits, 50)):.2f} ms (p99 "
        f"{_ms(percentile(commits, 99)):.2f} ms); the rest is gRPC and the service: a gRPC health check to "
        f"the same process, alternating with the charges (a round trip that does no work), took "
        f"{_summary(pings)}. cProfile of {len(local)} in-process charges (cumulative):\n{profile}"
    )
    counted_p99 = _ms(percentile(rpc_counted, 99))
    counted_passed = counted_p99 < GOAL_P99_MS
    return [
        PerfFigure(
            name="accountant charge latency p99 (loopback, per-pass rules)", value=round(p99, 3), unit="ms",
            measured=f"p50 {p50:.2f} ms; {breakdown}; {split}; {WARMUP} warm-up charges not timed",
            goal=f"p99 < {GOAL_P99_MS:g} ms", passed=passed, direction="lower", bound=bound, command=COMMAND,
        ),
        PerfFigure(
            name="accountant charge latency p50 (loopback, per-pass rules)", value=round(p50, 3), unit="ms",
            measured=f"over {len(rpc)} Charge RPCs, one at a time", command=COMMAND,
        ),
        _paced_figure(rpc_paced, bound_per_pass, p99, pings_paced, pings, commits_paced, commits),
        PerfFigure(
            name="accountant charge latency p99 (every release counted)", value=round(counted_p99, 3), unit="ms",
            measured=f"over gRPC {_summary(rpc_counted)}; in one process {_summary(local_counted)}",
            goal=f"p99 < {GOAL_P99_MS:g} ms", passed=counted_passed, direction="lower",
            bound="" if counted_passed else (
                "every counted charge recomputes the run's ε (for Gaussian events the exact Gaussian ε, "
                f"common/privacy/accounting.gaussian_epsilon): in one process {_summary(local_counted)}, the rest "
                f"is the transport (a gRPC health check to the same kind of process, no work: {_summary(pings)}). "
                f"cProfile of the in-process charges (cumulative):\n{profile_counted}"
            ),
            command=COMMAND,
        ),
    ]
