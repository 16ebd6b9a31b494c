"""The accountant's rules: create runs, charge releases write-ahead, refuse what the budget cannot cover.

A charge is checked (run active, release key new or an exact retry, event equal to
the run's rule for its kind), then ε after the charge is computed from the counted
releases; if it exceeds the budget nothing is written and the charge is refused.
Otherwise the row is committed to SQLite and only then acknowledged.

Party B's label ledgers (privacy unit ``label``, accounting ``labels``) follow the same
rules with one kind of release, ``one-shot``, every one counted
(:func:`vesper.common.privacy.ledger.check_label_events`); which party may spend which
ledger is decided by the gRPC layer (service.py).

Charges of one run are serialised by a per-run lock, so several workers of party A
may charge concurrently: each gets the next ledger position in commit order. A charge
whose release key is already in the ledger is a retry (a network fault hid the first
receipt): it returns the stored receipt and writes nothing, so nothing is charged
twice.
"""

from __future__ import annotations

import math
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import get_args

import dp_accounting as dpa

from vesper.accountant.leases import LeaseHeld, Leases
from vesper.accountant.ledger_store import LedgerStore
from vesper.common.privacy.accounting import calibrate
from vesper.common.privacy.events import EventError, event_from_json, event_to_json
from vesper.common.privacy.hidden_batch_reproduction import calibrate_bound6
from vesper.common.privacy.ledger import (
    ASSUMPTIONS,
    KINDS,
    LABEL_ACCOUNTING,
    LABEL_LEDGER_SUFFIX,
    LABEL_UNIT,
    ChargeRule,
    CurvePoint,
    LedgerRow,
    PlannedPass,
    PlanRule,
    RunRecord,
    RunStatusView,
    Spent,
    assumption_text,
    check_hidden_batch_events,
    check_label_events,
    check_no_label_mechanisms,
    check_unit_and_mode,
    composed_event,
    counted_per_kind,
    is_counted,
    parse_rules,
    samples_training_steps,
    spent,
)
from vesper.common.privacy.names import AccountantName

ACCOUNTANTS = get_args(AccountantName)
# room for party B's label ledger of a 64-character run id (``<run id>.labels``)
MAX_RUN_ID = 128
RUN_ID = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9_.-]{{0,{MAX_RUN_ID - 1}}}")
PRIVACY_UNITS = ("edge", "node", LABEL_UNIT)


class AccountantError(Exception):
    """A request the accountant refuses; ``code`` names a gRPC status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def shown(value: str, limit: int = 80) -> str:
    """A client's string as an error message quotes it: bounded, since a status's details
    travel in a header that a client refuses past 16 KiB (the error would be lost)."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _invalid(message: str) -> AccountantError:
    return AccountantError("INVALID_ARGUMENT", message)


@dataclass
class _RunState:
    """What the ledger implies about a run, kept in memory to decide charges quickly."""

    record: RunRecord
    events: dict[str, dpa.DpEvent]
    next_seq: int = 0
    counted: Counter = field(default_factory=Counter)
    per_pass: Counter = field(default_factory=Counter)
    pass_kind: dict[str, str] = field(default_factory=dict)
    spent: Spent = field(
        default_factory=lambda: Spent(epsilon=0.0, accountant="none", epsilon_events=0.0, events_accountant="none")
    )
    curve: list[CurvePoint] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, row: LedgerRow, after: Spent) -> None:
        self.next_seq = row.seq + 1
        self.per_pass[row.pass_id] += 1
        self.pass_kind.setdefault(row.pass_id, row.kind)
        self.counted[row.kind] += int(row.counted)
        self.spent = after
        if row.counted:
            self.curve.append(CurvePoint(seq=row.seq, epsilon=row.epsilon_after))


@contextmanager
def _lease_refusals() -> Iterator[None]:
    """Another trainer's live lease as the status a second trainer is refused with: ABORTED, gRPC's
    status for a concurrency conflict (party A waits it out on resume, and stops if it lost the run)."""
    try:
        yield
    except LeaseHeld as exc:
        raise AccountantError("ABORTED", str(exc)) from None


class Accountant:
    def __init__(self, store: LedgerStore, leases: Leases | None = None) -> None:
        self.store = store
        self.leases = leases or Leases()
        self._runs: dict[str, _RunState] = {}
        self._lock = threading.Lock()

    # -- validation ---------------------------------------------------------------------------
    @staticmethod
    def _check_common(accounting: str, accountant: str, delta: float) -> None:
        if accounting not in ASSUMPTIONS:
            raise _invalid(f"unknown accounting mode {accounting!r}; known: {sorted(ASSUMPTIONS)}")
        if accountant not in ACCOUNTANTS:
            raise _invalid(f"unknown accountant {accountant!r}; known: {list(ACCOUNTANTS)}")
        if not 0 < delta < 1:
            raise _invalid(f"delta must be in (0, 1), got {delta}")

    @staticmethod
    def _parse_event(event_json: str) -> dpa.DpEvent:
        try:
            return event_from_json(event_json)
        except EventError as exc:
            raise _invalid(f"bad release event: {exc}") from None

    def _parse_rules(self, rules: list[ChargeRule], accounting: str) -> dict[str, dpa.DpEvent]:
        kinds = [rule.kind for rule in rules]
        if len(set(kinds)) != len(kinds):
            raise _invalid(f"one rule per kind of release, got kinds {kinds}")
        if accounting != LABEL_ACCOUNTING and "train" not in kinds:
            raise _invalid("a run needs a rule for its train releases")
        events = {rule.kind: self._parse_event(rule.release_event) for rule in rules}
        try:
            if accounting == LABEL_ACCOUNTING:
                check_label_events(events, {rule.kind: rule.participation_bound for rule in rules})
            else:
                check_no_label_mechanisms(events)
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        if accounting == "hidden-batch":
            try:
                check_hidden_batch_events(events)
            except ValueError as exc:
                raise _invalid(str(exc)) from None
            # a release that reads no edge (no-op) is free under every accounting: nothing to count
            if not isinstance(events["train"], dpa.NoOpDpEvent) and next(
                r for r in rules if r.kind == "train"
            ).participation_bound is not None:
                raise _invalid("hidden-batch counts every training step: no participation bound for train")
        return events

    # -- plans -------------------------------------------------------------------------------
    @staticmethod
    def calibrate_gaussian(
        passes: list[PlannedPass], plan_rules: list[PlanRule], target_epsilon: float, delta: float,
        accounting: str, accountant: str,
    ) -> tuple[float, Spent, list[ChargeRule], int]:
        """Smallest z whose plan, charged as the ledger would charge it, stays within the target.

        Reads no ledger, so tools may call it on the class (``vesper bench snr``).
        """
        Accountant._check_common(accounting, accountant, delta)
        bounds = {rule.kind: rule.participation_bound for rule in plan_rules}
        if len(bounds) != len(plan_rules):
            raise _invalid("one rule per kind of release")
        try:
            counted = counted_per_kind(passes, bounds)
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        if sum(counted.values()) == 0:
            raise _invalid("nothing to calibrate: the plan counts no release")

        def events(z: float) -> dict[str, dpa.DpEvent]:
            return {rule.kind: rule.event(z) for rule in plan_rules}

        def charged(z: float) -> Spent:
            return spent(accounting, accountant, delta, events(z), counted)

        try:
            if accounting == "hidden-batch":
                check_hidden_batch_events(events(1.0))
            if accounting == LABEL_ACCOUNTING:
                check_label_events(events(1.0), bounds)
            z, _ = calibrate(
                lambda z: composed_event(events(z), counted), target_epsilon, delta, accountant=accountant
            )
            if accounting == "hidden-batch" and samples_training_steps(events(1.0)):
                # both numbers fall as z grows, so the plan fits at the larger of the two z's
                z = max(z, _calibrate_bound6(plan_rules, counted, target_epsilon, delta))
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        rules = [
            ChargeRule(kind=r.kind, release_event=event_to_json(r.event(z)), participation_bound=r.participation_bound)
            for r in plan_rules
        ]
        return z, charged(z), rules, sum(counted.values())

    def estimate(
        self, rules: list[ChargeRule], passes: list[PlannedPass], delta: float, accounting: str, accountant: str
    ) -> tuple[Spent, int]:
        self._check_common(accounting, accountant, delta)
        events = self._parse_rules(rules, accounting)
        try:
            counted = counted_per_kind(passes, {r.kind: r.participation_bound for r in rules})
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        return spent(accounting, accountant, delta, events, counted), sum(counted.values())

    # -- runs --------------------------------------------------------------------------------
    def create_run(
        self,
        run_id: str,
        privacy_unit: str,
        accounting: str,
        accountant: str,
        epsilon_budget: float,
        delta: float,
        rules: list[ChargeRule],
        extractor: str,
        details: dict,
        assumption_note: str = "",
        lease: str = "",
        lease_ttl_s: float = 0.0,
    ) -> RunStatusView:
        """A new run; ``lease``: its trainer's (``announce_run``), which it then holds."""
        self._check_common(accounting, accountant, delta)
        try:
            check_unit_and_mode(privacy_unit, accounting)
        except ValueError as exc:
            raise _invalid(str(exc)) from None
        if math.isnan(epsilon_budget) or epsilon_budget <= 0:
            raise _invalid(f"epsilon budget must be > 0, got {epsilon_budget}")
        if not RUN_ID.fullmatch(run_id):
            raise _invalid(
                f"run id must have 1 to {MAX_RUN_ID} characters, each a letter, digit, '_', '-' or '.', the first "
                f"not '.' (the REST status serves it at /v1/runs/<run id>); got {shown(run_id)}"
            )
        if privacy_unit not in PRIVACY_UNITS:
            raise _invalid(f"unknown privacy unit {privacy_unit!r}; known: {', '.join(PRIVACY_UNITS)}")
        self._check_namespace(run_id, privacy_unit)
        if len(assumption_note) > 1000:
            raise _invalid("the assumption note is limited to 1000 characters")
        events = self._parse_rules(rules, accounting)
        record = RunRecord(
            run_id=run_id,
            created_at=_now(),
            privacy_unit=privacy_unit,
            accounting=accounting,
            assumption=assumption_text(accounting, assumption_note),
            accountant=accountant,
            epsilon_budget=epsilon_budget,
            delta=delta,
            rules=[rule.model_copy(update={"release_event": event_to_json(events[rule.kind])}) for rule in rules],
            extractor=extractor,
            details=details,
        )
        state = _RunState(record, events)
        state.spent = spent(accounting, accountant, delta, events, {})
        with self._lock:
            if self.store.get_run(run_id) is not None:
                raise AccountantError("ALREADY_EXISTS", f"run {run_id!r} already exists")
            with _lease_refusals():
                self.leases.acquire(run_id, lease, lease_ttl_s)
            self.store.insert_run(record)
            self._runs[run_id] = state
        self.leases.created(run_id)
        return self.status(run_id)

    def _check_namespace(self, run_id: str, privacy_unit: str) -> None:
        """Party B's label ledgers are ``<run id>.labels`` of a run party A announced or created, and
        nothing else: a label ledger cannot take a name party A's run will need (squatting)."""
        if privacy_unit != LABEL_UNIT:
            if run_id.endswith(LABEL_LEDGER_SUFFIX):
                raise _invalid(
                    f"run id {shown(run_id)} ends in {LABEL_LEDGER_SUFFIX!r}, which names party B's label ledgers; "
                    "choose another id"
                )
            return
        base = run_id.removesuffix(LABEL_LEDGER_SUFFIX)
        record = self.store.get_run(base) if base != run_id else None
        if base == run_id or (record is None and not self.leases.announced(base)):
            raise AccountantError(
                "PERMISSION_DENIED",
                f"party B may open only the label ledger '<run id>{LABEL_LEDGER_SUFFIX}' of a run party A has "
                f"announced or created; {shown(run_id)} is not one",
            )
        if record is not None and record.privacy_unit == LABEL_UNIT:
            raise _invalid(f"run {shown(base)} is itself a label ledger")

    def announce_run(self, run_id: str, lease: str, ttl_s: float) -> float:
        """Party A is about to set up ``run_id`` with party B, under its trainer's ``lease``:
        B may open the run's label ledger from now on. Seconds until the lease expires."""
        if not RUN_ID.fullmatch(run_id) or run_id.endswith(LABEL_LEDGER_SUFFIX):
            raise _invalid(f"cannot announce run id {shown(run_id)}: an id of party A's runs is expected")
        if not lease:
            raise _invalid("announcing a run needs its trainer's lease")
        if self.store.get_run(run_id) is not None:
            raise AccountantError("ALREADY_EXISTS", f"run {run_id!r} already exists")
        with _lease_refusals():
            return self.leases.acquire(run_id, lease, ttl_s, announce=True)

    def renew_lease(self, run_id: str, lease: str, ttl_s: float) -> float:
        """The trainer holding ``run_id`` is alive; ABORTED if another trainer holds it."""
        if not lease:
            raise _invalid("renewing a lease needs the lease")
        if self.store.get_run(run_id) is None and not self.leases.announced(run_id):
            raise AccountantError("NOT_FOUND", f"unknown run id {shown(run_id)}")
        with _lease_refusals():
            self.leases.renew(run_id, lease, ttl_s)
        return ttl_s

    def _state(self, run_id: str) -> _RunState:
        with self._lock:
            state = self._runs.get(run_id)
            if state is not None:
                return state
            record = self.store.get_run(run_id)
            if record is None:
                raise AccountantError("NOT_FOUND", f"unknown run id {shown(run_id)}")
            events = parse_rules(record)
            state = _RunState(record, events)
            rows = self.store.charges(run_id)
            for row in rows:
                state.add(row, state.spent)
            state.spent = spent(record.accounting, record.accountant, record.delta, events, state.counted)
            self._runs[run_id] = state
            return state

    def privacy_unit(self, run_id: str) -> str:
        """The run's privacy unit (NOT_FOUND for an unknown run): it decides who may spend it."""
        return self._state(run_id).record.privacy_unit

    def charge(
        self, run_id: str, release_key: str, pass_id: str, kind: str, num_nodes: int, nodes_digest: str,
        event_json: str, lease: str = "",
    ) -> tuple[LedgerRow, bool]:
        """Charge one release; returns the ledger row and whether it was a retry of an earlier charge.
        ``lease``: the charging trainer's; refused under another trainer's live lease."""
        state = self._state(run_id)
        with state.lock:
            with _lease_refusals():
                self.leases.renew(run_id, lease)
            record = state.record
            if not release_key or len(release_key) > 128:
                raise _invalid("a charge needs a release key of 1 to 128 characters")
            earlier = self.store.charge_by_key(run_id, release_key)
            if earlier is not None:
                same = (earlier.pass_id, earlier.kind, earlier.num_nodes, earlier.nodes_digest) == (
                    pass_id, kind, num_nodes, nodes_digest
                ) and self._parse_event(event_json) == self._parse_event(earlier.release_event)
                if not same:
                    raise AccountantError(
                        "ALREADY_EXISTS",
                        f"release key {release_key!r} of run {run_id!r} was charged for a different release "
                        f"(seq {earlier.seq}); a retry must repeat the original charge exactly",
                    )
                return earlier, True
            if record.status != "active" and not (kind == "predict" and record.status == "completed"):
                # a completed run takes prediction passes only (docs/privacy.md, section 2.4)
                raise AccountantError("FAILED_PRECONDITION", f"run {run_id!r} is {record.status}; it takes no more charges")
            if kind not in KINDS:
                raise _invalid(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
            rule = record.rule(kind)
            if rule is None:
                raise _invalid(f"run {run_id!r} has no rule for {kind} releases")
            if not pass_id or num_nodes <= 0:
                raise _invalid("a charge needs a pass id and at least one node")
            if state.pass_kind.get(pass_id, kind) != kind:
                raise _invalid(f"pass {pass_id!r} holds {state.pass_kind[pass_id]} releases, not {kind}")
            if self._parse_event(event_json) != state.events[kind]:
                raise _invalid(f"release event differs from the one declared for this run's {kind} releases")
            counted = is_counted(state.per_pass[pass_id], rule.participation_bound)
            after = state.spent
            if counted:
                totals = Counter(state.counted)
                totals[kind] += 1
                after = spent(record.accounting, record.accountant, record.delta, state.events, totals)
            if after.epsilon > record.epsilon_budget:
                raise AccountantError(
                    "RESOURCE_EXHAUSTED",
                    f"budget exhausted: this release would raise epsilon from {state.spent.epsilon:.6g} "
                    f"to {after.epsilon:.6g}, above the budget {record.epsilon_budget:g} (delta={record.delta:.3g})",
                )
            row = LedgerRow(
                run_id=run_id, seq=state.next_seq, accounting=record.accounting, release_key=release_key, nodes_digest=nodes_digest,
                pass_id=pass_id, kind=kind, num_nodes=num_nodes, release_event=rule.release_event,
                counted=counted, epsilon_after=after.epsilon, accountant=after.accountant, created_at=_now(),
            )
            self.store.append_charge(row)
            state.add(row, after)
            return row, False

    def close_run(self, run_id: str, status: str, reason: str, lease: str = "") -> RunStatusView:
        """End an active run; "interrupted" leaves it resumable (``reopen_run``), and an
        interrupted run may still be closed for good. A closed run stays closed. Its lease ends
        (refused under another trainer's live lease)."""
        if status not in ("completed", "failed", "refused", "cancelled", "interrupted"):
            raise _invalid(f"cannot close a run as {status!r}")
        state = self._state(run_id)
        with state.lock:
            with _lease_refusals():
                self.leases.release(run_id, lease)
            if state.record.status == "active" or (state.record.status == "interrupted" and status != "interrupted"):
                closed = state.record.model_copy(update={"status": status, "closed_at": _now(), "closed_reason": reason[:2000]})
                self.store.update_run(closed)  # on disk first: a failed write leaves memory as the ledger is
                state.record = closed
        return self.status(run_id)

    def reopen_run(self, run_id: str, reason: str, lease: str = "", lease_ttl_s: float = 0.0) -> RunStatusView:
        """An interrupted run takes charges again (party A resumes it); an active one is left as it is.
        ``lease``: the resuming trainer's, refused while another trainer's lease is live."""
        state = self._state(run_id)
        with state.lock:
            status = state.record.status
            if status in ("active", "interrupted"):
                with _lease_refusals():
                    self.leases.acquire(run_id, lease, lease_ttl_s)
            if status == "interrupted":
                reopened = state.record.model_copy(update={
                    "status": "active", "closed_at": None, "closed_reason": f"reopened: {reason}"[:2000],
                })
                self.store.update_run(reopened)  # on disk first, as in close_run
                state.record = reopened
            elif status != "active":
                raise AccountantError("FAILED_PRECONDITION", f"run {run_id!r} is {status}; only an interrupted run can be reopened")
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
                accountant_requested=record.accountant,
                epsilon_budget=record.epsilon_budget,
                epsilon_spent=state.spent.epsilon,
                epsilon_events=state.spent.epsilon_events,
                epsilon_bound6=state.spent.epsilon_bound6,
                delta=record.delta,
                charges=state.next_seq,
                counted_charges=sum(state.counted.values()),
                rules=record.rules,
                extractor=record.extractor,
                details=record.details,
                created_at=record.created_at,
                closed_at=record.closed_at,
                closed_reason=record.closed_reason,
                epsilon_curve=list(state.curve),
                prediction_passes=sum(1 for kind in state.pass_kind.values() if kind == "predict"),
            )

    def list_runs(self) -> list[RunStatusView]:
        return [self.status(record.run_id) for record in self.store.list_runs()]


def _calibrate_bound6(plan_rules: list[PlanRule], counted: dict[str, int], target: float, delta: float) -> float:
    """z at which [VESPER, bound (6)] meets the target: sampled train steps plus the unsampled sweep.

    The sweep's releases at noise multiplier s·z add precision n/(s z)², i.e. n/s²
    releases at z (ledger.bound6_epsilon charges the same).
    """
    train = next(rule for rule in plan_rules if rule.kind == "train")
    sweeps = sum(
        counted.get(rule.kind, 0) / rule.noise_scale**2 for rule in plan_rules
        if rule.kind != "train" and rule.mechanism == "gaussian"
    )
    z, _, _ = calibrate_bound6(
        target, train.sampling_probability, counted.get("train", 0), delta, unsampled_releases=sweeps
    )
    return z
