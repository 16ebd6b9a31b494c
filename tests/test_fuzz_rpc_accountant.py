"""Fuzzing the accountant's RPCs (Calibrate, Estimate, CreateRun, Charge, GetRun, CloseRun,
ReopenRun), live on loopback, and the regression tests of the bugs it found there, some of
them on an accountant without a cluster.

The cluster, shared by every test_fuzz_rpc_*.py module: fuzz_rpc_world.py and
fuzz_rpc_cluster.py; the expectations and shared strategies: fuzz_rpc_strategies.py.
tests/test_e2e_bad_input.py holds the hand-picked cases.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import dp_accounting as dpa
import grpc
import pytest
from e2e import ledger
from fuzz_rpc_strategies import (
    CLEAR,
    DENIED,
    DEPTHS,
    EXHAUSTED,
    EXISTS,
    INF,
    INVALID,
    NAN,
    NOT_FOUND,
    PRECONDITION,
    TOKEN_CHARS,
    UNAUTHENTICATED,
    Expect,
    _not_json,
    assert_refused,
    fuzz_settings,
    unknown_run_ids,
)
from fuzz_rpc_world import CLOSED_RUN, DELTA, EDGE_RUN, EVENT, KNOWN_ACCOUNT_RUNS, World, _create_request
from hypothesis import given
from hypothesis import strategies as st

from vesper.accountant.budget import Accountant, AccountantError
from vesper.accountant.ledger_store import LedgerStore
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule
from vesper.proto.v1 import accountant_pb2 as acc
from vesper.proto.v1 import label_party_pb2 as lp

pytest_plugins = ["fuzz_rpc_cluster"]  # the `world` fixture: one cluster for every fuzz module
# the RPC fuzzers share that cluster and a real run (~2 minutes on 2 cores): make test-slow
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _plan(releases: int = 10) -> acc.ReleasePlan:
    return acc.ReleasePlan(passes=[acc.PlannedPass(kind="train", releases=releases)], rules=[acc.PlanRule(kind="train")])


BAD_DELTAS = st.sampled_from([0.0, 1.0, 1.5, -1e-5, NAN, INF, -INF])
BAD_EVENTS = st.one_of(
    st.text(min_size=1, max_size=40).filter(_not_json),
    st.sampled_from([
        "{}", "[]", "null", '{"type": "LaplaceDpEvent"}', '{"type": "GaussianDpEvent", "noise_multiplier": -1}',
        '{"type": "GaussianDpEvent", "noise_multiplier": NaN}', '{"type": "NoSuchDpEvent"}',
        '{"type": "PoissonSampledDpEvent", "sampling_probability": 2, "event": {"type": "GaussianDpEvent", "noise_multiplier": 1}}',
        '{"type": "GaussianDpEvent", "noise_multiplier": 1, "extra": 2}', '{"type": "ComposedDpEvent", "events": 3}',
    ]),
)


def _bad_accounting_setting(
    draw: st.DrawFn, request: acc.CalibrateRequest | acc.EstimateRequest, fault: str, expects: list[Expect]
) -> bool:
    """The faults Calibrate and Estimate share (the same delta, accounting and accountant
    fields): applies ``fault`` if it is one of them and says whether it was."""
    if fault == "delta":
        request.delta = draw(BAD_DELTAS)
        expects.append(Expect(INVALID, "delta must be in"))
    elif fault == "accounting":
        request.accounting = draw(st.text(min_size=1, max_size=12).filter(lambda a: a not in ("visible-batch", "hidden-batch", "labels")))
        expects.append(Expect(INVALID, "unknown accounting mode"))
    elif fault == "accountant":
        request.accountant = draw(st.text(min_size=1, max_size=12).filter(lambda a: a not in ("pld", "rdp")))
        expects.append(Expect(INVALID, "unknown accountant"))
    else:
        return False
    return True


@st.composite
def calibrate_requests(draw: st.DrawFn) -> tuple[acc.CalibrateRequest, list[Expect]]:
    request = acc.CalibrateRequest(mechanism="gaussian", plan=_plan(), target_epsilon=4.0, delta=DELTA)
    expects = []
    for fault in sorted(draw(st.sets(st.sampled_from(
        ["mechanism", "epsilon", "delta", "accounting", "accountant", "pass without rule", "rule", "two rules", "nothing"]
    ), min_size=1, max_size=3))):
        if _bad_accounting_setting(draw, request, fault, expects):
            continue
        if fault == "mechanism":
            request.mechanism = draw(st.text(max_size=12).filter(lambda m: m != "gaussian"))
            expects.append(Expect(INVALID, "unknown mechanism"))
        elif fault == "epsilon":
            request.target_epsilon = draw(st.sampled_from([0.0, -1.0, NAN, INF, -INF]))
            expects.append(Expect(INVALID, "target epsilon must be finite and > 0"))
        elif fault == "pass without rule":
            request.plan.passes.append(acc.PlannedPass(kind=draw(st.sampled_from(["eval", "one-shot", "pre-train"])), releases=3))
            expects.append(Expect(INVALID, "no rule for"))
        elif fault == "rule":
            rule = draw(st.sampled_from([
                acc.PlanRule(kind="training"), acc.PlanRule(kind="train", sampling_probability=1.5),
                acc.PlanRule(kind="train", sampling_probability=-0.5), acc.PlanRule(kind="train", noise_scale=-2.0),
                acc.PlanRule(kind="train", mechanism="laplace"), acc.PlanRule(kind="train", mechanism="mixture-of-gaussians"),
                acc.PlanRule(kind="train", sampling_probability=NAN), acc.PlanRule(kind="train", noise_scale=NAN),
            ]))
            request.plan.rules[0].CopyFrom(rule)
            expects.append(Expect(INVALID, "in the request: |no rule for"))
        elif fault == "two rules":
            request.plan.rules.append(acc.PlanRule(kind="train"))
            expects.append(Expect(INVALID, "one rule per kind"))
        else:
            request.plan.passes[0].releases = 0
            expects.append(Expect(INVALID, "the plan counts no release"))
    return request, expects


@pytest.mark.parametrize("examples", DEPTHS)
def test_calibrate_refuses_every_bad_plan(world: World, examples: int) -> None:
    right = world.accountant.Calibrate(acc.CalibrateRequest(mechanism="gaussian", plan=_plan(), target_epsilon=4.0, delta=DELTA), timeout=60)
    assert right.noise_multiplier > 0 and right.epsilon <= 4.0

    @given(case=calibrate_requests())
    @fuzz_settings(examples)
    def check(case: tuple[acc.CalibrateRequest, list[Expect]]) -> None:
        request, expects = case
        assert_refused(lambda: world.accountant.Calibrate(request, timeout=60), expects)

    check()


@st.composite
def estimate_requests(draw: st.DrawFn) -> tuple[acc.EstimateRequest, list[Expect]]:
    request = acc.EstimateRequest(
        rules=[acc.ChargeRule(kind="train", release_event_json=EVENT)], passes=[acc.PlannedPass(kind="train", releases=10)],
        delta=DELTA,
    )
    expects = []
    for fault in sorted(draw(st.sets(st.sampled_from(
        ["event", "no train rule", "two rules", "rule kind", "delta", "accounting", "accountant", "pass without rule", "hidden-batch"]
    ), min_size=1, max_size=3))):
        if _bad_accounting_setting(draw, request, fault, expects):
            continue
        if fault == "event":
            request.rules[0].release_event_json = draw(BAD_EVENTS)
            expects.append(Expect(INVALID, "bad release event"))
        elif fault == "no train rule":
            request.rules[0].kind = "eval"
            expects.append(Expect(INVALID, "needs a rule for its train releases|no rule for"))
        elif fault == "two rules":
            request.rules.append(acc.ChargeRule(kind=request.rules[0].kind, release_event_json=EVENT))
            expects.append(Expect(INVALID, "one rule per kind"))
        elif fault == "rule kind":
            request.rules.append(acc.ChargeRule(kind=draw(st.text(max_size=10).filter(
                lambda k: k not in ("train", "eval", "one-shot", "pre-train"))), release_event_json=EVENT))
            expects.append(Expect(INVALID, "in the request: "))
        elif fault == "pass without rule":
            request.passes.append(acc.PlannedPass(kind="one-shot", releases=draw(st.integers(1, 2**64 - 1))))
            expects.append(Expect(INVALID, "no rule for one-shot"))
        else:
            request.accounting = draw(st.sampled_from(["hidden-batch", "labels"]))
            expects.append(Expect(INVALID, "hidden-batch training releases must be|a label ledger charges"))
    return request, expects


@pytest.mark.parametrize("examples", DEPTHS)
def test_estimate_refuses_every_bad_plan(world: World, examples: int) -> None:
    right = world.accountant.Estimate(acc.EstimateRequest(
        rules=[acc.ChargeRule(kind="train", release_event_json=EVENT)], passes=[acc.PlannedPass(kind="train", releases=10)],
        delta=DELTA,
    ), timeout=60)
    assert right.counted_releases == 10 and right.epsilon > 0

    @given(case=estimate_requests())
    @fuzz_settings(examples)
    def check(case: tuple[acc.EstimateRequest, list[Expect]]) -> None:
        request, expects = case
        assert_refused(lambda: world.accountant.Estimate(request, timeout=60), expects)

    check()


@st.composite
def credentials(draw: st.DrawFn, world: World, needed: str) -> tuple[tuple[tuple[str, str], ...], Expect | None]:
    """The metadata of a spending call: usually ``needed``'s token, else none, a bad one, or the other party's."""
    kind = draw(st.sampled_from(["right", "right", "none", "garbage", "not bearer", "other party"]))
    if kind == "right":
        return world.auth[needed], None
    if kind == "none":
        return (), Expect(UNAUTHENTICATED, "needs a charge token")
    if kind == "other party":
        return world.auth["B" if needed == "A" else "A"], Expect(DENIED, "needs party A's charge token")
    token = draw(st.text(TOKEN_CHARS, max_size=40))
    value = f"Bearer {token}" if kind == "garbage" else token
    return (("authorization", value),), Expect(UNAUTHENTICATED, "needs a charge token")


@st.composite
def create_requests(draw: st.DrawFn, world: World) -> tuple[acc.CreateRunRequest, tuple, list[Expect]]:
    request = _create_request("fuzz-new-run", 4.0)
    metadata, auth_expect = draw(credentials(world, "A"))
    expects = [auth_expect] if auth_expect else []
    faults = draw(st.sets(st.sampled_from([
        "run id taken", "run id length", "unit", "accounting", "accountant", "delta", "budget", "note", "no train rule",
        "two rules", "event", "details not json", "details not an object",
    ]), min_size=0 if expects else 1, max_size=3))
    for fault in sorted(faults):
        if fault == "run id taken":
            request.run_id = draw(st.sampled_from(sorted(world.accountant_runs)))
            expects.append(Expect(EXISTS, "already exists"))
            if request.run_id.endswith(".labels"):  # B's label ledgers: only B opens those ids
                expects.append(Expect(INVALID, "names party B's label ledgers"))
        elif fault == "run id length":
            request.run_id = draw(st.sampled_from(["", "r" * 129, "x" * 200]))
            expects.append(Expect(INVALID, r"run id.* 1 to 128"))
        elif fault == "unit":  # a unit of party A's with a mode that is not: refused, whoever asks
            request.accounting = "labels"
            expects.append(Expect(INVALID, "privacy unit 'edge' with accounting 'labels'|a label ledger charges"))
        elif fault == "accounting":
            request.accounting = draw(st.text(max_size=12).filter(lambda a: a not in ("visible-batch", "hidden-batch", "labels")))
            expects.append(Expect(INVALID, "unknown accounting mode"))
        elif fault == "accountant":
            request.accountant = draw(st.text(min_size=1, max_size=12).filter(lambda a: a not in ("pld", "rdp")))
            expects.append(Expect(INVALID, "unknown accountant"))
        elif fault == "delta":
            request.delta = draw(BAD_DELTAS)
            expects.append(Expect(INVALID, "delta must be in"))
        elif fault == "budget":
            request.epsilon_budget = draw(st.sampled_from([0.0, -1.0, NAN, -INF]))
            expects.append(Expect(INVALID, "epsilon budget must be > 0"))
        elif fault == "note":
            request.assumption_note = "n" * draw(st.integers(1001, 5000))
            expects.append(Expect(INVALID, "limited to 1000 characters"))
        elif fault == "no train rule":
            request.rules[0].kind = "eval"
            expects.append(Expect(INVALID, "needs a rule for its train releases"))
        elif fault == "two rules":
            request.rules.append(acc.ChargeRule(kind=request.rules[0].kind, release_event_json=EVENT))
            expects.append(Expect(INVALID, "one rule per kind"))
        elif fault == "event":
            request.rules[0].release_event_json = draw(BAD_EVENTS)
            expects.append(Expect(INVALID, "bad release event"))
        elif fault == "details not json":
            request.details_json = draw(st.text(min_size=1, max_size=40).filter(_not_json))
            expects.append(Expect(INVALID, "details_json is not JSON"))
        else:
            request.details_json = json.dumps(draw(st.one_of(st.integers(), st.lists(st.integers(), max_size=3), st.text(max_size=8))))
            expects.append(Expect(INVALID, "invalid RunRecord in the request: "))
    return request, metadata, expects


@pytest.mark.parametrize("examples", DEPTHS)
def test_create_run_refuses_every_bad_request(world: World, examples: int) -> None:
    """The same request with a fresh run id and no fault created EDGE_RUN (the fixture)."""

    @given(data=st.data())
    @fuzz_settings(examples)
    def check(data: st.DataObject) -> None:
        request, metadata, expects = data.draw(create_requests(world))
        assert_refused(lambda: world.accountant.CreateRun(request, metadata=metadata, timeout=30), expects)

    check()


@st.composite
def charge_requests(draw: st.DrawFn, world: World) -> tuple[acc.ChargeRequest, tuple, list[Expect]]:
    """A charge to EDGE_RUN, whose budget is spent: even a right new release is refused (RESOURCE_EXHAUSTED)."""
    request = acc.ChargeRequest(**world.charged_release)
    request.release_key = draw(st.text(min_size=1, max_size=40).filter(lambda k: k != world.charged_release["release_key"]))
    request.pass_id = draw(st.sampled_from(["train-0", "train-1", "train-7"]))
    metadata, auth_expect = draw(credentials(world, "A"))
    expects = [auth_expect] if auth_expect else []
    budget = Expect(EXHAUSTED, "budget exhausted")
    for fault in sorted(draw(st.sets(st.sampled_from([
        "unknown run", "key", "kind", "no rule", "pass id", "no nodes", "event", "other event", "changed retry", "pass kind",
    ]), max_size=3))):
        if fault == "unknown run":
            request.run_id = draw(unknown_run_ids(world.accountant_runs))
            expects.append(Expect(NOT_FOUND, "unknown run id"))
        elif fault == "key":
            request.release_key = draw(st.sampled_from(["", "k" * 129]))
            expects.append(Expect(INVALID, "release key of 1 to 128 characters"))
        elif fault == "kind":
            request.kind = draw(st.text(max_size=10).filter(lambda k: k not in ("train", "eval", "one-shot", "pre-train")))
            expects.append(Expect(INVALID, "kind must be one of"))
        elif fault == "no rule":
            request.kind = draw(st.sampled_from(["eval", "one-shot", "pre-train"]))
            expects.append(Expect(INVALID, "has no rule for"))
        elif fault == "pass id":
            request.pass_id = ""
            expects.append(Expect(INVALID, "needs a pass id and at least one node"))
        elif fault == "no nodes":
            request.num_nodes = 0
            expects.append(Expect(INVALID, "needs a pass id and at least one node"))
        elif fault == "event":
            request.release_event_json = draw(BAD_EVENTS)
            expects.append(Expect(INVALID, "bad release event"))
        elif fault == "other event":
            request.release_event_json = event_to_json(dpa.GaussianDpEvent(draw(st.floats(0.01, 100).filter(lambda z: z != 3.0))))
            expects.append(Expect(INVALID, "differs from the one declared"))
        elif fault == "changed retry":  # the charged release's key, with something else changed
            request.release_key = world.charged_release["release_key"]
            request.nodes_digest = draw(st.text(max_size=20).filter(lambda d: d != world.charged_release["nodes_digest"]))
            expects.append(Expect(EXISTS, "was charged for a different release"))
        else:
            request.pass_id = "train-0"
            request.kind = draw(st.sampled_from(["eval", "one-shot"]))
            expects.append(Expect(INVALID, "holds train releases|has no rule for"))
    if request.release_key == world.charged_release["release_key"]:
        # a retry of the charged key differs in at least one field the accountant compares
        expects.append(Expect(EXISTS, "was charged for a different release"))
    return request, metadata, expects + [budget]


@pytest.mark.parametrize("examples", DEPTHS)
def test_charge_refuses_every_bad_or_unaffordable_release_and_replays_the_charged_one(world: World, examples: int) -> None:
    rows_before = ledger(world.cluster.status_url, EDGE_RUN)["rows"]

    @given(data=st.data(), exact_retry=st.integers(0, 9))
    @fuzz_settings(examples)
    def check(data: st.DataObject, exact_retry: int) -> None:
        if exact_retry == 0:  # the charged release itself, retried: its receipt, nothing charged
            receipt = world.accountant.Charge(acc.ChargeRequest(**world.charged_release), metadata=world.auth["A"], timeout=30)
            assert receipt.replayed and receipt.seq == 0 and receipt.counted
            return
        request, metadata, expects = data.draw(charge_requests(world))
        assert_refused(lambda: world.accountant.Charge(request, metadata=metadata, timeout=30), expects)

    check()
    assert ledger(world.cluster.status_url, EDGE_RUN)["rows"] == rows_before


@pytest.mark.parametrize("examples", DEPTHS)
def test_get_run_refuses_unknown_runs(world: World, examples: int) -> None:
    assert world.accountant.GetRun(acc.GetRunRequest(run_id=EDGE_RUN), timeout=30).charges == 1

    @given(run_id=unknown_run_ids(world.accountant_runs))
    @fuzz_settings(examples)
    def check(run_id: str) -> None:
        assert_refused(lambda: world.accountant.GetRun(acc.GetRunRequest(run_id=run_id), timeout=30),
                       [Expect(NOT_FOUND, "unknown run id")])

    check()


CLOSE_STATUSES = ("completed", "failed", "refused", "cancelled", "interrupted")


@st.composite
def close_requests(draw: st.DrawFn, world: World, rpc: str) -> tuple[object, tuple, list[Expect]]:
    """CloseRun of EDGE_RUN (never with a status it takes) or ReopenRun of CLOSED_RUN (failed, not interrupted)."""
    metadata, auth_expect = draw(credentials(world, "A"))
    expects = [auth_expect] if auth_expect else []
    run_id = EDGE_RUN if rpc == "close" else CLOSED_RUN
    if draw(st.booleans()):
        run_id = draw(unknown_run_ids(world.accountant_runs))
        expects.append(Expect(NOT_FOUND, "unknown run id"))
    if rpc == "reopen":
        expects.append(Expect(PRECONDITION, "only an interrupted run can be reopened"))
        return acc.ReopenRunRequest(run_id=run_id, reason=draw(st.text(max_size=30))), metadata, expects
    status = draw(st.text(max_size=15).filter(lambda s: s not in CLOSE_STATUSES))
    expects.append(Expect(INVALID, "cannot close a run as"))
    return acc.CloseRunRequest(run_id=run_id, status=status, reason=draw(st.text(max_size=30))), metadata, expects


@pytest.mark.parametrize("examples", DEPTHS)
def test_close_and_reopen_refuse_bad_requests(world: World, examples: int) -> None:
    """CLOSED_RUN was closed, reopened while interrupted, and closed again by the same calls (the fixture)."""

    @given(data=st.data(), rpc=st.sampled_from(["close", "reopen"]))
    @fuzz_settings(examples)
    def check(data: st.DataObject, rpc: str) -> None:
        request, metadata, expects = data.draw(close_requests(world, rpc))
        call = world.accountant.CloseRun if rpc == "close" else world.accountant.ReopenRun
        assert_refused(lambda: call(request, metadata=metadata, timeout=30), expects)

    check()
    statuses = {run_id: world.accountant.GetRun(acc.GetRunRequest(run_id=run_id), timeout=30).status for run_id in KNOWN_ACCOUNT_RUNS}
    assert statuses == {EDGE_RUN: "active", CLOSED_RUN: "failed"}


# -- bugs the fuzzing found outside this test's files, fixed: their regression tests -----------
def assert_answered_clearly(call: Callable[[], object]) -> object | None:
    """The call answers, or is refused with a clear status (never UNKNOWN or INTERNAL)."""
    try:
        return call()
    except grpc.RpcError as error:
        assert error.code() in CLEAR, f"unclear status {error.code().name}: {error.details()}"
        return None


def test_a_noise_multiplier_too_small_to_matter_is_answered_clearly(world: World) -> None:
    tiny = event_to_json(dpa.GaussianDpEvent(1e-300))
    request = acc.EstimateRequest(rules=[acc.ChargeRule(kind="train", release_event_json=tiny)],
                                  passes=[acc.PlannedPass(kind="train", releases=10)], delta=DELTA)
    reply = assert_answered_clearly(lambda: world.accountant.Estimate(request, timeout=60))
    assert reply is None or reply.epsilon == INF  # next to no noise: no privacy
    plan = acc.ReleasePlan(passes=[acc.PlannedPass(kind="train", releases=10)], rules=[acc.PlanRule(kind="train", noise_scale=1e-300)])
    request = acc.CalibrateRequest(mechanism="gaussian", plan=plan, target_epsilon=4.0, delta=DELTA)
    assert_refused(lambda: world.accountant.Calibrate(request, timeout=60), [Expect(INVALID, "")])


def test_deeply_nested_json_is_refused_clearly(world: World) -> None:
    deep = "[" * 5000 + "]" * 5000
    request = acc.EstimateRequest(rules=[acc.ChargeRule(kind="train", release_event_json=deep)],
                                  passes=[acc.PlannedPass(kind="train", releases=10)], delta=DELTA)
    assert_refused(lambda: world.accountant.Estimate(request, timeout=60), [Expect(INVALID, "bad release event")])
    taken = _create_request(EDGE_RUN, 4.0)  # an existing id: even once parsed, nothing is created
    taken.details_json = deep
    assert_refused(lambda: world.accountant.CreateRun(taken, metadata=world.auth["A"], timeout=60),
                   [Expect(INVALID, "details_json"), Expect(EXISTS, "already exists")])


def test_a_huge_unknown_run_id_gets_its_own_status(world: World) -> None:
    huge = "x" * 20_000
    assert_refused(lambda: world.accountant.GetRun(acc.GetRunRequest(run_id=huge), timeout=30),
                   [Expect(NOT_FOUND, "unknown run id")])
    assert_refused(lambda: world.b.FinishRun(lp.FinishRunRequest(run_id=huge), timeout=30),
                   [Expect(NOT_FOUND, "unknown run id")])


def _accountant(tmp_path: Path) -> Accountant:
    return Accountant(LedgerStore(tmp_path / "ledger.sqlite"))


def _create(accountant: Accountant, run_id: str, unit: str = "edge") -> None:
    accountant.create_run(run_id, unit, "visible-batch", "pld", 4.0, DELTA, [ChargeRule(kind="train", release_event=EVENT,
                          participation_bound=None)], "fuzz", {})


def test_the_accountant_creates_runs_of_party_a_units_with_plain_ids(tmp_path: Path) -> None:
    """The right input of the two refusals below (no cluster: nothing reaches the module's ledger)."""
    accountant = _accountant(tmp_path)
    for run_id, unit in (("0123abcd4567", "edge"), ("run_2.b-c", "node")):
        _create(accountant, run_id, unit)
        assert accountant.status(run_id).privacy_unit == unit


def test_the_accountant_refuses_an_unknown_privacy_unit(tmp_path: Path) -> None:
    with pytest.raises(AccountantError, match="privacy unit"):
        _create(_accountant(tmp_path), "fuzz-banana", "banana")


def test_the_accountant_refuses_run_ids_its_status_cannot_serve(tmp_path: Path) -> None:
    accountant = _accountant(tmp_path)
    for run_id in ("a/b", "x/../y"):
        with pytest.raises(AccountantError, match="run id"):
            _create(accountant, run_id)
