"""The accountant's rules and its REST status, in process over a real SQLite ledger."""

import math
import threading

import dp_accounting as dpa
import pytest
from fastapi.testclient import TestClient

from vesper.accountant.budget import Accountant, AccountantError
from vesper.accountant.ledger_store import LedgerSchemaError, LedgerStore
from vesper.accountant.rest import create_app
from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import (
    ChargeRule,
    LedgerView,
    PlannedPass,
    PlanRule,
    RunStatusView,
    replay,
)

GAUSS = event_to_json(dpa.GaussianDpEvent(2.0))
EVAL = event_to_json(dpa.GaussianDpEvent(3.0))


@pytest.fixture
def accountant(tmp_path) -> Accountant:
    return Accountant(LedgerStore(tmp_path / "ledger.sqlite"))


def _rules(bound: int | None = 2, train: str = GAUSS, evaluation: str | None = EVAL) -> list[ChargeRule]:
    rules = [ChargeRule(kind="train", release_event=train, participation_bound=bound)]
    if evaluation is not None:
        rules.append(ChargeRule(kind="eval", release_event=evaluation, participation_bound=bound))
    return rules


def _create(service: Accountant, run_id: str = "run1", budget: float = 8.0, bound: int | None = 2, **kw):
    mode = kw.pop("accounting", "visible-batch")
    return service.create_run(
        run_id, "edge", mode, kw.pop("accountant", "pld"), budget, 1e-5, kw.pop("rules", None) or _rules(bound, **kw),
        "pmp-gin", {"k": 1},
    )


def _charge(accountant: Accountant, key: str, pass_id: str = "train-0", kind: str = "train", event: str = GAUSS,
            run_id: str = "run1", nodes: int = 4, digest: str = "d"):
    return accountant.charge(run_id, key, pass_id, kind, nodes, digest, event)


def _error(call) -> AccountantError:
    with pytest.raises(AccountantError) as info:
        call()
    return info.value


def _gauss_eps(count_train: int, count_eval: int = 0) -> float:
    parts = [dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), count_train)]
    if count_eval:
        parts.append(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(3.0), count_eval))
    return epsilon_of(dpa.ComposedDpEvent(parts), 1e-5).epsilon


def test_charges_follow_the_participation_rule_per_kind(accountant: Accountant) -> None:
    _create(accountant)
    counted = [_charge(accountant, f"t{i}", f"train-{i // 3}")[0].counted for i in range(6)]
    assert counted == [True, True, False, True, True, False]
    counted_eval = [_charge(accountant, f"e{i}", "eval-0", "eval", EVAL)[0].counted for i in range(3)]
    assert counted_eval == [True, True, False]
    view = accountant.status("run1")
    assert view.charges == 9 and view.counted_charges == 6
    # four Gaussian(2) training releases and two Gaussian(3) evaluation releases
    assert view.epsilon_spent == _gauss_eps(4, 2)
    assert view.accountant == "gaussian-exact" and view.accountant_requested == "pld"
    assert view.assumption.startswith("visible-batch: party B sees every batch's node ids")
    assert [p.seq for p in view.epsilon_curve] == [0, 1, 3, 4, 6, 7]
    assert all(a.epsilon < b.epsilon for a, b in zip(view.epsilon_curve, view.epsilon_curve[1:]))


def test_a_charge_past_the_budget_is_refused_and_not_recorded(accountant: Accountant) -> None:
    one, two = _gauss_eps(1), _gauss_eps(2)
    _create(accountant, budget=(one + two) / 2, bound=None)
    _charge(accountant, "a")
    error = _error(lambda: _charge(accountant, "b"))
    assert error.code == "RESOURCE_EXHAUSTED" and "budget exhausted" in str(error)
    assert len(accountant.store.charges("run1")) == 1
    assert accountant.status("run1").epsilon_spent == one


def test_a_retried_charge_is_not_charged_twice(accountant: Accountant) -> None:
    _create(accountant, bound=None)
    first, replayed = _charge(accountant, "train-0/0")
    assert not replayed
    again, replayed = _charge(accountant, "train-0/0")
    assert replayed and again == first
    assert accountant.status("run1").charges == 1
    assert accountant.status("run1").epsilon_spent == _gauss_eps(1)
    # the same key for a different release is a conflict, not a retry
    error = _error(lambda: _charge(accountant, "train-0/0", digest="other nodes"))
    assert error.code == "ALREADY_EXISTS" and "different release" in str(error)
    # a retry after the run closed still returns the original receipt (the release was paid for)
    accountant.close_run("run1", "failed", "B vanished")
    assert _charge(accountant, "train-0/0") == (first, True)


def test_concurrent_charges_are_serialised(accountant: Accountant) -> None:
    _create(accountant, budget=math.inf, bound=3)
    barrier = threading.Barrier(8)
    errors: list[Exception] = []

    def worker(w: int) -> None:
        barrier.wait()
        try:
            for i in range(25):
                _charge(accountant, f"w{w}/{i}", f"train-{i % 5}")
                _charge(accountant, f"w{w}/{i}", f"train-{i % 5}")  # every worker also retries
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    rows = accountant.store.charges("run1")
    assert [r.seq for r in rows] == list(range(200))  # no gap, no duplicate
    assert len({r.release_key for r in rows}) == 200
    # 5 passes of 40 releases, N_e = 3: exactly 15 counted, whatever the interleaving
    assert sum(r.counted for r in rows) == 15
    result = replay(accountant.store.get_run("run1"), rows)
    assert result.consistent, result.problems
    assert result.epsilon == accountant.status("run1").epsilon_spent == _gauss_eps(15)


@pytest.mark.parametrize(
    "key, pass_id, kind, event, code, fragment",
    [
        ("", "train-0", "train", GAUSS, "INVALID_ARGUMENT", "release key"),
        ("k", "train-0", "train", EVAL, "INVALID_ARGUMENT", "differs from the one declared"),
        ("k", "train-0", "train", "{bad json", "INVALID_ARGUMENT", "bad release event"),
        ("k", "train-0", "other", GAUSS, "INVALID_ARGUMENT", "kind must be one of train, eval, one-shot"),
        ("k", "train-0", "eval", EVAL, "INVALID_ARGUMENT", "holds train releases"),
        ("k", "", "train", GAUSS, "INVALID_ARGUMENT", "pass id"),
    ],
)
def test_bad_charges_leave_the_ledger_intact(accountant: Accountant, key, pass_id, kind, event, code, fragment) -> None:
    _create(accountant)
    for i in range(2):
        _charge(accountant, f"ok{i}")
    before = accountant.store.charges("run1")
    error = _error(lambda: _charge(accountant, key, pass_id, kind, event))
    assert error.code == code and fragment in str(error)
    assert accountant.store.charges("run1") == before


def test_unknown_runs_closed_runs_and_missing_rules(accountant: Accountant) -> None:
    assert _error(lambda: _charge(accountant, "k", run_id="nope")).code == "NOT_FOUND"
    _create(accountant, evaluation=None)
    assert "no rule for eval" in str(_error(lambda: _charge(accountant, "k", "eval-0", "eval", EVAL)))
    accountant.close_run("run1", "completed", "done")
    assert _error(lambda: _charge(accountant, "k")).code == "FAILED_PRECONDITION"
    assert _error(lambda: _create(accountant)).code == "ALREADY_EXISTS"


def test_an_interrupted_run_takes_no_new_charge_until_reopened_and_survives_a_restart(accountant: Accountant, tmp_path) -> None:
    _create(accountant)
    first, _ = _charge(accountant, "train-0/0")
    accountant.close_run("run1", "interrupted", "party B vanished")
    assert _error(lambda: _charge(accountant, "train-0/1")).code == "FAILED_PRECONDITION"
    # a replay of a charge already made is recognised even now (a resumed run re-charges from its checkpoint)
    again, replayed = _charge(accountant, "train-0/0")
    assert replayed and again.seq == first.seq
    restarted = Accountant(LedgerStore(tmp_path / "ledger.sqlite"))  # the same file as the fixture's
    assert restarted.status("run1").status == "interrupted"
    assert restarted.reopen_run("run1", "resumed").status == "active"
    row, replayed = _charge(restarted, "train-0/1")
    assert not replayed and row.seq == first.seq + 1
    restarted.close_run("run1", "completed", "done")
    assert _error(lambda: restarted.reopen_run("run1", "again")).code == "FAILED_PRECONDITION"
    assert restarted.status("run1").status == "completed"


def test_an_interrupted_run_can_still_be_closed_for_good(accountant: Accountant) -> None:
    _create(accountant)
    accountant.close_run("run1", "interrupted", "lost")
    assert accountant.close_run("run1", "failed", "abandoned").status == "failed"
    assert accountant.close_run("run1", "interrupted", "late").status == "failed"


def test_mode_accountant_budget_and_rules_are_validated_at_creation(accountant: Accountant) -> None:
    def create(**kw):
        return lambda: _create(accountant, run_id="r", **kw)

    assert "unknown accounting mode" in str(_error(create(accounting="hidden")))
    assert "unknown accountant" in str(_error(create(accountant="moments")))
    assert "epsilon budget must be > 0" in str(_error(create(budget=0.0)))
    assert "bad release event" in str(_error(create(train="{}")))
    duplicate = _rules() + _rules()[:1]
    assert "one rule per kind" in str(_error(create(rules=duplicate)))
    # hidden-batch needs sampled Gaussian training steps, every one counted
    assert "PoissonSampled" in str(_error(create(accounting="hidden-batch", bound=None)))
    sampled = event_to_json(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)))
    assert "no participation bound" in str(_error(create(accounting="hidden-batch", train=sampled, bound=2)))


def test_the_mode_is_recorded_at_creation_and_never_changes(accountant: Accountant, tmp_path) -> None:
    sampled = event_to_json(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0)))
    rules = [ChargeRule(kind="train", release_event=sampled, participation_bound=None)]
    _create(accountant, accounting="hidden-batch", accountant="rdp", rules=rules)
    for i in range(3):
        _charge(accountant, f"t{i}", event=sampled)
    view = accountant.status("run1")
    assert view.accounting == "hidden-batch" and "ASSUMES party B cannot tell" in view.assumption
    assert {row.accounting for row in accountant.store.charges("run1")} == {"hidden-batch"}  # every row says so
    # both numbers are reported and the larger is charged
    assert view.epsilon_bound6 is not None and view.epsilon_events > 0
    assert view.epsilon_spent == max(view.epsilon_bound6, view.epsilon_events)
    assert view.accountant in ("bound6", "rdp")
    accountant.close_run("run1", "completed", "")
    reopened = Accountant(LedgerStore(tmp_path / "ledger.sqlite"))
    assert reopened.status("run1").accounting == "hidden-batch"
    result = replay(reopened.store.get_run("run1"), reopened.store.charges("run1"))
    assert result.consistent and result.epsilon == view.epsilon_spent


def test_state_survives_a_restart(tmp_path) -> None:
    path = tmp_path / "ledger.sqlite"
    first = Accountant(LedgerStore(path))
    _create(first)
    for i in range(5):
        _charge(first, f"t{i}", f"train-{i // 2}")
    before = first.status("run1")
    first.store.close()
    second = Accountant(LedgerStore(path))
    assert second.status("run1") == before
    assert _charge(second, "t4", "train-2")[1]  # a retry from before the restart is recognised
    _charge(second, "t5", "train-2")  # the rule continues where it stopped
    assert second.status("run1").counted_charges == before.counted_charges + 1


def test_a_ledger_of_another_schema_is_refused(tmp_path) -> None:
    import sqlite3

    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE runs (run_id TEXT PRIMARY KEY, record TEXT)")
    with pytest.raises(LedgerSchemaError, match="schema version 0"):
        LedgerStore(path)


def test_infinite_budget_and_non_private_releases(accountant: Accountant) -> None:
    private = event_to_json(dpa.NonPrivateDpEvent())
    _create(accountant, budget=math.inf, train=private, evaluation=private)
    row, _ = _charge(accountant, "a", event=private)
    assert math.isinf(row.epsilon_after)


def test_calibration_plans_per_kind(accountant: Accountant) -> None:
    passes = [PlannedPass(kind="train", releases=6)] * 2 + [PlannedPass(kind="eval", releases=1)]
    rules = [PlanRule(kind="train", participation_bound=2), PlanRule(kind="eval", participation_bound=2, noise_scale=1.5)]
    z, result, charge_rules, counted = accountant.calibrate_gaussian(passes, rules, 4.0, 1e-5, "visible-batch", "pld")
    assert counted == 5 and result.epsilon <= 4.0
    # 4 train releases at z and one eval release at 1.5 z: precision (4 + 1/2.25) / z²
    expected = epsilon_of(dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 4), dpa.GaussianDpEvent(1.5 * z)
    ]), 1e-5).epsilon
    assert result.epsilon == pytest.approx(expected, rel=1e-12) and expected > 4.0 * (1 - 1e-6)
    assert [r.kind for r in charge_rules] == ["train", "eval"]
    nothing = [PlanRule(kind="train", participation_bound=0), PlanRule(kind="eval", participation_bound=0)]
    assert "counts no release" in str(_error(lambda: accountant.calibrate_gaussian(passes, nothing, 4.0, 1e-5, "visible-batch", "pld")))
    unruled = [PlanRule(kind="train", participation_bound=2)]
    assert "no rule for eval" in str(_error(lambda: accountant.calibrate_gaussian(passes, unruled, 4.0, 1e-5, "visible-batch", "pld")))


def test_hidden_batch_calibration_satisfies_both_numbers(accountant: Accountant) -> None:
    passes = [PlannedPass(kind="train", releases=50)] * 4 + [PlannedPass(kind="eval", releases=2)]
    rules = [PlanRule(kind="train", participation_bound=None, sampling_probability=0.02),
             PlanRule(kind="eval", participation_bound=2)]
    z, result, _, counted = accountant.calibrate_gaussian(passes, rules, 2.0, 1e-5, "hidden-batch", "rdp")
    assert counted == 202
    assert result.epsilon <= 2.0 and result.epsilon_bound6 <= 2.0 and result.epsilon_events <= 2.0
    assert result.epsilon > 2.0 * (1 - 1e-6)  # the binding number sits at the target


def test_rest_status_ledger_curve_and_openapi(accountant: Accountant) -> None:
    _create(accountant)
    private = event_to_json(dpa.NonPrivateDpEvent())
    _create(accountant, run_id="inf", budget=math.inf, train=private, evaluation=private)
    _charge(accountant, "a", run_id="inf", event=private)
    for i in range(3):
        _charge(accountant, f"t{i}")
    client = TestClient(create_app(accountant))
    assert client.get("/healthz").json() == {"status": "ok"}
    runs = client.get("/v1/runs").json()
    assert [r["run_id"] for r in runs] == ["run1", "inf"]
    raw = client.get("/v1/runs/run1").json()
    for field in ("accounting", "assumption", "delta", "accountant", "epsilon_curve", "rules"):
        assert field in raw
    view = RunStatusView.model_validate(raw)
    assert view == accountant.status("run1")
    assert [(p.seq, p.epsilon) for p in view.epsilon_curve] == [(0, _gauss_eps(1)), (1, _gauss_eps(2))]
    infinite = client.get("/v1/runs/inf").json()
    assert infinite["epsilon_budget"] == "Infinity" and infinite["epsilon_spent"] == "Infinity"
    ledger = LedgerView.model_validate_json(client.get("/v1/runs/run1/ledger").content)
    assert len(ledger.rows) == 3 and replay(ledger.run, ledger.rows).epsilon == view.epsilon_spent
    missing = client.get("/v1/runs/nope")
    assert missing.status_code == 404 and "unknown run id" in missing.json()["detail"]
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/healthz", "/v1/runs", "/v1/runs/{run_id}", "/v1/runs/{run_id}/ledger"} <= set(paths)
    # REST only reads: nothing there can create or charge
    assert all(set(methods) == {"get"} for methods in paths.values())


# shared/design/privacy.md, "Why it matters": 150,000 training nodes, batch 256, 5 epochs,
# L = 1, D = 10, δ = 1e-6; z needed per target ε (hidden-batch, visible-batch with N_e = 2)
CONTRACT_TABLE = {1: ("1.20", "13.4"), 4: ("0.69", "3.77"), 8: ("0.56", "2.06"), 16: ("0.46", "1.17")}


@pytest.mark.parametrize("target", sorted(CONTRACT_TABLE))
def test_the_two_modes_reproduce_the_contract_table(accountant: Accountant, target: int) -> None:
    from vesper.common.privacy.accounting import calibrate
    from vesper.common.privacy.hidden_batch_reproduction import theorem21_gamma

    hidden_printed, visible_printed = CONTRACT_TABLE[target]
    steps = math.ceil(150_000 / 256)
    passes = [PlannedPass(kind="train", releases=steps)] * 5
    gamma = theorem21_gamma(150_000, 256, 10, 1)

    visible = [PlanRule(kind="train", participation_bound=2)]
    z, result, _, counted = accountant.calibrate_gaussian(passes, visible, target, 1e-6, "visible-batch", "pld")
    assert counted == 10 and result.epsilon <= target
    assert f"{z:.{len(visible_printed.split('.')[1])}f}" == visible_printed

    hidden = [PlanRule(kind="train", participation_bound=None, sampling_probability=gamma)]
    z_run, result, _, counted = accountant.calibrate_gaussian(passes, hidden, target, 1e-6, "hidden-batch", "rdp")
    assert counted == 2930 == 5 * steps
    # the table's column is dp-accounting's RDP on the recorded events alone ...
    events = lambda z: dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(gamma, dpa.GaussianDpEvent(z)), counted)  # noqa: E731
    z_events, _ = calibrate(events, target, 1e-6, accountant="rdp")
    assert f"{z_events:.2f}" == hidden_printed
    # ... and the run is charged the larger of that and bound (6), so it needs at least as much noise
    assert z_run >= z_events * (1 - 1e-6)
    assert result.epsilon <= target and result.epsilon_bound6 <= target and result.epsilon_events <= target
