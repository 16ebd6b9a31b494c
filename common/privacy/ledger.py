"""Ledger records and the rule that turns them into ε.

A run declares one per-release DpEvent and a participation bound N_e. Releases are
grouped into passes (one training epoch, one evaluation sweep), and within a pass a
node is a root at most once, so a single edge can influence at most N_e releases of
a pass (docs/privacy.md, "Participation"). The first N_e releases of each pass are
*counted*: each adds the run's event to the composition; later releases of the same
pass are recorded but add nothing, since the worst-case edge is already charged N_e
times in that pass. With one event per run that is exact worst-case accounting, and
it makes ε a function of the ledger alone::

    ε = epsilon_of(SelfComposed(release_event, #counted rows), δ)

:func:`replay` recomputes it from the rows and checks the rule row by row.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from typing import Literal

import dp_accounting as dpa
from pydantic import BaseModel, ConfigDict, Field

from vesper.common.privacy.accounting import EpsilonResult, epsilon_of
from vesper.common.privacy.events import event_from_json

RunState = Literal["active", "completed", "failed", "refused", "cancelled"]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class RunRecord(_Record):
    """A run as the accountant created it; the mode and budget never change afterwards."""

    run_id: str
    status: RunState = "active"
    created_at: str
    closed_at: str | None = None
    closed_reason: str = ""
    privacy_unit: str = Field(description="what one DP neighbour differs in, e.g. 'edge'")
    accounting: str
    assumption: str
    epsilon_budget: float
    delta: float
    release_event: str = Field(description="DpEvent JSON charged for each counted release")
    participation_bound: int | None = Field(
        description="N_e: releases per pass that one edge can influence; null = every release"
    )
    extractor: str
    details: dict = Field(default_factory=dict)


class LedgerRow(_Record):
    """One charge, committed before the release it pays for is sent."""

    run_id: str
    seq: int
    pass_id: str
    kind: Literal["train", "eval"]
    num_nodes: int
    release_event: str
    counted: bool
    epsilon_after: float
    accountant: str
    created_at: str


def is_counted(releases_before_in_pass: int, participation_bound: int | None) -> bool:
    """Whether the next release of a pass adds to the worst-case edge's composition."""
    return participation_bound is None or releases_before_in_pass < participation_bound


def counted_releases(pass_sizes: Iterable[int], participation_bound: int | None) -> int:
    """Counted releases of a plan: Σ_pass min(N_e, releases in the pass)."""
    if participation_bound is None:
        return sum(pass_sizes)
    return sum(min(participation_bound, size) for size in pass_sizes)


def composed_event(release_event: dpa.DpEvent, counted: int) -> dpa.DpEvent:
    """The run's DpEvent after ``counted`` counted releases."""
    if counted == 0 or isinstance(release_event, dpa.NoOpDpEvent):
        return dpa.NoOpDpEvent()
    return dpa.SelfComposedDpEvent(release_event, counted)


def plan_epsilon(
    release_event: dpa.DpEvent, pass_sizes: Iterable[int], participation_bound: int | None, delta: float
) -> tuple[EpsilonResult, int]:
    counted = counted_releases(pass_sizes, participation_bound)
    return epsilon_of(composed_event(release_event, counted), delta), counted


class ReplayResult(_Record):
    epsilon: float
    accountant: str
    counted: int
    charges: int
    recorded_epsilon: float | None
    problems: list[str]

    @property
    def consistent(self) -> bool:
        return not self.problems


def replay(run: RunRecord, rows: list[LedgerRow]) -> ReplayResult:
    """Recompute ε from the ledger alone and check every row against the rule."""
    problems: list[str] = []
    event = event_from_json(run.release_event)
    per_pass: Counter[str] = Counter()
    counted = 0
    for expected_seq, row in enumerate(sorted(rows, key=lambda r: r.seq)):
        if row.seq != expected_seq:
            problems.append(f"seq {row.seq} where {expected_seq} was expected")
        if event_from_json(row.release_event) != event:
            problems.append(f"seq {row.seq}: release event differs from the run's")
        should_count = is_counted(per_pass[row.pass_id], run.participation_bound)
        if row.counted != should_count:
            problems.append(
                f"seq {row.seq}: counted={row.counted} but the rule says {should_count}"
            )
        per_pass[row.pass_id] += 1
        counted += int(should_count)
    result = epsilon_of(composed_event(event, counted), run.delta)
    recorded = max(rows, key=lambda r: r.seq).epsilon_after if rows else None
    if recorded is not None and not _same(recorded, result.epsilon):
        problems.append(f"recorded ε {recorded} differs from the replayed ε {result.epsilon}")
    return ReplayResult(
        epsilon=result.epsilon,
        accountant=result.accountant,
        counted=counted,
        charges=len(rows),
        recorded_epsilon=recorded,
        problems=problems,
    )


def _same(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


ASSUMPTIONS: dict[str, str] = {
    "visible-batch": (
        "visible-batch: party B sees every batch's node ids, so sampling the roots earns "
        "no amplification. Each release is a Gaussian mechanism on the edges it can touch; "
        "in a pass (one epoch, or one evaluation sweep) a node is a root at most once, so "
        "one edge can influence at most N_e releases of the pass, and only the first N_e "
        "releases of each pass are counted. Neighbour sampling is not credited."
    ),
}


class RunStatusView(_Record):
    """A run's budget as the accountant reports it (REST ``GET /v1/runs/{id}``)."""

    run_id: str
    status: RunState
    privacy_unit: str
    accounting: str
    assumption: str
    accountant: str
    epsilon_budget: float
    epsilon_spent: float
    delta: float
    charges: int
    counted_charges: int
    participation_bound: int | None
    release_event: str
    extractor: str
    details: dict
    created_at: str
    closed_at: str | None
    closed_reason: str


class LedgerView(_Record):
    """Everything needed to recompute a run's ε (REST ``GET /v1/runs/{id}/ledger``)."""

    run: RunRecord
    rows: list[LedgerRow]
