"""``vesper bench soak``: the verdict on synthetic samples, and a short soak through the services."""

from __future__ import annotations

import math
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

from tests.e2e import vesper
from vesper.benchmarks.soak_bench import (
    EXIT_GOAL_FAILED,
    ProcessGone,
    ProcessSample,
    Sample,
    SoakReport,
    StepSampler,
    judge,
    plan_steps,
    read_process,
)


def _samples(start: ProcessSample, end: ProcessSample, middle: ProcessSample | None = None) -> list[Sample]:
    points = [("start", 10, start), *([("periodic", 20, middle)] if middle else []), ("end", 30, end)]
    return [
        Sample(step=step, seconds=float(step), kind=kind, processes={"party-a": p, "accountant": start})
        for kind, step, p in points
    ]


def _goal(samples: list[Sample], measure: str) -> bool:
    return next(g for g in judge(samples) if g.process == "party-a" and g.measure == measure).passed


def test_the_verdict_passes_a_flat_service_and_fails_growth_and_leaks() -> None:
    base = ProcessSample(rss_kib=100_000, fds=20, threads=8)
    flat = judge(_samples(base, ProcessSample(rss_kib=109_000, fds=20, threads=8)))
    assert all(goal.passed for goal in flat), flat
    assert {(g.process, g.measure) for g in flat} == {
        (p, m) for p in ("party-a", "accountant") for m in ("rss", "fds", "threads")
    }

    grown = _samples(base, ProcessSample(rss_kib=120_000, fds=20, threads=8))
    assert not _goal(grown, "rss") and _goal(grown, "fds") and _goal(grown, "threads")
    rss = next(g for g in judge(grown) if g.process == "party-a" and g.measure == "rss")
    assert (rss.start, rss.end, rss.peak) == (100_000, 120_000, 120_000) and math.isclose(rss.ratio, 1.2)
    assert _goal(_samples(base, ProcessSample(rss_kib=110_000, fds=20, threads=8)), "rss")  # the boundary
    assert not _goal(_samples(base, ProcessSample(rss_kib=85_000, fds=20, threads=8)), "rss")  # flat is both ways

    extra_fd = _samples(base, ProcessSample(rss_kib=100_000, fds=21, threads=8))
    assert not _goal(extra_fd, "fds") and _goal(extra_fd, "rss") and _goal(extra_fd, "threads")
    assert [(g.measure, g.last_change_step) for g in judge(extra_fd) if g.process == "party-a"] == [
        ("rss", None), ("fds", 30), ("threads", None)
    ]
    # the goal names which kind of descriptor or thread came or went
    kinds = ProcessSample(rss_kib=1, fds=3, threads=2, fd_kinds={"socket": 2, "pipe": 1}, thread_names={"python": 2})
    grown = ProcessSample(rss_kib=1, fds=3, threads=3, fd_kinds={"socket": 3}, thread_names={"python": 2, "grpc": 1})
    changes = {g.measure: g.change for g in judge(_samples(kinds, grown)) if g.process == "party-a"}
    assert changes == {"rss": "", "fds": "-1 pipe, +1 socket", "threads": "+1 grpc"}
    extra_thread = _samples(base, ProcessSample(rss_kib=100_000, fds=20, threads=9))
    assert not _goal(extra_thread, "threads") and _goal(extra_thread, "fds")
    # a closed connection is not a leak; a peak in between is reported, the end decides
    fewer = _samples(base, ProcessSample(rss_kib=100_000, fds=19, threads=7), ProcessSample(rss_kib=150_000, fds=40, threads=9))
    assert all(g.passed for g in judge(fewer))
    assert next(g for g in judge(fewer) if g.process == "party-a" and g.measure == "rss").peak == 150_000

    with pytest.raises(ValueError, match="start and an end"):
        judge(_samples(base, base)[:1])

    # warm-up samples are plotted, not judged: growth during the warm-up is the caches filling
    warming = Sample(step=1, seconds=0.0, kind="warmup", processes={
        "party-a": ProcessSample(rss_kib=50_000, fds=30, threads=20), "accountant": base,
    })
    after_warmup = judge([warming, *_samples(base, base)])
    assert all(g.passed for g in after_warmup)
    assert next(g for g in after_warmup if g.process == "party-a" and g.measure == "rss").start == 100_000


def test_the_plan_trains_at_least_the_requested_steps() -> None:
    assert plan_steps(20_000, 10_000, 100) == (100, 100, 200)  # exactly 20,000
    batch, per_epoch, epochs = plan_steps(20_000, 10_007, 100)
    assert (batch, per_epoch) == (101, 100) and per_epoch * epochs == 20_000
    batch, per_epoch, epochs = plan_steps(250, 10_000, 100)
    assert per_epoch * epochs == 300 and 250 <= per_epoch * epochs < 250 + per_epoch
    assert plan_steps(10, 5, 100) == (1, 5, 2)  # fewer roots than steps per epoch: one root per batch
    with pytest.raises(ValueError, match="at least 1"):
        plan_steps(0, 10, 10)


def test_reading_proc_sees_this_process_and_refuses_a_dead_one() -> None:
    here = read_process(os.getpid())
    assert here.rss_kib > 0 and here.fds >= 3 and here.threads >= 1
    with pytest.raises(ProcessGone):
        read_process(2**22 + 12345)  # above the kernel's pid_max on Linux: never a process


def test_the_sampler_thread_samples_at_the_thresholds_the_steps_cross() -> None:
    sampler = StepSampler({"coordinator": os.getpid()}, warmup_step=20, every=10)
    sampler.start()
    for step in range(1, 101):
        sampler.advance(step)
        time.sleep(0.005)  # a step's work
    samples = sampler.finish()
    kinds, steps = [s.kind for s in samples], [s.step for s in samples]
    # the sampler reads the step the run is at when it wakes: on a busy machine a little late
    warmup = kinds.count("warmup")
    assert kinds == ["warmup"] * warmup + ["start"] + ["periodic"] * (len(kinds) - warmup - 2) + ["end"], kinds
    assert 1 <= warmup <= 2 and 5 <= kinds.count("periodic") <= 7, (kinds, steps)
    assert all(step < 20 for step in steps[:warmup]) and 20 <= steps[warmup] < 30, steps
    assert steps[-1] == 100 and steps == sorted(set(steps)), steps
    assert [s.kind for s in sampler.judged][0] == "start" and samples[0].processes["coordinator"].rss_kib > 0

    # a run that ends before its warm-up gives no start and no end: nothing to judge
    short = StepSampler({"coordinator": os.getpid()}, warmup_step=50, every=10)
    short.start()
    short.advance(5)
    assert [s.kind for s in short.finish()] in (["warmup"], [])


@pytest.mark.e2e
@pytest.mark.slow  # ~20 s of training on an idle machine: make test-slow
def test_a_short_soak_through_the_services_reports_real_samples(tmp_path: Path) -> None:
    report_path = tmp_path / "docs" / "soak.md"
    code, output = vesper(
        "bench", "soak", "--steps", "200", "--nodes", "2000", "--samples", "10",
        "--workdir", str(tmp_path / "work"), "--report", str(report_path),
    )
    # a 200-step run is too short to promise flat memory: the structure and the samples are checked here
    assert code in (0, EXIT_GOAL_FAILED), output
    report = SoakReport.model_validate_json(report_path.with_suffix(".json").read_text())
    assert report.run is not None and report.run.status == "completed" and report.run.steps == 200
    assert report.plan.total_steps == 200 and report.plan.epochs * report.plan.steps_per_epoch == 200
    assert report.run.extractor == "pmp-gcn" and report.run.accounting == "visible-batch"
    assert math.isfinite(report.run.epsilon_spent) and 0 < report.run.epsilon_spent <= report.run.epsilon_budget
    with closing(sqlite3.connect(tmp_path / "work" / "cluster" / "ledger.sqlite")) as ledger:
        charged = ledger.execute(
            "SELECT count(*) FROM charges WHERE run_id = ? AND kind = 'train'", (report.run.run_id,)
        ).fetchone()[0]
    assert charged == 200  # every step was charged at the accountant

    # the samples are of the real processes: distinct PIDs, each running the service it is named for
    assert set(report.pids) == {"accountant", "party-b", "party-a", "coordinator"}
    assert report.pids["coordinator"] == os.getpid() and len(set(report.pids.values())) == 4
    for service in ("accountant", "party-b", "party-a"):
        assert f"serve {service}" in report.command_lines[service], report.command_lines[service]
    kinds = [s.kind for s in report.samples]
    warmup = kinds.count("warmup")
    assert warmup >= 1 and kinds[:warmup] == ["warmup"] * warmup, kinds
    assert kinds[warmup] == "start" and kinds[-1] == "end" and set(kinds[warmup + 1:-1]) == {"periodic"}, kinds
    # the sampler reads the step the run is at when it wakes: at the threshold, or (busy machine) a little later
    assert report.warmup_step == 10 <= report.judged[0].step < 200 and report.samples[-1].step == 200
    assert all(s.step < 10 for s in report.samples[:warmup])
    steps = [s.step for s in report.samples]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), steps
    for sample in report.samples:
        assert set(sample.processes) == set(report.pids)
        for name, process in sample.processes.items():
            assert process.rss_kib > 10_000 and process.fds > 0 and process.threads > 0, (name, process)
    assert report.steps_per_second > 0 and report.training_seconds > 0

    # the verdict and the written report agree with the samples
    assert len(report.goals) == 12
    assert report.passed == (code == 0)
    first, last = report.judged[0].processes["party-a"], report.judged[-1].processes["party-a"]
    party_a_rss = next(g for g in report.goals if g.process == "party-a" and g.measure == "rss")
    assert (party_a_rss.start, party_a_rss.end) == (first.rss_kib, last.rss_kib)
    text = report_path.read_text()
    for needle in ("| party-a |", "| accountant |", "| party-b |", "| coordinator |", "soak.png", report.run.run_id,
                   "200 steps", report.machine.cpu_model):
        assert needle in text, needle
    assert report_path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
