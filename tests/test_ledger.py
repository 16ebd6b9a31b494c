"""The ledger rule: counted releases per pass and kind, and replay from the rows alone."""

import math

import dp_accounting as dpa
import pytest

from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.hidden_batch_reproduction import theorem21_gamma
from vesper.common.privacy.ledger import (
    ChargeRule,
    LedgerRow,
    PlannedPass,
    RunRecord,
    composed_event,
    counted_per_kind,
    is_counted,
    replay,
    spent,
)


def test_participation_rule() -> None:
    assert [is_counted(i, 2) for i in range(4)] == [True, True, False, False]
    assert all(is_counted(i, None) for i in range(10))
    assert not is_counted(0, 0)
    passes = [PlannedPass(kind="train", releases=6)] * 2 + [PlannedPass(kind="eval", releases=1)]
    assert counted_per_kind(passes, {"train": 2, "eval": 2}) == {"train": 4, "eval": 1}
    assert counted_per_kind(passes, {"train": None, "eval": None}) == {"train": 12, "eval": 1}
    assert counted_per_kind(passes, {"train": 0, "eval": 0}) == {"train": 0, "eval": 0}
    with pytest.raises(ValueError, match="no rule for eval"):
        counted_per_kind(passes, {"train": 2})


def test_composed_event_skips_no_ops_and_empty_kinds() -> None:
    g = dpa.GaussianDpEvent(2.0)
    assert composed_event({"train": g}, {"train": 0}) == dpa.NoOpDpEvent()
    assert composed_event({"train": g}, {"train": 1}) == g
    assert composed_event({"train": dpa.NoOpDpEvent()}, {"train": 5}) == dpa.NoOpDpEvent()
    both = composed_event({"train": g, "eval": dpa.GaussianDpEvent(3.0)}, {"train": 4, "eval": 2})
    assert both == dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(3.0), 2), dpa.SelfComposedDpEvent(g, 4)])


def _ledger(bound: int | None, passes: list[tuple[str, int]], z: float = 2.0) -> tuple[RunRecord, list[LedgerRow]]:
    event = event_to_json(dpa.GaussianDpEvent(z))
    rules = [ChargeRule(kind=k, release_event=event, participation_bound=bound) for k in ("train", "eval")]
    run = RunRecord(
        run_id="r", created_at="t", privacy_unit="edge", accounting="visible-batch", assumption="",
        accountant="pld", epsilon_budget=100.0, delta=1e-5, rules=rules, extractor="pmp-gin",
    )
    rows, counted, seq = [], 0, 0
    for pass_id, size in passes:
        kind = pass_id.split("-")[0]
        for i in range(size):
            c = is_counted(i, bound)
            counted += c
            eps = epsilon_of(composed_event({"train": dpa.GaussianDpEvent(z)}, {"train": counted}), 1e-5).epsilon
            rows.append(LedgerRow(
                run_id="r", seq=seq, accounting="visible-batch", release_key=f"{pass_id}/{i}", nodes_digest="d", pass_id=pass_id, kind=kind,
                num_nodes=10, release_event=event, counted=c, epsilon_after=eps, accountant="gaussian-exact",
                created_at="t",
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
    assert any("ε went down" in p for p in replay(run, lowered).problems)
    other = event_to_json(dpa.GaussianDpEvent(9.0))
    swapped = [r.model_copy(update={"release_event": other}) if r.seq == 0 else r for r in rows]
    assert any("release event differs" in p for p in replay(run, swapped).problems)
    twice = [r.model_copy(update={"release_key": "train-0/0"}) if r.seq == 1 else r for r in rows]
    assert any("charged twice" in p for p in replay(run, twice).problems)
    relabelled = [r.model_copy(update={"accounting": "hidden-batch"}) if r.seq == 2 else r for r in rows]
    assert any("row says hidden-batch" in p for p in replay(run, relabelled).problems)
    mixed = [r.model_copy(update={"kind": "eval"}) if r.seq == 3 else r for r in rows]
    assert any("mixes kinds" in p for p in replay(run, mixed).problems)


def test_hidden_batch_is_charged_the_larger_of_its_two_numbers() -> None:
    gamma = theorem21_gamma(150_000, 256, 10, 1)  # the contract's setting, γ ≈ 0.0034
    sampled = dpa.PoissonSampledDpEvent(gamma, dpa.GaussianDpEvent(0.69))
    events = {"train": sampled, "eval": dpa.NoOpDpEvent()}
    hidden = spent("hidden-batch", "rdp", 1e-6, events, {"train": 2930})
    # the shared contract: bound (6) with Lemma 2 gives 4.39, dp-accounting's RDP 4.01 (two decimals,
    # with γ printed as 0.0034; test_accounting_math pins the digits, here ±0.01 is enough)
    assert hidden.epsilon_bound6 == pytest.approx(4.39, abs=0.01)
    assert hidden.epsilon_events == pytest.approx(4.01, abs=0.01)
    assert hidden.epsilon == hidden.epsilon_bound6 and hidden.accountant == "bound6"
    visible = spent("visible-batch", "rdp", 1e-6, events, {"train": 2930})
    assert visible.epsilon_bound6 is None and visible.epsilon == hidden.epsilon_events


def test_hidden_batch_adds_the_unsampled_evaluation_sweep() -> None:
    sampled = dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0))
    events = {"train": sampled, "eval": dpa.GaussianDpEvent(5.0)}
    without = spent("hidden-batch", "rdp", 1e-5, events, {"train": 100})
    with_eval = spent("hidden-batch", "rdp", 1e-5, events, {"train": 100, "eval": 2})
    assert with_eval.epsilon_bound6 > without.epsilon_bound6
    assert with_eval.epsilon_events > without.epsilon_events
    only_eval = spent("hidden-batch", "rdp", 1e-5, events, {"eval": 2})
    assert 0 < only_eval.epsilon_bound6 < math.inf
