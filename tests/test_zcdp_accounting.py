"""zCDP events in vesper's accounting: exponential-mechanism rounds (docs/extractors/dpar.md, section 4).

An ε0-bounded-range mechanism (one round of the exponential mechanism) is ε0²/8-zCDP
(Cesar & Rogers 2021). vesper records it as dp-accounting's ``ZCDpEvent(ρ)``; the PLD
accountant has no privacy loss distribution for it, so under ``pld`` any composition that
contains one is accounted by the RDP accountant and the result says so (``rdp-zcdp``).
Gaussian, Laplace and sampled events are accounted exactly as before.
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import pytest
from pydantic import ValidationError

from vesper.common.privacy.accounting import calibrate, epsilon_of, gaussian_epsilon
from vesper.common.privacy.events import EventError, event_from_json, event_to_json
from vesper.common.privacy.ledger import (
    LedgerRow,
    PlannedPass,
    PlanRule,
    RunRecord,
    composed_event,
    counted_per_kind,
    replay,
    spent,
)
from vesper.common.privacy.plan_messages import plan_rule_to_proto, plan_rules_from_proto


def test_zcdp_events_round_trip_as_json() -> None:
    event = dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.5), dpa.SelfComposedDpEvent(dpa.ZCDpEvent(0.125), 4)])
    text = event_to_json(event)
    assert '"type":"ZCDpEvent"' in text
    assert event_from_json(text) == event
    assert event_to_json(event_from_json(text)) == text


@pytest.mark.parametrize(
    "text, fragment",
    [
        ('{"type": "ZCDpEvent", "rho": -1, "xi": 0}', "outside"),
        ('{"type": "ZCDpEvent", "rho": NaN, "xi": 0}', "outside"),
        ('{"type": "ZCDpEvent", "rho": 1}', "needs exactly the fields"),
        ('{"type": "ZCDpEvent", "rho": 1, "xi": "0"}', "must be a number"),
    ],
)
def test_malformed_zcdp_events_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(EventError, match=fragment):
        event_from_json(text)


@pytest.mark.parametrize("rho", [0.01, 0.3, 2.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6])
def test_zcdp_epsilon_lies_between_the_gaussian_and_the_classical_conversion(rho: float, delta: float) -> None:
    """A Gaussian with σ = 1/√(2ρ) is exactly ρ-zCDP, and ρ-zCDP gives ρ + 2√(ρ log(1/δ)) (Bun & Steinke)."""
    result = epsilon_of(dpa.ZCDpEvent(rho), delta)
    assert result.accountant == "rdp-zcdp" and result.order is not None
    assert result.epsilon == epsilon_of(dpa.ZCDpEvent(rho), delta, accountant="rdp").epsilon
    assert gaussian_epsilon(1 / math.sqrt(2 * rho), delta) <= result.epsilon
    assert result.epsilon <= rho + 2 * math.sqrt(rho * math.log(1 / delta))


def test_a_composition_with_a_zcdp_part_falls_back_to_rdp_as_a_whole() -> None:
    z, rho, rounds, delta = 2.0, 0.05, 4, 1e-5
    mixed = dpa.ComposedDpEvent([dpa.GaussianDpEvent(z), dpa.SelfComposedDpEvent(dpa.ZCDpEvent(rho), rounds)])
    result = epsilon_of(mixed, delta)
    assert result.accountant == "rdp-zcdp"
    # the Gaussian's RDP is α/(2z²): the whole is one zCDP event with the summed ρ
    total = epsilon_of(dpa.ZCDpEvent(1 / (2 * z * z) + rounds * rho), delta)
    assert result.epsilon == pytest.approx(total.epsilon, rel=1e-12)
    assert result.epsilon > epsilon_of(dpa.GaussianDpEvent(z), delta).epsilon


def test_other_events_keep_their_accountants() -> None:
    assert epsilon_of(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 5), 1e-6).accountant == "gaussian-exact"
    assert epsilon_of(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)), 1e-5).accountant in ("pld", "pld-coarse")


def test_the_exponential_plan_rule() -> None:
    rule = PlanRule(kind="one-shot", participation_bound=None, mechanism="exponential", noise_scale=0.5)
    event = rule.event(4.0)  # ε0 = 1/(0.5·4) = 0.5 per round: ρ = ε0²/8
    assert isinstance(event, dpa.ZCDpEvent) and event.rho == pytest.approx(0.25 / 8) and event.xi == 0
    with pytest.raises(ValidationError, match="cannot be Poisson-sampled"):
        PlanRule(kind="one-shot", participation_bound=None, mechanism="exponential", sampling_probability=0.5)
    # the other mechanisms are unchanged
    assert PlanRule(kind="train", participation_bound=2).event(3.0) == dpa.GaussianDpEvent(3.0)
    assert PlanRule(kind="train", participation_bound=None, mechanism="no-op").event(3.0) == dpa.NoOpDpEvent()
    assert plan_rules_from_proto([plan_rule_to_proto(rule)]) == [rule]


@pytest.mark.parametrize("accountant, name", [("pld", "rdp-zcdp"), ("rdp", "rdp")])
def test_calibration_of_exponential_rounds_meets_the_target(accountant: str, name: str) -> None:
    rule = PlanRule(kind="one-shot", participation_bound=None, mechanism="exponential")
    z, result = calibrate(lambda z: dpa.SelfComposedDpEvent(rule.event(z), 8), 4.0, 1e-5, accountant=accountant)  # type: ignore[arg-type]
    assert result.accountant == name
    assert 4.0 * (1 - 1e-6) <= result.epsilon <= 4.0
    assert epsilon_of(dpa.SelfComposedDpEvent(rule.event(z), 8), 1e-5, accountant).epsilon == result.epsilon  # type: ignore[arg-type]


def test_the_ledger_charges_and_replays_exponential_rounds() -> None:
    rules = [
        PlanRule(kind="one-shot", participation_bound=None, mechanism="exponential"),
        PlanRule(kind="train", participation_bound=None, mechanism="no-op"),
        PlanRule(kind="eval", participation_bound=None, mechanism="no-op"),
    ]
    z, delta, rounds = 1.5, 1e-4, 3
    events = {r.kind: r.event(z) for r in rules}
    passes = [PlannedPass(kind="one-shot", releases=rounds), PlannedPass(kind="train", releases=7), PlannedPass(kind="eval", releases=2)]
    counted = counted_per_kind(passes, {r.kind: r.participation_bound for r in rules})
    charged = spent("visible-batch", "pld", delta, events, counted)
    assert charged.accountant == "rdp-zcdp"
    assert composed_event(events, counted) == dpa.SelfComposedDpEvent(dpa.ZCDpEvent(1 / (8 * z * z)), rounds)
    assert charged.epsilon == epsilon_of(dpa.ZCDpEvent(rounds / (8 * z * z)), delta).epsilon
    run = RunRecord(
        run_id="r", created_at="t", privacy_unit="edge", accounting="visible-batch", assumption="a", accountant="pld",
        epsilon_budget=10.0, delta=delta, extractor="dpar-edge",
        rules=[
            {"kind": r.kind, "release_event": event_to_json(r.event(z)), "participation_bound": r.participation_bound}
            for r in rules
        ],
    )
    rows, seq, kinds = [], 0, ["one-shot"] * rounds + ["train"] * 7
    for index, kind in enumerate(kinds):
        partial = spent("visible-batch", "pld", delta, events, {"one-shot": min(index + 1, rounds)})
        rows.append(LedgerRow(
            run_id="r", seq=seq, accounting="visible-batch", release_key=f"{kind}/{index}", nodes_digest="x",
            pass_id=f"{kind}-0", kind=kind, num_nodes=1, release_event=event_to_json(events[kind]), counted=True,
            epsilon_after=partial.epsilon, accountant=partial.accountant, created_at="t",
        ))
        seq += 1
    replayed = replay(run, rows)
    assert replayed.consistent, replayed.problems
    assert replayed.epsilon == charged.epsilon and replayed.accountant == "rdp-zcdp"
