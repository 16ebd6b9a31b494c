"""The accountant's rules and its REST status, in process over a real SQLite ledger."""

import math

import dp_accounting as dpa
import pytest
from fastapi.testclient import TestClient

from vesper.accountant.budget import Accountant, AccountantError
from vesper.accountant.ledger_store import LedgerStore
from vesper.accountant.rest import create_app
from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import (
    LedgerView,
    RunStatusView,
    composed_event,
    replay,
)

GAUSS = event_to_json(dpa.GaussianDpEvent(2.0))


@pytest.fixture
def accountant(tmp_path) -> Accountant:
    return Accountant(LedgerStore(tmp_path / "ledger.sqlite"))


def _create(accountant: Accountant, run_id: str = "run1", budget: float = 8.0, bound: int | None = 2, event: str = GAUSS):
    return accountant.create_run(run_id, "edge", "visible-batch", budget, 1e-5, event, bound, "pmp-gin", {"k": 1})


def _error(call) -> AccountantError:
    with pytest.raises(AccountantError) as info:
        call()
    return info.value


def test_charges_follow_the_participation_rule(accountant: Accountant) -> None:
    _create(accountant)
    counted = [accountant.charge("run1", seq, f"train-{seq // 3}", "train", 4, GAUSS).counted for seq in range(6)]
    assert counted == [True, True, False, True, True, False]
    view = accountant.status("run1")
    assert view.charges == 6 and view.counted_charges == 4
    assert view.epsilon_spent == epsilon_of(composed_event(dpa.GaussianDpEvent(2.0), 4), 1e-5).epsilon
    assert view.assumption.startswith("visible-batch: party B sees every batch's node ids")


def test_a_charge_past_the_budget_is_refused_and_not_recorded(accountant: Accountant) -> None:
    one = epsilon_of(dpa.GaussianDpEvent(2.0), 1e-5).epsilon
    two = epsilon_of(composed_event(dpa.GaussianDpEvent(2.0), 2), 1e-5).epsilon
    _create(accountant, budget=(one + two) / 2, bound=None)
    accountant.charge("run1", 0, "train-0", "train", 4, GAUSS)
    error = _error(lambda: accountant.charge("run1", 1, "train-0", "train", 4, GAUSS))
    assert error.code == "RESOURCE_EXHAUSTED" and "budget exhausted" in str(error)
    assert len(accountant.store.charges("run1")) == 1
    assert accountant.status("run1").epsilon_spent == one


def test_a_budget_too_small_for_one_release(accountant: Accountant) -> None:
    _create(accountant, budget=0.01, bound=None)
    assert _error(lambda: accountant.charge("run1", 0, "train-0", "train", 4, GAUSS)).code == "RESOURCE_EXHAUSTED"
    assert accountant.store.charges("run1") == []


@pytest.mark.parametrize(
    "seq, event, kind, code, fragment",
    [
        (1, GAUSS, "train", "ALREADY_EXISTS", "is a replay"),
        (3, GAUSS, "train", "FAILED_PRECONDITION", "skips ahead"),
        (2, event_to_json(dpa.GaussianDpEvent(1.0)), "train", "INVALID_ARGUMENT", "differs from the one declared"),
        (2, "{bad json", "train", "INVALID_ARGUMENT", "bad release event"),
        (2, GAUSS, "other", "INVALID_ARGUMENT", "kind must be train or eval"),
    ],
)
def test_bad_charges_leave_the_ledger_intact(accountant: Accountant, seq, event, kind, code, fragment) -> None:
    _create(accountant)
    for i in range(2):
        accountant.charge("run1", i, "train-0", "train", 4, GAUSS)
    before = accountant.store.charges("run1")
    error = _error(lambda: accountant.charge("run1", seq, "train-0", kind, 4, event))
    assert error.code == code and fragment in str(error)
    assert accountant.store.charges("run1") == before


def test_unknown_runs_and_closed_runs(accountant: Accountant) -> None:
    assert _error(lambda: accountant.charge("nope", 0, "p", "train", 1, GAUSS)).code == "NOT_FOUND"
    _create(accountant)
    accountant.close_run("run1", "completed", "done")
    assert _error(lambda: accountant.charge("run1", 0, "p", "train", 1, GAUSS)).code == "FAILED_PRECONDITION"
    assert _error(lambda: _create(accountant)).code == "ALREADY_EXISTS"


def test_mode_budget_and_event_are_validated_at_creation(accountant: Accountant) -> None:
    assert "unknown accounting mode" in str(_error(lambda: accountant.create_run("r", "edge", "hidden", 1.0, 1e-5, GAUSS, 2, "x", {})))
    assert "epsilon budget must be > 0" in str(_error(lambda: accountant.create_run("r", "edge", "visible-batch", 0.0, 1e-5, GAUSS, 2, "x", {})))
    assert "delta must be in (0, 1)" in str(_error(lambda: accountant.create_run("r", "edge", "visible-batch", 1.0, 1.0, GAUSS, 2, "x", {})))
    assert "bad release event" in str(_error(lambda: accountant.create_run("r", "edge", "visible-batch", 1.0, 1e-5, "{}", 2, "x", {})))


def test_state_survives_a_restart(tmp_path) -> None:
    path = tmp_path / "ledger.sqlite"
    first = Accountant(LedgerStore(path))
    _create(first)
    for seq in range(5):
        first.charge("run1", seq, f"train-{seq // 2}", "train", 4, GAUSS)
    before = first.status("run1")
    first.store.close()
    second = Accountant(LedgerStore(path))
    assert second.status("run1") == before
    second.charge("run1", 5, "train-2", "train", 4, GAUSS)  # the rule continues where it stopped
    assert second.status("run1").counted_charges == before.counted_charges + 1


def test_infinite_budget_and_non_private_releases(accountant: Accountant) -> None:
    _create(accountant, budget=math.inf, event=event_to_json(dpa.NonPrivateDpEvent()))
    receipt = accountant.charge("run1", 0, "train-0", "train", 3, event_to_json(dpa.NonPrivateDpEvent()))
    assert math.isinf(receipt.epsilon_after)


def test_calibration_refuses_an_empty_plan(accountant: Accountant) -> None:
    assert "counts no release" in str(_error(lambda: accountant.calibrate_gaussian([5, 5], 0, 4.0, 1e-5)))
    z, result, counted = accountant.calibrate_gaussian([6, 6, 1], 2, 4.0, 1e-5)
    assert counted == 5 and result.epsilon <= 4.0


def test_rest_status_ledger_and_openapi(accountant: Accountant) -> None:
    _create(accountant)
    _create(accountant, run_id="inf", budget=math.inf, event=event_to_json(dpa.NonPrivateDpEvent()))
    accountant.charge("inf", 0, "train-0", "train", 3, event_to_json(dpa.NonPrivateDpEvent()))
    for seq in range(3):
        accountant.charge("run1", seq, "train-0", "train", 4, GAUSS)
    client = TestClient(create_app(accountant))
    assert client.get("/healthz").json() == {"status": "ok"}
    runs = client.get("/v1/runs").json()
    assert [r["run_id"] for r in runs] == ["run1", "inf"]
    view = RunStatusView.model_validate_json(client.get("/v1/runs/run1").content)
    assert view == accountant.status("run1")
    infinite = client.get("/v1/runs/inf").json()
    assert infinite["epsilon_budget"] == "Infinity" and infinite["epsilon_spent"] == "Infinity"
    ledger = LedgerView.model_validate_json(client.get("/v1/runs/run1/ledger").content)
    assert len(ledger.rows) == 3 and replay(ledger.run, ledger.rows).epsilon == view.epsilon_spent
    missing = client.get("/v1/runs/nope")
    assert missing.status_code == 404 and "unknown run id" in missing.json()["detail"]
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/healthz", "/v1/runs", "/v1/runs/{run_id}", "/v1/runs/{run_id}/ledger"} <= set(paths)
