"""Privacy math: ε of events, calibration, the participation rule and ledger replay."""

import math

import dp_accounting as dpa
import pytest
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

from vesper.common.privacy.accounting import (
    _gaussian_log_delta,
    calibrate,
    epsilon_of,
    gaussian_epsilon,
)
from vesper.common.privacy.events import EventError, event_from_json, event_to_json
from vesper.common.privacy.ledger import (
    LedgerRow,
    RunRecord,
    composed_event,
    counted_releases,
    is_counted,
    replay,
)

# shared/design/privacy.md, "Why it matters": δ = 1e-6; visible-batch = N_e × epochs = 10
# Gaussian events; one release of the graph = 1 Gaussian event.
PRIVACY_MD_TABLE = {1: ("13.4", "4.22"), 4: ("3.77", "1.19"), 8: ("2.06", "0.65"), 16: ("1.17", "0.37")}


def _as_printed(value: float, printed: str) -> str:
    """``value`` with as many decimals as the table printed."""
    return f"{value:.{len(printed.split('.')[1])}f}"


@pytest.mark.parametrize("target", sorted(PRIVACY_MD_TABLE))
def test_reproduces_the_privacy_contract_table(target: float) -> None:
    visible, once = PRIVACY_MD_TABLE[target]
    z10, result = calibrate(lambda z: dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 10), target, 1e-6)
    z1, _ = calibrate(lambda z: dpa.GaussianDpEvent(z), target, 1e-6)
    assert _as_printed(z10, visible) == visible
    assert _as_printed(z1, once) == once
    assert result.epsilon <= target


@pytest.mark.parametrize("z, count", [(0.8, 1), (2.0, 7), (3.77, 10), (5.0, 40)])
def test_exact_gaussian_agrees_with_dp_accounting_pld(z: float, count: int) -> None:
    event = dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), count)
    exact = epsilon_of(event, 1e-5)
    pld = pld_privacy_accountant.PLDAccountant()
    pld.compose(event)
    assert exact.accountant == "gaussian-exact"
    # the PLD is a pessimistic discretisation of the same curve: never below, and close
    assert exact.epsilon <= pld.get_epsilon(1e-5) <= exact.epsilon * 1.01 + 1e-3


def test_mixed_gaussians_compose_like_one_gaussian() -> None:
    event = dpa.ComposedDpEvent([dpa.GaussianDpEvent(2.0), dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(4.0), 4), dpa.NoOpDpEvent()])
    # precision 1/4 + 4/16 = 1/2, so one Gaussian with sigma sqrt(2)
    assert epsilon_of(event, 1e-6).epsilon == pytest.approx(gaussian_epsilon(math.sqrt(2), 1e-6), rel=1e-12)


def test_other_events_use_the_pld_accountant() -> None:
    result = epsilon_of(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)), 1e-5)
    assert result.accountant == "pld" and 0 < result.epsilon < 1


def test_no_op_and_non_private_events() -> None:
    assert epsilon_of(dpa.NoOpDpEvent(), 1e-5).epsilon == 0
    assert epsilon_of(dpa.SelfComposedDpEvent(dpa.NoOpDpEvent(), 100), 1e-5).epsilon == 0
    assert math.isinf(epsilon_of(dpa.NonPrivateDpEvent(), 1e-5).epsilon)
    assert math.isinf(epsilon_of(dpa.GaussianDpEvent(0.0), 1e-5).epsilon)


@given(sigma=st.floats(0.3, 50.0), log_delta=st.floats(-14, -2))
@settings(max_examples=80, deadline=None)
def test_gaussian_epsilon_is_never_below_the_truth(sigma: float, log_delta: float) -> None:
    delta = 10.0**log_delta
    epsilon = gaussian_epsilon(sigma, delta)
    # δ(ε) of the returned ε is within the target: the guarantee really holds
    assert epsilon == 0 or _gaussian_log_delta(sigma, epsilon) <= math.log(delta)


@given(target=st.floats(0.1, 64.0), count=st.integers(1, 5000), log_delta=st.floats(-10, -3))
@settings(max_examples=40, deadline=None)
def test_calibration_meets_the_target_tightly(target: float, count: int, log_delta: float) -> None:
    delta = 10.0**log_delta
    make = lambda z: composed_event(dpa.GaussianDpEvent(z), count)
    z, result = calibrate(make, target, delta)
    assert result.epsilon <= target
    assert epsilon_of(make(z * (1 - 1e-6)), delta).epsilon > result.epsilon  # smaller noise costs more
    assert result.epsilon > target * (1 - 1e-4)  # and the bracket closed near the target


def test_calibration_refuses_impossible_targets() -> None:
    with pytest.raises(ValueError, match="no noise multiplier"):
        calibrate(lambda z: dpa.GaussianDpEvent(z), 1e-9, 1e-12, z_max=100)
    with pytest.raises(ValueError):
        calibrate(lambda z: dpa.GaussianDpEvent(z), math.inf, 1e-5)


def test_event_json_round_trip_is_canonical() -> None:
    event = dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.5), 3),
        dpa.PoissonSampledDpEvent(0.25, dpa.LaplaceDpEvent(2.0)),
        dpa.NoOpDpEvent(),
        dpa.NonPrivateDpEvent(),
    ])
    text = event_to_json(event)
    assert event_from_json(text) == event
    assert event_to_json(event_from_json(text)) == text


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("not json", "not valid JSON"),
        ("[]", "must be an object"),
        ('{"type": "ZCDpEvent", "xi": 0, "rho": 1}', "unknown or unsupported"),
        ('{"type": "GaussianDpEvent"}', "needs exactly the fields"),
        ('{"type": "GaussianDpEvent", "noise_multiplier": -1}', "outside"),
        ('{"type": "GaussianDpEvent", "noise_multiplier": "1"}', "must be a number"),
        ('{"type": "GaussianDpEvent", "noise_multiplier": NaN}', "outside"),
        ('{"type": "SelfComposedDpEvent", "count": -2, "event": {"type": "NoOpDpEvent"}}', "non-negative integer"),
        ('{"type": "PoissonSampledDpEvent", "sampling_probability": 2, "event": {"type": "NoOpDpEvent"}}', "outside"),
    ],
)
def test_malformed_events_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(EventError, match=fragment):
        event_from_json(text)


def test_participation_rule() -> None:
    assert [is_counted(i, 2) for i in range(4)] == [True, True, False, False]
    assert all(is_counted(i, None) for i in range(10))
    assert not is_counted(0, 0)
    assert counted_releases([6, 6, 1], 2) == 5
    assert counted_releases([6, 6, 1], None) == 13
    assert counted_releases([6, 6, 1], 0) == 0


def _ledger(bound: int | None, passes: list[tuple[str, int]], z: float = 2.0) -> tuple[RunRecord, list[LedgerRow]]:
    event = event_to_json(dpa.GaussianDpEvent(z))
    run = RunRecord(
        run_id="r", created_at="t", privacy_unit="edge", accounting="visible-batch", assumption="",
        epsilon_budget=100.0, delta=1e-5, release_event=event, participation_bound=bound, extractor="pmp-gin",
    )
    rows, counted, seq = [], 0, 0
    for pass_id, size in passes:
        for i in range(size):
            c = is_counted(i, bound)
            counted += c
            eps = epsilon_of(composed_event(dpa.GaussianDpEvent(z), counted), 1e-5).epsilon
            rows.append(LedgerRow(
                run_id="r", seq=seq, pass_id=pass_id, kind="train", num_nodes=10, release_event=event,
                counted=c, epsilon_after=eps, accountant="gaussian-exact", created_at="t",
            ))
            seq += 1
    return run, rows


def test_replay_recomputes_epsilon_from_the_rows_alone() -> None:
    run, rows = _ledger(2, [("train-0", 5), ("train-1", 5), ("eval-0", 1)])
    result = replay(run, rows)
    assert result.consistent, result.problems
    assert result.counted == 5 and result.charges == 11
    expected = epsilon_of(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 5), 1e-5).epsilon
    assert result.epsilon == expected == rows[-1].epsilon_after


def test_replay_detects_tampering() -> None:
    run, rows = _ledger(2, [("train-0", 4)])
    dropped = replay(run, rows[:1] + rows[2:])
    assert any("seq 2 where 1 was expected" in p for p in dropped.problems)
    uncounted = [r.model_copy(update={"counted": False}) if r.seq == 1 else r for r in rows]
    assert any("counted=False but the rule says True" in p for p in replay(run, uncounted).problems)
    lowered = rows[:-1] + [rows[-1].model_copy(update={"epsilon_after": rows[-1].epsilon_after / 2})]
    assert any("differs from the replayed" in p for p in replay(run, lowered).problems)
    other = event_to_json(dpa.GaussianDpEvent(9.0))
    swapped = [r.model_copy(update={"release_event": other}) if r.seq == 0 else r for r in rows]
    assert any("release event differs" in p for p in replay(run, swapped).problems)
