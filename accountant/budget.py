"""The accountant's rules: create runs, charge releases write-ahead, refuse what the budget cannot cover.

A charge is checked (run active, sequence number next, event equal to the run's
declared release event), then ε after the charge is computed from the counted
releases; if it exceeds the budget nothing is written and the charge is refused.
Otherwise the row is committed to SQLite and only then acknowledged.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone

import dp_accounting as dpa

from vesper.accountant.ledger_store import LedgerStore
from vesper.common.privacy.accounting import EpsilonResult, calibrate, epsilon_of
from vesper.common.privacy.events import EventError, event_from_json, event_to_json
from vesper.common.privacy.ledger import (
    ASSUMPTIONS,
    LedgerRow,
    RunRecord,
    RunStatusView,
    composed_event,
    counted_releases,
    is_counted,
    plan_epsilon,
)


class AccountantError(Exception):
    """A request the accountant refuses; ``code`` names a gRPC status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


@dataclass
class _RunState:
    """What the ledger implies about a run, kept in memory to decide charges quickly."""

    record: RunRecord
    event: dpa.DpEvent
    next_seq: int = 0
    counted: int = 0
    per_pass: Counter = field(default_factory=Counter)
    spent: EpsilonResult = EpsilonResult(0.0, "gaussian-exact")
    lock: threading.Lock = field(default_factory=threading.Lock)


class Accountant:
    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self._runs: dict[str, _RunState] = {}
        self._lock = threading.Lock()

    # -- plans -------------------------------------------------------------------------------
    def calibrate_gaussian(
        self, pass_sizes: list[int], participation_bound: int | None, target_epsilon: float, delta: float
    ) -> tuple[float, EpsilonResult, int]:
        counted = counted_releases(pass_sizes, participation_bound)
        if counted == 0:
            raise AccountantError("INVALID_ARGUMENT", "nothing to calibrate: the plan counts no release")
        if not 0 < delta < 1:
            raise AccountantError("INVALID_ARGUMENT", f"delta must be in (0, 1), got {delta}")
        try:
            z, result = calibrate(
                lambda z: composed_event(dpa.GaussianDpEvent(z), counted), target_epsilon, delta
            )
        except ValueError as exc:
            raise AccountantError("INVALID_ARGUMENT", str(exc)) from None
        return z, result, counted

    def estimate(
        self, event_json: str, pass_sizes: list[int], participation_bound: int | None, delta: float
    ) -> tuple[EpsilonResult, int]:
        event = self._parse_event(event_json)
        if not 0 < delta < 1:
            raise AccountantError("INVALID_ARGUMENT", f"delta must be in (0, 1), got {delta}")
        return plan_epsilon(event, pass_sizes, participation_bound, delta)

    # -- runs --------------------------------------------------------------------------------
    def create_run(
        self,
        run_id: str,
        privacy_unit: str,
        accounting: str,
        epsilon_budget: float,
        delta: float,
        release_event: str,
        participation_bound: int | None,
        extractor: str,
        details: dict,
    ) -> RunStatusView:
        if accounting not in ASSUMPTIONS:
            raise AccountantError("INVALID_ARGUMENT", f"unknown accounting mode {accounting!r}; known: {sorted(ASSUMPTIONS)}")
        if math.isnan(epsilon_budget) or epsilon_budget <= 0:
            raise AccountantError("INVALID_ARGUMENT", f"epsilon budget must be > 0, got {epsilon_budget}")
        if not 0 < delta < 1:
            raise AccountantError("INVALID_ARGUMENT", f"delta must be in (0, 1), got {delta}")
        if not run_id or len(run_id) > 64:
            raise AccountantError("INVALID_ARGUMENT", "run id must have 1 to 64 characters")
        event = self._parse_event(release_event)
        record = RunRecord(
            run_id=run_id,
            created_at=_now(),
            privacy_unit=privacy_unit,
            accounting=accounting,
            assumption=ASSUMPTIONS[accounting],
            epsilon_budget=epsilon_budget,
            delta=delta,
            release_event=event_to_json(event),
            participation_bound=participation_bound,
            extractor=extractor,
            details=details,
        )
        with self._lock:
            if self.store.get_run(run_id) is not None:
                raise AccountantError("ALREADY_EXISTS", f"run {run_id!r} already exists")
            self.store.insert_run(record)
            self._runs[run_id] = _RunState(record, event)
        return self.status(run_id)

    def _state(self, run_id: str) -> _RunState:
        with self._lock:
            state = self._runs.get(run_id)
            if state is not None:
                return state
            record = self.store.get_run(run_id)
            if record is None:
                raise AccountantError("NOT_FOUND", f"unknown run id {run_id!r}")
            state = _RunState(record, event_from_json(record.release_event))
            for row in self.store.charges(run_id):
                state.next_seq = row.seq + 1
                state.per_pass[row.pass_id] += 1
                state.counted += int(row.counted)
            state.spent = epsilon_of(composed_event(state.event, state.counted), record.delta)
            self._runs[run_id] = state
            return state

    def charge(self, run_id: str, seq: int, pass_id: str, kind: str, num_nodes: int, event_json: str) -> LedgerRow:
        state = self._state(run_id)
        with state.lock:
            record = state.record
            if record.status != "active":
                raise AccountantError("FAILED_PRECONDITION", f"run {run_id!r} is {record.status}; it takes no more charges")
            if seq < state.next_seq:
                raise AccountantError("ALREADY_EXISTS", f"charge {seq} of run {run_id!r} is a replay; the next is {state.next_seq}")
            if seq > state.next_seq:
                raise AccountantError("FAILED_PRECONDITION", f"charge {seq} skips ahead; the next charge of run {run_id!r} is {state.next_seq}")
            if kind not in ("train", "eval"):
                raise AccountantError("INVALID_ARGUMENT", f"kind must be train or eval, got {kind!r}")
            if not pass_id or num_nodes <= 0:
                raise AccountantError("INVALID_ARGUMENT", "a charge needs a pass id and at least one node")
            if self._parse_event(event_json) != state.event:
                raise AccountantError("INVALID_ARGUMENT", "release event differs from the one declared for this run")
            counted = is_counted(state.per_pass[pass_id], record.participation_bound)
            total = state.counted + int(counted)
            spent = epsilon_of(composed_event(state.event, total), record.delta)
            if spent.epsilon > record.epsilon_budget:
                raise AccountantError(
                    "RESOURCE_EXHAUSTED",
                    f"budget exhausted: this release would raise epsilon from {state.spent.epsilon:.6g} "
                    f"to {spent.epsilon:.6g}, above the budget {record.epsilon_budget:g} (delta={record.delta:.3g})",
                )
            row = LedgerRow(
                run_id=run_id, seq=seq, pass_id=pass_id, kind=kind, num_nodes=num_nodes,
                release_event=record.release_event, counted=counted, epsilon_after=spent.epsilon,
                accountant=spent.accountant, created_at=_now(),
            )
            self.store.append_charge(row)
            state.next_seq += 1
            state.per_pass[pass_id] += 1
            state.counted = total
            state.spent = spent
            return row

    def close_run(self, run_id: str, status: str, reason: str) -> RunStatusView:
        if status not in ("completed", "failed", "refused", "cancelled"):
            raise AccountantError("INVALID_ARGUMENT", f"cannot close a run as {status!r}")
        state = self._state(run_id)
        with state.lock:
            if state.record.status == "active":
                state.record = state.record.model_copy(update={"status": status, "closed_at": _now(), "closed_reason": reason})
                self.store.update_run(state.record)
        return self.status(run_id)

    def status(self, run_id: str) -> RunStatusView:
        state = self._state(run_id)
        with state.lock:
            record = state.record
            return RunStatusView(
                run_id=record.run_id,
                status=record.status,
                privacy_unit=record.privacy_unit,
                accounting=record.accounting,
                assumption=record.assumption,
                accountant=state.spent.accountant,
                epsilon_budget=record.epsilon_budget,
                epsilon_spent=state.spent.epsilon,
                delta=record.delta,
                charges=state.next_seq,
                counted_charges=state.counted,
                participation_bound=record.participation_bound,
                release_event=record.release_event,
                extractor=record.extractor,
                details=record.details,
                created_at=record.created_at,
                closed_at=record.closed_at,
                closed_reason=record.closed_reason,
            )

    def list_runs(self) -> list[RunStatusView]:
        return [self.status(record.run_id) for record in self.store.list_runs()]

    @staticmethod
    def _parse_event(event_json: str) -> dpa.DpEvent:
        try:
            return event_from_json(event_json)
        except EventError as exc:
            raise AccountantError("INVALID_ARGUMENT", f"bad release event: {exc}") from None
