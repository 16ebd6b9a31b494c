"""The verdict of ``vesper bench soak``: per process, RSS at the end within ±10 % of the start
(flat), and no more file descriptors or threads at the end than at the start (no leak)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from vesper.benchmarks.soak_sampling import Sample

RSS_TOLERANCE = 0.10
Measure = Literal["rss", "fds", "threads"]


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
