"""What a soak found: the run's outcome, every sample and the goals judged on them, as
written to docs/soak.json (:mod:`soak_output` renders it)."""

from __future__ import annotations

from pydantic import BaseModel

from vesper.benchmarks.harness import Machine
from vesper.benchmarks.soak_plan import SoakPlan
from vesper.benchmarks.soak_sampling import Sample
from vesper.benchmarks.soak_verdict import Goal
from vesper.common.config import RunSummary


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
