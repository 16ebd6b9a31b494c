"""Party B's label ledgers at the accountant: randomised-response events, the ``labels``
accounting mode, and B's own credential (docs/accounting.md, section 6)."""

from __future__ import annotations

import itertools
import math

import dp_accounting as dpa
import mpmath
import numpy as np
import pytest
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from vesper.accountant.budget import Accountant, AccountantError
from vesper.accountant.ledger_store import LedgerStore
from vesper.accountant.rest import create_app
from vesper.accountant.service import AccountantService
from vesper.common.accountant_client import AccountantClient, PeerError
from vesper.common.charge_token import TokenError, ensure_distinct_tokens
from vesper.common.grpc_server import start_server
from vesper.common.privacy.accounting import (
    RDP_ORDERS,
    _rdp,
    calibrate,
    epsilon_of,
    gaussian_epsilon,
    randomized_response_epsilon,
)
from vesper.common.privacy.events import EventError, event_from_json, event_to_json
from vesper.common.privacy.ledger import (
    ChargeRule,
    PlannedPass,
    PlanRule,
    label_ledger_id,
    main_run_id,
    replay,
)
from vesper.proto.v1 import accountant_pb2, accountant_pb2_grpc

DELTA = 1e-5


def rr(epsilon: float, k: int) -> dpa.RandomizedResponseDpEvent:
    """k-RR at ε, with p nudged up until the accountant's pure ε is at most ε (what B must do)."""
    p = k / (math.exp(epsilon) + k - 1)
    while randomized_response_epsilon(p, k) > epsilon:
        p = math.nextafter(p, 1.0)
    return dpa.RandomizedResponseDpEvent(noise_parameter=p, num_buckets=k)


def rr_loss(event: dpa.RandomizedResponseDpEvent) -> float:
    """ln((1 − p + p/k)/(p/k)) at 50 digits: the reference for (RR1)."""
    with mpmath.workdps(50):
        p, k = mpmath.mpf(event.noise_parameter), event.num_buckets
        return mpmath.log((1 - p + p / k) / (p / k))


# -- the event in JSON -----------------------------------------------------------------------


@given(p=st.floats(0.0, 1.0), k=st.integers(2, 10**6))
@settings(max_examples=60, deadline=None)
def test_randomized_response_round_trips_canonically(p: float, k: int) -> None:
    event = dpa.RandomizedResponseDpEvent(noise_parameter=p, num_buckets=k)
    text = event_to_json(event)
    assert event_from_json(text) == event
    assert event_to_json(event_from_json(text)) == text
    # numpy scalars (what a torch/numpy caller has at hand) give the same canonical string
    assert event_to_json(dpa.RandomizedResponseDpEvent(np.float64(p), np.int64(k))) == text
    nested = dpa.ComposedDpEvent([dpa.SelfComposedDpEvent(event, 3), dpa.GaussianDpEvent(2.0)])
    assert event_from_json(event_to_json(nested)) == nested


def test_integer_noise_parameters_are_written_as_floats() -> None:
    assert event_to_json(dpa.RandomizedResponseDpEvent(1, 2)) == event_to_json(dpa.RandomizedResponseDpEvent(1.0, 2))
    assert '"noise_parameter":0.0' in event_to_json(dpa.RandomizedResponseDpEvent(0, 5))


def _rr_json(p: object = 0.5, k: object = 2, **extra: object) -> str:
    fields = {"noise_parameter": p, "num_buckets": k, **extra}
    body = ", ".join(f'"{key}": {value}' for key, value in fields.items() if value is not None)
    return '{"type": "RandomizedResponseDpEvent"' + (", " + body if body else "") + "}"


@pytest.mark.parametrize(
    "text, fragment",
    [
        (_rr_json(p=-0.1), r"noise_parameter=-0.1 is outside \[0.0, 1.0\]"),
        (_rr_json(p=1.5), r"noise_parameter=1.5 is outside"),
        (_rr_json(p="NaN"), "outside"),
        (_rr_json(p="Infinity"), "outside"),
        (_rr_json(p='"0.5"'), "noise_parameter must be a number"),
        (_rr_json(p="true"), "noise_parameter must be a number"),
        (_rr_json(k=1), r"num_buckets=1 is outside \[2, 1000000\]"),
        (_rr_json(k=0), "num_buckets=0 is outside"),
        (_rr_json(k=10**6 + 1), "num_buckets=1000001 is outside"),
        (_rr_json(k=2.0), "num_buckets must be an integer, got 2.0"),
        (_rr_json(k=2.5), "num_buckets must be an integer"),
        (_rr_json(k="true"), "num_buckets must be an integer, got True"),
        (_rr_json(k='"2"'), "num_buckets must be an integer"),
        (_rr_json(k=None), "needs exactly the fields"),
        (_rr_json(extra=1), "needs exactly the fields"),
    ],
)
def test_malformed_randomized_response_is_refused(text: str, fragment: str) -> None:
    with pytest.raises(EventError, match=fragment):
        event_from_json(text)


# -- ε of randomised response ----------------------------------------------------------------


@given(p=st.floats(1e-300, 1.0, exclude_max=True), k=st.integers(2, 10**6))
@settings(max_examples=200, deadline=None)
def test_the_exact_epsilon_is_the_smallest_float_not_below_the_truth(p: float, k: int) -> None:
    event = dpa.RandomizedResponseDpEvent(p, k)
    epsilon, truth = randomized_response_epsilon(p, k), rr_loss(event)
    assert epsilon >= truth  # never rounded down
    assert math.nextafter(epsilon, -math.inf) < truth  # and not one float more than needed


def _worst_likelihood_ratio_exceeds(claimed: float, event: dpa.RandomizedResponseDpEvent) -> bool:
    """Whether some output o and inputs x ≠ x' have Pr[o | x] > e^claimed · Pr[o | x'] (50 digits).

    The k × k transition matrix of k-RR: 1 − p + p/k on the diagonal, p/k elsewhere.
    """
    with mpmath.workdps(50):
        p, k = mpmath.mpf(event.noise_parameter), event.num_buckets
        matrix = [[(1 - p + p / k) if o == x else p / k for o in range(k)] for x in range(k)]
        bound = mpmath.exp(mpmath.mpf(claimed))
        return any(
            matrix[x][o] > bound * matrix[y][o] for x in range(k) for y in range(k) if x != y for o in range(k)
        )


@pytest.mark.parametrize("epsilon, k", [(0.1, 2), (1.0, 3), (3.0, 10), (9.0, 4)])
def test_the_exact_epsilon_bounds_every_likelihood_ratio_and_a_smaller_claim_is_caught(epsilon: float, k: int) -> None:
    event = rr(epsilon, k)
    charged = epsilon_of(event, DELTA).epsilon
    assert not _worst_likelihood_ratio_exceeds(charged, event)
    # the check can fail: forgetting that the true class is also drawn with p/k gives
    # ln(k(1 − p)/p), too small, and one float below the charged ε is too small as well
    p = event.noise_parameter
    assert _worst_likelihood_ratio_exceeds(math.log(k * (1 - p) / p), event)
    assert _worst_likelihood_ratio_exceeds(math.nextafter(charged, 0.0), event)


def test_the_exact_epsilon_at_the_ends_and_outside() -> None:
    assert math.isinf(randomized_response_epsilon(0.0, 2))
    assert randomized_response_epsilon(1.0, 7) == 0.0
    for p, k in ((-0.1, 2), (1.1, 2), (0.5, 1)):
        with pytest.raises(ValueError, match="randomised response needs"):
            randomized_response_epsilon(p, k)
    # naive p = k/(e^ε + k − 1) can land a hair above ε; the accountant says so, and the nudge fixes it
    naive = 7 / (math.exp(2.0) + 6)
    assert randomized_response_epsilon(naive, 7) > 2.0 >= randomized_response_epsilon(rr(2.0, 7).noise_parameter, 7)


@pytest.mark.parametrize(
    "wrap",
    [
        lambda e: e,
        lambda e: dpa.SelfComposedDpEvent(e, 1),
        lambda e: dpa.ComposedDpEvent([e]),
        lambda e: dpa.ComposedDpEvent([
            dpa.NoOpDpEvent(), dpa.SelfComposedDpEvent(e, 1), dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(1.0), 0),
        ]),
    ],
)
@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_a_lone_randomized_response_is_charged_its_exact_pure_epsilon(wrap, accountant: str) -> None:
    event = rr(1.5, 4)
    result = epsilon_of(wrap(event), DELTA, accountant)  # type: ignore[arg-type]
    assert (result.epsilon, result.accountant) == (randomized_response_epsilon(event.noise_parameter, 4), "rr-exact")
    assert result.epsilon <= 1.5
    # under rdp it is the smaller of two upper bounds: the RDP conversion is above the pure ε here
    assert _rdp(wrap(event), DELTA, RDP_ORDERS)[0] > result.epsilon


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_randomized_response_ends(accountant: str) -> None:
    assert epsilon_of(dpa.RandomizedResponseDpEvent(1.0, 3), DELTA, accountant).epsilon == 0.0  # type: ignore[arg-type]
    assert math.isinf(epsilon_of(dpa.RandomizedResponseDpEvent(0.0, 3), DELTA, accountant).epsilon)  # type: ignore[arg-type]
    twice_uniform = dpa.SelfComposedDpEvent(dpa.RandomizedResponseDpEvent(1.0, 3), 2)
    assert epsilon_of(twice_uniform, DELTA, accountant).epsilon == 0.0  # type: ignore[arg-type]
    with_nothing = dpa.ComposedDpEvent([dpa.RandomizedResponseDpEvent(0.0, 3), dpa.GaussianDpEvent(5.0)])
    assert math.isinf(epsilon_of(with_nothing, DELTA, accountant).epsilon)  # type: ignore[arg-type]


def _true_delta(epsilon: float, mechanisms: list[dpa.RandomizedResponseDpEvent]) -> float:
    """δ(ε) of composed k-RRs under replace-one, by enumerating the outputs (x, x', other) of each."""
    outcomes = []
    for m in mechanisms:
        p, k = m.noise_parameter, m.num_buckets
        a, b, c = 1 - p + p / k, p / k, (k - 2) * p / k
        outcomes.append([(a, b), (b, a)] + ([(c, c)] if k > 2 else []))
    return sum(
        max(0.0, math.prod(x for x, _ in combo) - math.exp(epsilon) * math.prod(y for _, y in combo))
        for combo in itertools.product(*outcomes)
    )


def _true_epsilon(delta: float, mechanisms: list[dpa.RandomizedResponseDpEvent]) -> float:
    high = sum(randomized_response_epsilon(m.noise_parameter, m.num_buckets) for m in mechanisms)
    if _true_delta(0.0, mechanisms) <= delta:
        return 0.0
    return brentq(lambda e: _true_delta(e, mechanisms) - delta, 0.0, high, xtol=1e-14)


@pytest.mark.parametrize("epsilon, k", [(0.3, 2), (1.0, 2), (2.0, 7), (4.4, 10), (8.0, 3)])
@pytest.mark.parametrize("delta", [1e-6, 1e-2])
def test_the_exact_epsilon_against_dp_accountings_pld(epsilon: float, k: int, delta: float) -> None:
    event = rr(epsilon, k)
    pure = epsilon_of(event, delta).epsilon
    truth = _true_epsilon(delta, [event])
    pld = pld_lib.from_randomized_response(event.noise_parameter, k, value_discretization_interval=1e-4)
    at_delta = pld.get_epsilon_for_delta(delta)
    # the PLD is the pessimistic discretisation of the same mechanism: at or above the
    # truth at δ (up to dp-accounting's float rounding) and within one interval of it ...
    assert truth - 1e-12 <= at_delta <= truth + 1e-4
    # ... and the pure ε bounds every δ: PLD at δ > 0 is at most it, up to the interval
    assert truth <= pure and at_delta <= pure + 1e-4
    assert pure - truth <= delta / (1 - event.noise_parameter) * 1.01  # close: ε(δ) ≈ ε − δ/(1 − p)


@pytest.mark.parametrize("delta", [1e-6, 1e-3])
def test_two_randomized_responses_compose_through_the_pld(delta: float) -> None:
    first, second = rr(1.0, 2), rr(0.7, 5)
    both = dpa.ComposedDpEvent([first, second])
    result = epsilon_of(both, delta)
    assert result.accountant in ("pld", "pld-coarse")
    alone = [epsilon_of(e, delta).epsilon for e in (first, second)]
    truth = _true_epsilon(delta, [first, second])
    # never below the truth, at least each one alone, at most the sum of the pure ε's
    # (the pessimistic grid may add up to one interval per mechanism)
    assert truth - 1e-12 <= result.epsilon <= truth + 2 * result.discretization
    assert result.epsilon >= max(alone) and result.epsilon <= sum(alone) + 2 * result.discretization
    twice = epsilon_of(dpa.SelfComposedDpEvent(first, 2), delta)
    assert _true_epsilon(delta, [first, first]) - 1e-12 <= twice.epsilon <= 2 * alone[0] + 2 * twice.discretization
    # RDP is an upper bound too, and a looser one here
    assert epsilon_of(both, delta, "rdp").epsilon >= truth
    assert epsilon_of(both, delta, "rdp").epsilon >= result.epsilon - 2 * result.discretization


def test_rdp_of_randomized_response_is_dp_accountings_replace_one_curve() -> None:
    # PATE and RR never share a ledger today, but a mixed one must be right: the Gaussian's
    # curve is the same under both relations, so one REPLACE_ONE accountant gives the truth
    mixed = dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(rr(1.0, 3), 2), dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(4.0), 5), rr(0.5, 2),
    ])
    reference = rdp_privacy_accountant.RdpAccountant(list(RDP_ORDERS), NeighboringRelation.REPLACE_ONE)
    reference.compose(mixed)
    result = epsilon_of(mixed, DELTA, "rdp")
    assert result.accountant == "rdp"
    assert result.epsilon == pytest.approx(reference.get_epsilon(DELTA), rel=1e-12)
    # and the PLD of the same composition is below it, but not below the Gaussian part alone
    pld = epsilon_of(mixed, DELTA)
    assert pld.accountant in ("pld", "pld-coarse")
    assert gaussian_epsilon(4.0 / math.sqrt(5), DELTA) < pld.epsilon <= result.epsilon


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_sampled_randomized_response_is_refused(accountant: str) -> None:
    # Poisson amplification is an add-or-remove result; nothing here accounts it for RR
    with pytest.raises(ValueError, match="cannot account"):
        epsilon_of(dpa.PoissonSampledDpEvent(0.1, rr(1.0, 2)), DELTA, accountant)  # type: ignore[arg-type]


@pytest.mark.parametrize("accountant, rtol", [("pld", 1e-3), ("rdp", 1e-6)])
def test_calibration_with_a_randomized_response_part(accountant: str, rtol: float) -> None:
    fixed = rr(1.0, 2)
    make = lambda z: dpa.ComposedDpEvent([fixed, dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 10)])  # noqa: E731
    z, result = calibrate(make, 3.0, DELTA, accountant=accountant)  # type: ignore[arg-type]
    assert result == epsilon_of(make(z), DELTA, accountant)  # type: ignore[arg-type]
    assert 3.0 * (1 - rtol) <= result.epsilon <= 3.0
    # the Gaussian-only plans are untouched: still the exact Gaussian, z exact
    z_gauss, gauss = calibrate(lambda z: dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 10), 3.0, DELTA)
    assert gauss.accountant == "gaussian-exact" and gauss.epsilon <= 3.0 and z_gauss < z


# -- the labels accounting mode ---------------------------------------------------------------


@pytest.fixture
def accountant(tmp_path) -> Accountant:
    return Accountant(LedgerStore(tmp_path / "ledger.sqlite"))


def _one_shot(event: dpa.DpEvent, bound: int | None = None, kind: str = "one-shot") -> list[ChargeRule]:
    return [ChargeRule(kind=kind, release_event=event_to_json(event), participation_bound=bound)]


def _create_label_run(service: Accountant, event: dpa.DpEvent, budget: float, run_id: str = "r1.labels", **kw):
    base = run_id.removesuffix(".labels")
    if base != run_id and service.store.get_run(base) is None and not service.leases.announced(base):
        service.announce_run(base, "party-a-trainer", 60.0)  # B opens the label ledger of a run A announced
    return service.create_run(
        run_id, kw.pop("unit", "label"), kw.pop("accounting", "labels"), kw.pop("accountant", "pld"), budget, DELTA,
        kw.pop("rules", None) or _one_shot(event), "labels-rr", {},
    )


def _error(call) -> AccountantError:
    with pytest.raises(AccountantError) as info:
        call()
    return info.value


@pytest.mark.parametrize("accountant_name", ["pld", "rdp"])
def test_a_randomized_response_ledger_charges_exactly_its_epsilon_once(accountant: Accountant, accountant_name: str) -> None:
    event = rr(2.0, 7)
    view = _create_label_run(accountant, event, 2.0, accountant=accountant_name)
    assert (view.privacy_unit, view.accounting) == ("label", "labels")
    assert view.assumption.startswith("labels: party B's own ledger. Privacy unit: the label of one of party B's training")
    assert "never added to it" in view.assumption
    row, _ = accountant.charge("r1.labels", "rr/train", "labels-0", "one-shot", 140, "d", event_to_json(event))
    assert row.counted and row.accounting == "labels"
    assert row.epsilon_after == randomized_response_epsilon(event.noise_parameter, 7) <= 2.0
    assert row.accountant == "rr-exact"
    # a second draw of the labels would double the spend: refused, nothing written
    again = event_to_json(event)
    error = _error(lambda: accountant.charge("r1.labels", "rr/again", "labels-0", "one-shot", 140, "d", again))
    assert error.code == "RESOURCE_EXHAUSTED"
    assert len(accountant.store.charges("r1.labels")) == 1
    result = replay(accountant.store.get_run("r1.labels"), accountant.store.charges("r1.labels"))
    assert result.consistent and result.epsilon == row.epsilon_after


def test_a_teacher_ensemble_ledger_counts_every_query(accountant: Accountant) -> None:
    # DP-GPL's query: threshold step (sensitivity 1) and GNMax step (sensitivity √2)
    sigma1, sigma2 = 40.0, 30.0
    query = dpa.ComposedDpEvent([dpa.GaussianDpEvent(sigma1), dpa.GaussianDpEvent(sigma2 / math.sqrt(2))])
    _create_label_run(accountant, query, 8.0)
    receipts = [
        accountant.charge("r1.labels", f"pate/query/{q}", "labels-0", "one-shot", 1, str(q), event_to_json(query))[0]
        for q in range(25)
    ]
    assert all(r.counted for r in receipts)
    precision = 25 * (1 / sigma1**2 + 2 / sigma2**2)
    assert receipts[-1].epsilon_after == pytest.approx(gaussian_epsilon(precision**-0.5, DELTA), rel=1e-12)
    assert receipts[-1].accountant == "gaussian-exact"
    assert [p.seq for p in accountant.status("r1.labels").epsilon_curve] == list(range(25))


@pytest.mark.parametrize(
    "unit, accounting", [("label", "visible-batch"), ("label", "hidden-batch"), ("edge", "labels"), ("node", "labels")]
)
def test_the_label_unit_and_the_labels_mode_go_together(accountant: Accountant, unit: str, accounting: str) -> None:
    event = rr(1.0, 2) if accounting == "labels" else dpa.GaussianDpEvent(3.0)
    kind = "one-shot" if accounting == "labels" else "train"
    rules = _one_shot(event, kind=kind)
    error = _error(lambda: _create_label_run(accountant, event, 4.0, unit=unit, accounting=accounting, rules=rules))
    assert error.code == "INVALID_ARGUMENT"
    assert f"privacy unit {unit!r} with accounting {accounting!r}" in str(error)
    assert "'label'" in str(error) and "'labels'" in str(error)
    assert accountant.store.list_runs() == []


@pytest.mark.parametrize(
    "rules, fragment",
    [
        (_one_shot(dpa.GaussianDpEvent(2.0), kind="train"), "one-shot releases only"),
        (_one_shot(dpa.GaussianDpEvent(2.0)) + _one_shot(dpa.GaussianDpEvent(2.0), kind="eval"), "one-shot releases only"),
        (_one_shot(dpa.GaussianDpEvent(2.0), bound=1), "no participation bound"),
        (_one_shot(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(1.0))), "PoissonSampledDpEvent"),
        (
            _one_shot(dpa.ComposedDpEvent([rr(1.0, 2), MixtureOfGaussiansDpEvent(2.0, [0.0, 1.0], [0.5, 0.5])])),
            "MixtureOfGaussiansDpEvent",
        ),
        (_one_shot(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.5, rr(1.0, 2)), 2)), "replacing one label"),
    ],
)
def test_label_ledgers_refuse_what_their_relation_cannot_account(accountant: Accountant, rules, fragment: str) -> None:
    error = _error(lambda: _create_label_run(accountant, dpa.NoOpDpEvent(), 4.0, rules=rules))
    assert error.code == "INVALID_ARGUMENT" and fragment in str(error)
    assert accountant.store.list_runs() == []


def test_other_ledgers_refuse_randomized_response(accountant: Accountant) -> None:
    rules = [ChargeRule(kind="train", release_event=event_to_json(dpa.ComposedDpEvent([rr(1.0, 2)])), participation_bound=2)]
    error = _error(lambda: accountant.create_run("e", "edge", "visible-batch", "pld", 4.0, DELTA, rules, "pmp-gin", {}))
    assert error.code == "INVALID_ARGUMENT" and "only a label ledger" in str(error)
    # the hidden-batch checks are as before
    sampled = event_to_json(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)))
    hidden = [ChargeRule(kind="train", release_event=sampled, participation_bound=2)]
    error = _error(lambda: accountant.create_run("h", "edge", "hidden-batch", "pld", 4.0, DELTA, hidden, "pmp-gin", {}))
    assert "no participation bound for train" in str(error)


def test_estimate_and_calibrate_take_the_labels_mode(accountant: Accountant) -> None:
    query = dpa.ComposedDpEvent([dpa.GaussianDpEvent(20.0), dpa.GaussianDpEvent(20.0 / math.sqrt(2))])
    passes = [PlannedPass(kind="one-shot", releases=100)]
    spent, counted = accountant.estimate(_one_shot(query), passes, DELTA, "labels", "pld")
    assert counted == 100 and spent.epsilon == epsilon_of(dpa.SelfComposedDpEvent(query, 100), DELTA).epsilon

    def calibrate_labels(passes: list[PlannedPass], rules: list[PlanRule]):
        return accountant.calibrate_gaussian(passes, rules, 2.0, DELTA, "labels", "pld")

    z, result, rules, counted = calibrate_labels(passes, [PlanRule(kind="one-shot", participation_bound=None)])
    assert counted == 100 and 2.0 * (1 - 1e-9) <= result.epsilon <= 2.0 and rules[0].kind == "one-shot"
    sampled = [PlanRule(kind="one-shot", participation_bound=None, sampling_probability=0.1)]
    assert "PoissonSampledDpEvent" in str(_error(lambda: calibrate_labels(passes, sampled)))
    train = [PlanRule(kind="train", participation_bound=None)]
    train_passes = [PlannedPass(kind="train", releases=3)]
    assert "one-shot releases only" in str(_error(lambda: calibrate_labels(train_passes, train)))


def test_the_label_ledger_of_a_64_character_run_id_fits(accountant: Accountant) -> None:
    run_id = label_ledger_id("a" * 64)
    assert main_run_id(run_id) == "a" * 64 and main_run_id("plain") == "plain"
    assert _create_label_run(accountant, rr(1.0, 2), 1.0, run_id=run_id).run_id == run_id
    assert "1 to 128 characters" in str(_error(lambda: _create_label_run(accountant, rr(1.0, 2), 1.0, run_id="x" * 129)))


# -- two credentials ------------------------------------------------------------------------

A_TOKEN, B_TOKEN = "a" * 20 + "-party-a", "b" * 20 + "-party-b"
GAUSS = dpa.GaussianDpEvent(3.0)


@pytest.fixture
def server(accountant: Accountant):
    service = AccountantService(accountant, A_TOKEN, B_TOKEN)
    name = accountant_pb2.DESCRIPTOR.services_by_name["Accountant"].full_name
    grpc_server, port = start_server(
        "127.0.0.1:0", [(accountant_pb2_grpc.add_AccountantServicer_to_server, service, name)], max_message_mb=4
    )
    address = f"127.0.0.1:{port}"
    clients = {who: AccountantClient(address, token, charge_retries=0) for who, token in
               (("A", A_TOKEN), ("B", B_TOKEN), ("forger", "f" * 30), ("nobody", None))}
    yield accountant, clients
    for client in clients.values():
        client.close()
    grpc_server.stop(grace=None)


def _edge_rules() -> list[ChargeRule]:
    return [ChargeRule(kind="train", release_event=event_to_json(GAUSS), participation_bound=None)]


def _create_edge(client: AccountantClient, run_id: str = "r1") -> None:
    client.create_run(run_id, 50.0, DELTA, _edge_rules(), "pmp-gin", "visible-batch", "pld", {}, privacy_unit="edge")


def _create_labels(client: AccountantClient, run_id: str = "r1.labels") -> None:
    client.create_run(run_id, 4.0, DELTA, _one_shot(rr(1.0, 2)), "labels-rr", "labels", "pld", {}, privacy_unit="label")


def _charge_edge(client: AccountantClient, key: str, run_id: str = "r1"):
    return client.charge(run_id, key, "train-0", "train", 4, "d", event_to_json(GAUSS))


def _charge_labels(client: AccountantClient, key: str, run_id: str = "r1.labels"):
    return client.charge(run_id, key, "labels-0", "one-shot", 4, "d", event_to_json(rr(1.0, 2)))


def _snapshot(accountant: Accountant) -> dict:
    runs = accountant.store.list_runs()
    return {r.run_id: (accountant.status(r.run_id), accountant.store.charges(r.run_id)) for r in runs}


def test_each_party_spends_only_its_own_ledger(server) -> None:
    accountant, clients = server
    a, b = clients["A"], clients["B"]
    # creating: B's token cannot open an edge run, A's cannot open a label ledger
    denied = "PERMISSION_DENIED: creating a run .privacy unit '{}'. needs party {}"
    with pytest.raises(PeerError, match=denied.format("edge", "A's charge token")):
        _create_edge(b)
    with pytest.raises(PeerError, match=denied.format("label", "B's label charge token")):
        _create_labels(a)
    assert accountant.store.list_runs() == []
    _create_edge(a)
    _create_labels(b)
    _charge_edge(a, "t0")
    _charge_labels(b, "rr")
    before = _snapshot(accountant)
    refused = [
        (
            lambda: _charge_labels(a, "x"),
            "charging a release of run 'r1.labels' .privacy unit 'label'. needs party B's label charge token",
        ),
        (lambda: a.close_run("r1.labels", "failed", "A tries"), "needs party B's label charge token"),
        (lambda: _charge_edge(b, "x"), "charging a release of run 'r1' .privacy unit 'edge'. needs party A's charge token"),
        (lambda: b.close_run("r1", "failed", "B tries"), "needs party A's charge token"),
        (lambda: _create_edge(b, "r2"), "needs party A's charge token"),
        (lambda: _create_labels(a, "r2.labels"), "needs party B's label charge token"),
    ]
    for call, fragment in refused:
        with pytest.raises(PeerError, match=fragment) as info:
            call()
        assert "PERMISSION_DENIED" in str(info.value)
    forger = clients["forger"]
    for call in (lambda: _charge_edge(forger, "x"), lambda: _charge_labels(forger, "x"),
                 lambda: _create_labels(forger, "r3.labels"), lambda: forger.close_run("r1", "failed", "")):
        with pytest.raises(PeerError, match="UNAUTHENTICATED: .* party B's label charge token for its label ledgers"):
            call()
    with pytest.raises(PeerError, match="no charge token"):  # the client does not even try without one
        _charge_labels(clients["nobody"], "x")
    assert _snapshot(accountant) == before  # nothing refused left a trace
    # an unknown run is NOT_FOUND for either valid token, as before
    for client in (a, b):
        with pytest.raises(PeerError, match="NOT_FOUND: unknown run id 'ghost'"):
            client.charge("ghost", "k", "p", "train", 1, "d", event_to_json(GAUSS))
    # each party can close its own
    assert a.close_run("r1", "completed", "").status == "completed"
    assert b.close_run("r1.labels", "completed", "").status == "completed"


def test_reading_needs_neither_token(server) -> None:
    accountant, clients = server
    _create_edge(clients["A"])
    _create_labels(clients["B"])
    _charge_labels(clients["B"], "rr")
    for who in ("A", "B", "forger", "nobody"):
        status = clients[who].get_run("r1.labels")
        assert status.accounting == "labels" and status.epsilon_spent == epsilon_of(rr(1.0, 2), DELTA).epsilon
    rest = TestClient(create_app(accountant))
    runs = {r["run_id"]: r for r in rest.get("/v1/runs").json()}
    assert runs["r1"]["privacy_unit"] == "edge" and runs["r1.labels"]["privacy_unit"] == "label"
    assert runs["r1.labels"]["assumption"].startswith("labels: party B's own ledger")
    for asked in ("r1", "r1.labels"):
        related = rest.get(f"/v1/runs/{asked}/related").json()
        assert [(r["run_id"], r["accounting"]) for r in related] == [("r1", "visible-batch"), ("r1.labels", "labels")]
    # two budgets, two ε's: the edge run's ε is its own, not the sum
    assert related[0]["epsilon_spent"] == 0.0 and related[1]["epsilon_spent"] > 0
    assert rest.get("/v1/runs/ghost/related").status_code == 404
    assert rest.get("/v1/runs/r1.labels/ledger").json()["rows"][0]["accounting"] == "labels"


def test_the_two_tokens_must_differ(accountant: Accountant, tmp_path) -> None:
    with pytest.raises(ValueError, match="are the same"):
        AccountantService(accountant, A_TOKEN, A_TOKEN)
    with pytest.raises(ValueError, match="label charge token must have at least 16"):
        AccountantService(accountant, A_TOKEN, "short")
    first, second = tmp_path / "a" / "charge.token", tmp_path / "b" / "label-charge.token"
    a_token, b_token = ensure_distinct_tokens(first, second)
    assert a_token != b_token and len(b_token) >= 32
    assert first.stat().st_mode & 0o077 == 0 and second.stat().st_mode & 0o077 == 0
    assert ensure_distinct_tokens(first, second) == (a_token, b_token)  # kept across restarts
    with pytest.raises(TokenError, match="both"):
        ensure_distinct_tokens(first, tmp_path / "a" / ".." / "a" / "charge.token")
    copy = tmp_path / "copy.token"
    copy.write_text(a_token + "\n")
    with pytest.raises(TokenError, match="hold the same token"):
        ensure_distinct_tokens(first, copy)
