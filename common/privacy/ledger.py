"""Ledger records and the rule that turns them into ε.

A run declares, per kind of release (``train``, ``eval``, ``one-shot``, ``pre-train``), one per-release DpEvent and
a participation bound N_e. Releases are grouped into passes (one training epoch, one
evaluation sweep), and within a pass a node is a root at most once, so a single edge
can influence at most N_e releases of a pass (docs/privacy.md, section 4). The first
N_e releases of each pass are *counted*: each adds its kind's event to the
composition; later releases of the same pass are recorded but add nothing, since the
worst-case edge is already charged N_e times in that pass. With one event per kind
that is exact worst-case accounting at every prefix of the run, and it makes ε a
function of the ledger alone::

    ε = ε( Composed[ SelfComposed(event_kind, #counted rows of that kind) ], δ )

under the run's accountant (``pld`` or ``rdp``). Under ``hidden-batch`` the paper's
own bound ([VESPER, Thm. 2.1]: [VESPER, bound (6)] with [VESPER, Lemma 2]) is computed from the same rows
too, and the run is charged the larger of the two numbers.

Party B's label ledgers (accounting ``labels``, privacy unit ``label``) use the same rule
with one kind, ``one-shot``, and every release counted (one label can reach each of
them): RR is one charge, DP-GPL one charge per query (docs/accounting.md, section 6).

:func:`replay` recomputes ε from the rows and checks the rule row by row.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Literal

import dp_accounting as dpa
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent  # not re-exported by dp-accounting 0.6.0
from pydantic import BaseModel, ConfigDict, Field, model_validator

from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.events import EventError, check_mixture, event_from_json
from vesper.common.privacy.hidden_batch_reproduction import hidden_batch_bound6_epsilon
from vesper.common.privacy.names import AccountantName
from vesper.common.versioning import Report

# interrupted: a peer vanished mid-run; party A may reopen it and resume from its checkpoint
RunState = Literal["active", "interrupted", "completed", "failed", "refused", "cancelled"]
Kind = Literal["train", "eval", "one-shot", "pre-train", "predict"]
AccountingMode = Literal["visible-batch", "hidden-batch", "labels"]
KINDS: tuple[Kind, ...] = ("train", "eval", "one-shot", "pre-train", "predict")
# Party B's label ledgers: this privacy unit always goes with this accounting mode, and back
LABEL_UNIT = "label"
LABEL_ACCOUNTING = "labels"
LABEL_KIND: Kind = "one-shot"
LABEL_LEDGER_SUFFIX = ".labels"


def label_ledger_id(run_id: str) -> str:
    """Party B's label ledger of party A's run ``run_id``: a run of its own at the accountant."""
    return f"{run_id}{LABEL_LEDGER_SUFFIX}"


def main_run_id(run_id: str) -> str:
    """Party A's run of a label ledger id; any other id is returned unchanged."""
    return run_id[: -len(LABEL_LEDGER_SUFFIX)] if run_id.endswith(LABEL_LEDGER_SUFFIX) else run_id


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


# what the accountant reports (REST, the ledger file) is read by other versions: common.versioning


ASSUMPTIONS: dict[str, str] = {
    "visible-batch": (
        "visible-batch: party B sees every batch's node ids, so sampling the roots earns "
        "no amplification. Each release is a Gaussian mechanism on the edges it can touch; "
        "in a pass (one epoch, or one evaluation sweep) a node is a root at most once, so "
        "one edge can influence at most N_e releases of the pass, and only the first N_e "
        "releases of each pass are counted. Only randomness party A keeps hidden from B "
        "is credited (none unless an edge sample rate is stated below)."
    ),
    "hidden-batch": (
        "hidden-batch: ASSUMES party B cannot tell which edges a step used, and credits "
        "the paper's amplification by the batch's sampling probability γ (VESPER "
        "Theorem 2.1). That assumption is FALSE in vesper's protocol, where B sees every "
        "batch's node ids: this mode reproduces the paper's numbers and is no guarantee "
        "against party B. The run is charged the larger of dp-accounting's ε for the "
        "recorded events and the paper's bound (6) converted with its Lemma 2."
    ),
    "labels": (
        "labels: party B's own ledger. Privacy unit: the label of one of party B's training "
        "nodes (two label sets are neighbours when exactly one training label differs). "
        "Party B charges every mechanism it runs on these labels (randomised response once, "
        "or each teacher-ensemble query) before anything derived from them leaves B, and "
        "every charge is counted; what B computes afterwards from the privatised labels is "
        "post-processing. Node ids, including which nodes B holds labels for, are not "
        "protected. This ledger is separate from party A's and is never added to it."
    ),
}


def assumption_text(mode: str, note: str = "") -> str:
    """The assumption a run's every status line and report carries, in words."""
    return ASSUMPTIONS[mode] + (f" {note}" if note else "")


class ChargeRule(_Record):
    """How every release of one kind is charged, fixed when the run is created."""

    kind: Kind
    release_event: str = Field(description="DpEvent JSON charged for each counted release")
    participation_bound: int | None = Field(
        description="N_e: counted releases per pass; null = every release counts", ge=0
    )


class PlanRule(_Record):
    """A kind's charge as a function of the run's noise multiplier z (for calibration).

    ``exponential``: one round of an exponential mechanism whose bounded-range parameter
    is ε0 = 1/(noise_scale·z); an ε0-bounded-range mechanism is ε0²/8-zCDP (Cesar & Rogers
    [CR21]), so the event is ``ZCDpEvent(ε0²/8)`` (docs/extractors/dpar.md, section 4).

    ``mixture-of-gaussians``: a Gaussian of std noise_scale·z whose sensitivity is random,
    ``sensitivities[i]`` with probability ``sampling_probs[i]`` (dp-accounting's
    MixtureOfGaussiansDpEvent; PLD only). HeterPoisson's per-step release
    (docs/extractors/heterpoisson.md).

    ``repeats``: one release made of that many runs of the mechanism, charged before the
    first (e.g. a chunk of private pre-training steps that never leave party A):
    ``SelfComposed(event, repeats)``.
    """

    kind: Kind
    participation_bound: int | None = Field(ge=0)
    sampling_probability: float = Field(1.0, gt=0.0, le=1.0)
    noise_scale: float = Field(1.0, gt=0.0)
    mechanism: Literal["gaussian", "exponential", "mixture-of-gaussians", "no-op"] = Field(
        "gaussian",
        description="gaussian: Gaussian(noise_scale·z); exponential: ZCDp(ε0²/8) with ε0 = 1/(noise_scale·z); "
        "mixture-of-gaussians: MoG(noise_scale·z, sensitivities, sampling_probs); "
        "no-op: post-processing of charged releases",
    )
    sensitivities: list[float] = Field(default_factory=list, description="mixture-of-gaussians only")
    sampling_probs: list[float] = Field(default_factory=list, description="mixture-of-gaussians only")
    repeats: int = Field(1, ge=1, description="mechanism runs per release: SelfComposed(event, repeats)")

    @model_validator(mode="after")
    def _consistent(self) -> PlanRule:
        if self.mechanism in ("exponential", "mixture-of-gaussians") and self.sampling_probability < 1.0:
            raise ValueError(f"a {self.mechanism} rule cannot be Poisson-sampled: no accountant here covers it")
        mixture = self.mechanism == "mixture-of-gaussians"
        if mixture != bool(self.sensitivities) or mixture != bool(self.sampling_probs):
            raise ValueError("sensitivities and sampling_probs are given exactly for mixture-of-gaussians rules")
        if mixture:
            check_mixture(self.sensitivities, self.sampling_probs)
        return self

    def event(self, z: float) -> dpa.DpEvent:
        base = self._single_event(z)
        if self.repeats == 1 or isinstance(base, dpa.NoOpDpEvent):
            return base
        return dpa.SelfComposedDpEvent(base, self.repeats)

    def _single_event(self, z: float) -> dpa.DpEvent:
        if self.mechanism == "no-op":
            return dpa.NoOpDpEvent()
        if self.mechanism == "exponential":
            epsilon0 = 1.0 / (self.noise_scale * z)
            return dpa.ZCDpEvent(rho=epsilon0 * epsilon0 / 8.0)
        if self.mechanism == "mixture-of-gaussians":
            return MixtureOfGaussiansDpEvent(self.noise_scale * z, list(self.sensitivities), list(self.sampling_probs))
        gaussian = dpa.GaussianDpEvent(self.noise_scale * z)
        if self.sampling_probability >= 1.0:
            return gaussian
        return dpa.PoissonSampledDpEvent(self.sampling_probability, gaussian)


class PlannedPass(_Record):
    kind: Kind
    releases: int = Field(ge=0)


class RunRecord(Report):
    """A run as the accountant created it; the mode, rules and budget never change."""

    run_id: str
    status: RunState = "active"
    created_at: str
    closed_at: str | None = None
    closed_reason: str = ""
    privacy_unit: str = Field(description="what one DP neighbour differs in, e.g. 'edge'")
    accounting: AccountingMode
    assumption: str
    accountant: AccountantName
    epsilon_budget: float
    delta: float
    rules: list[ChargeRule]
    extractor: str
    details: dict = Field(default_factory=dict)

    def rule(self, kind: str) -> ChargeRule | None:
        return next((r for r in self.rules if r.kind == kind), None)


class LedgerRow(Report):
    """One charge, committed before the release it pays for is sent."""

    run_id: str
    seq: int
    accounting: AccountingMode = Field(description="the run's mode, on every row (hidden-batch assumes B cannot see batches)")
    release_key: str
    nodes_digest: str
    pass_id: str
    kind: Kind
    num_nodes: int
    release_event: str
    counted: bool
    epsilon_after: float
    accountant: str
    created_at: str


class Spent(_Record):
    """ε of a run so far, and where it came from."""

    epsilon: float = Field(description="what is charged against the budget")
    accountant: str = Field(description="what produced `epsilon`")
    epsilon_events: float = Field(description="dp-accounting's ε of the recorded DpEvents")
    events_accountant: str
    epsilon_bound6: float | None = Field(
        None, description="hidden-batch only: VESPER bound (6) with Lemma 2, from the same rows"
    )
    bound6_order: int | None = None


def is_counted(releases_before_in_pass: int, participation_bound: int | None) -> bool:
    """Whether the next release of a pass adds to the worst-case edge's composition."""
    return participation_bound is None or releases_before_in_pass < participation_bound


def counted_per_kind(
    passes: Iterable[PlannedPass], bounds: Mapping[str, int | None]
) -> dict[str, int]:
    """Counted releases of a plan per kind: Σ_pass min(N_e, releases in the pass)."""
    counted: Counter[str] = Counter()
    for planned in passes:
        if planned.kind not in bounds:
            raise ValueError(f"the plan has a {planned.kind} pass but no rule for {planned.kind} releases")
        bound = bounds[planned.kind]
        counted[planned.kind] += planned.releases if bound is None else min(bound, planned.releases)
    return dict(counted)


def composed_event(events: Mapping[str, dpa.DpEvent], counted: Mapping[str, int]) -> dpa.DpEvent:
    """The run's DpEvent after ``counted[kind]`` counted releases of each kind."""
    parts = [
        dpa.SelfComposedDpEvent(events[kind], n) if n > 1 else events[kind]
        for kind, n in sorted(counted.items())
        if n > 0 and not isinstance(events[kind], dpa.NoOpDpEvent)
    ]
    if not parts:
        return dpa.NoOpDpEvent()
    return parts[0] if len(parts) == 1 else dpa.ComposedDpEvent(parts)


def check_hidden_batch_events(events: Mapping[str, dpa.DpEvent]) -> None:
    """[VESPER, Thm. 2.1] covers sampled Gaussian training steps and unsampled Gaussian releases:
    the evaluation sweep, and one-shot releases made once over the whole graph (GAP's
    hops), which nothing hides either."""
    train = events.get("train")
    if not isinstance(train, (dpa.NoOpDpEvent, dpa.NonPrivateDpEvent)) and not (
        isinstance(train, dpa.PoissonSampledDpEvent) and isinstance(train.event, dpa.GaussianDpEvent)
    ):
        raise ValueError("hidden-batch training releases must be PoissonSampled(γ, Gaussian(z)) events")
    for kind, what in (("eval", "evaluation"), ("predict", "prediction"), ("one-shot", "one-shot")):
        if not isinstance(events.get(kind, dpa.NoOpDpEvent()), (dpa.NoOpDpEvent, dpa.NonPrivateDpEvent, dpa.GaussianDpEvent)):
            raise ValueError(f"hidden-batch {what} releases must be Gaussian events (nothing hides them)")
    if "pre-train" in events:
        raise ValueError("hidden-batch covers per-step and one-shot extractors only: bound (6) has no term for pre-train releases")


def check_unit_and_mode(privacy_unit: str, accounting: str) -> None:
    """Privacy unit ``label`` goes with accounting ``labels`` and nothing else does."""
    if (privacy_unit == LABEL_UNIT) != (accounting == LABEL_ACCOUNTING):
        raise ValueError(
            f"privacy unit {privacy_unit!r} with accounting {accounting!r}: a run of privacy unit "
            f"{LABEL_UNIT!r} (party B's labels) needs accounting {LABEL_ACCOUNTING!r}, and accounting "
            f"{LABEL_ACCOUNTING!r} needs privacy unit {LABEL_UNIT!r}"
        )


def _walk(event: dpa.DpEvent) -> Iterable[dpa.DpEvent]:
    """Every event of a composition tree, the tree's own nodes included."""
    yield event
    if isinstance(event, (dpa.SelfComposedDpEvent, dpa.PoissonSampledDpEvent)):
        yield from _walk(event.event)
    elif isinstance(event, dpa.ComposedDpEvent):
        for part in event.events:
            yield from _walk(part)


def check_label_events(events: Mapping[str, dpa.DpEvent], bounds: Mapping[str, int | None]) -> None:
    """A label ledger: one-shot releases only, every one counted, nothing credited for sampling.

    Every event must state its noise for the sensitivity under "replace one label"
    (randomised response is accounted under that relation). Poisson amplification and
    dp-accounting's mixture PLD are add-or-remove results, so neither can appear.
    """
    if set(events) != {LABEL_KIND}:
        raise ValueError(
            f"a label ledger charges {LABEL_KIND} releases only (one RR draw, or one charge per query), "
            f"got kinds {sorted(events)}"
        )
    if bounds.get(LABEL_KIND) is not None:
        raise ValueError(
            "a label ledger counts every release (one label can influence each of them): "
            f"no participation bound for {LABEL_KIND}"
        )
    for part in _walk(events[LABEL_KIND]):
        if isinstance(part, (dpa.PoissonSampledDpEvent, MixtureOfGaussiansDpEvent)):
            raise ValueError(
                f"a label ledger cannot account a {type(part).__name__}: its analysis here is for "
                "adding or removing a record, not for replacing one label"
            )


def check_no_label_mechanisms(events: Mapping[str, dpa.DpEvent]) -> None:
    """Randomised response is accounted under "replace one": only label ledgers may charge it."""
    for kind, event in events.items():
        if any(isinstance(part, dpa.RandomizedResponseDpEvent) for part in _walk(event)):
            raise ValueError(
                f"{kind} releases: RandomizedResponseDpEvent is accounted for replacing one label; "
                f"only a label ledger (privacy unit {LABEL_UNIT!r}, accounting {LABEL_ACCOUNTING!r}) may charge it"
            )


def samples_training_steps(events: Mapping[str, dpa.DpEvent]) -> bool:
    """Whether the run's training steps are sampled releases, the only ones [VESPER, Thm. 2.1] speaks to.

    A run whose training releases are no-op (a one-shot extractor such as GAP: its hops are
    computed once over the whole graph) samples nothing, so [VESPER, bound (6)] has nothing to add
    to the exact composition of its Gaussian events, and is not computed.
    """
    train = events.get("train", dpa.NoOpDpEvent())
    return not isinstance(train, dpa.NoOpDpEvent)


def bound6_epsilon(events: Mapping[str, dpa.DpEvent], counted: Mapping[str, int], delta: float) -> tuple[float, int | None]:
    """[VESPER, bound (6)] + [VESPER, Lemma 2] over the counted rows (docs/accounting.md).

    Sampled training steps enter bound (6); every unsampled Gaussian release (evaluation
    sweep, one-shot) adds its Gaussian RDP before the conversion.
    """
    train, steps = events.get("train", dpa.NoOpDpEvent()), counted.get("train", 0)
    unsampled = [(events[kind], counted.get(kind, 0)) for kind in ("eval", "predict", "one-shot") if kind in events]
    if (steps and isinstance(train, dpa.NonPrivateDpEvent)) or any(
        n and isinstance(event, dpa.NonPrivateDpEvent) for event, n in unsampled
    ):
        return math.inf, None
    precision = 0.0
    for event, n in unsampled:
        if n and isinstance(event, dpa.GaussianDpEvent):
            z = event.noise_multiplier
            precision += math.inf if z == 0 else n / (z * z)
    if math.isinf(precision):
        return math.inf, None
    if not steps or isinstance(train, dpa.NoOpDpEvent):
        if precision == 0:
            return 0.0, None
        z, gamma, steps = 1.0, 0.0, 0  # no sampled step: only the unsampled Gaussian RDP counts
    else:
        z, gamma = train.event.noise_multiplier, train.sampling_probability
    if z == 0:
        return math.inf, None
    epsilon, order = hidden_batch_bound6_epsilon(z, gamma, steps, delta, unsampled_gaussian_precision=precision)
    return float(epsilon), int(order)


def spent(
    accounting: str, accountant: str, delta: float, events: Mapping[str, dpa.DpEvent], counted: Mapping[str, int]
) -> Spent:
    """ε charged for ``counted`` releases of each kind (the rule of the module docstring)."""
    result = epsilon_of(composed_event(events, counted), delta, accountant=accountant)
    if accounting != "hidden-batch" or not samples_training_steps(events):
        return Spent(
            epsilon=result.epsilon, accountant=result.accountant,
            epsilon_events=result.epsilon, events_accountant=result.accountant,
        )
    bound6, order = bound6_epsilon(events, counted, delta)
    larger_is_bound6 = bound6 > result.epsilon
    return Spent(
        epsilon=max(bound6, result.epsilon),
        accountant="bound6" if larger_is_bound6 else result.accountant,
        epsilon_events=result.epsilon, events_accountant=result.accountant,
        epsilon_bound6=bound6, bound6_order=order,
    )


def parse_rules(record: RunRecord) -> dict[str, dpa.DpEvent]:
    return {rule.kind: event_from_json(rule.release_event) for rule in record.rules}


class ReplayResult(_Record):
    epsilon: float
    accountant: str
    epsilon_events: float
    epsilon_bound6: float | None
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
    try:
        events = parse_rules(run)
    except EventError as exc:
        events = {}
        problems.append(f"the run's rules do not parse: {exc}")
    bounds = {rule.kind: rule.participation_bound for rule in run.rules}
    per_pass: Counter[str] = Counter()
    pass_kind: dict[str, str] = {}
    counted: Counter[str] = Counter()
    keys: set[str] = set()
    previous = 0.0
    for expected_seq, row in enumerate(sorted(rows, key=lambda r: r.seq)):
        if row.seq != expected_seq:
            problems.append(f"seq {row.seq} where {expected_seq} was expected")
        if row.accounting != run.accounting:
            problems.append(f"seq {row.seq}: row says {row.accounting}, the run is {run.accounting}")
        if row.release_key in keys:
            problems.append(f"seq {row.seq}: release key {row.release_key!r} charged twice")
        keys.add(row.release_key)
        if row.kind not in events:
            problems.append(f"seq {row.seq}: no rule for {row.kind} releases")
            continue
        if event_from_json(row.release_event) != events[row.kind]:
            problems.append(f"seq {row.seq}: release event differs from the run's {row.kind} rule")
        if pass_kind.setdefault(row.pass_id, row.kind) != row.kind:
            problems.append(f"seq {row.seq}: pass {row.pass_id!r} mixes kinds")
        should_count = is_counted(per_pass[row.pass_id], bounds[row.kind])
        if row.counted != should_count:
            problems.append(f"seq {row.seq}: counted={row.counted} but the rule says {should_count}")
        if row.epsilon_after < previous:
            problems.append(f"seq {row.seq}: ε went down from {previous} to {row.epsilon_after}")
        previous = row.epsilon_after
        per_pass[row.pass_id] += 1
        counted[row.kind] += int(should_count)
    result = spent(run.accounting, run.accountant, run.delta, events, counted) if events else None
    recorded = max(rows, key=lambda r: r.seq).epsilon_after if rows else None
    if result is not None and recorded is not None and not _same(recorded, result.epsilon):
        problems.append(f"recorded ε {recorded} differs from the replayed ε {result.epsilon}")
    return ReplayResult(
        epsilon=result.epsilon if result else math.nan,
        accountant=result.accountant if result else "",
        epsilon_events=result.epsilon_events if result else math.nan,
        epsilon_bound6=result.epsilon_bound6 if result else None,
        counted=sum(counted.values()),
        charges=len(rows),
        recorded_epsilon=recorded,
        problems=problems,
    )


def _same(a: float, b: float) -> bool:
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


class CurvePoint(_Record):
    seq: int = Field(description="ledger position of the charge")
    epsilon: float = Field(description="ε after that charge")


class RunStatusView(Report):
    """A run's budget as the accountant reports it (REST ``GET /v1/runs/{id}``)."""

    run_id: str
    status: RunState
    privacy_unit: str
    accounting: AccountingMode
    assumption: str
    accountant: str = Field(description="what produced epsilon_spent")
    accountant_requested: AccountantName
    epsilon_budget: float
    epsilon_spent: float
    epsilon_events: float = Field(description="dp-accounting's ε of the recorded DpEvents")
    epsilon_bound6: float | None = Field(description="hidden-batch only: the paper's bound (6) with Lemma 2")
    delta: float
    charges: int
    counted_charges: int
    rules: list[ChargeRule]
    extractor: str
    details: dict
    created_at: str
    closed_at: str | None
    closed_reason: str
    epsilon_curve: list[CurvePoint] = Field(
        description="ε after each charge that changed it (counted charges), in ledger order"
    )
    prediction_passes: int = Field(0, description="prediction passes charged so far (kind predict, docs/privacy.md 2.4)")


class LedgerView(Report):
    """Everything needed to recompute a run's ε (REST ``GET /v1/runs/{id}/ledger``)."""

    run: RunRecord
    rows: list[LedgerRow]
