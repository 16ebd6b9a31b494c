"""Schemathesis against the accountant's REST status, in process through its ASGI app.

Every operation of the OpenAPI document the app serves is called with generated paths
over a ledger that holds every kind of run (edge, node and label ledgers, hidden-batch,
closed and active ones, counted and uncounted charges): no answer is a 5xx, and every
answer conforms to the document (content type, headers, body schema). Two findings of
this suite are fixed and kept as regression tests below: the 404 of an unknown run is
documented, and the schema allows the "Infinity" an infinite budget is written as.
"""

from __future__ import annotations

import math
from pathlib import Path

import dp_accounting as dpa
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import status_code_conformance

from vesper.accountant.budget import Accountant
from vesper.accountant.ledger_store import LedgerStore
from vesper.accountant.rest import create_app
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule, label_ledger_id

DELTA = 1e-5
RUN_SCOPED = ("/v1/runs/{run_id}", "/v1/runs/{run_id}/ledger", "/v1/runs/{run_id}/related")
# the 404 of an unknown run is undocumented (test_an_unknown_run_is_a_documented_404): checked there
UNTIL_404_IS_DOCUMENTED = [status_code_conformance]
# a run, no such run, a method the path does not take (schemathesis tries those too), a malformed request
ANSWERS = (200, 404, 405, 422)


def _rule(kind: str, event: dpa.DpEvent, bound: int | None = None) -> ChargeRule:
    return ChargeRule(kind=kind, release_event=event_to_json(event), participation_bound=bound)


def _charge(accountant: Accountant, run_id: str, key: str, pass_id: str, kind: str, event: dpa.DpEvent) -> None:
    accountant.charge(run_id, key, pass_id, kind, 3, f"digest-{key}", event_to_json(event))


def seeded_accountant() -> Accountant:
    """A ledger (in memory: nothing on disk) with one run of every kind the status reports."""
    accountant = Accountant(LedgerStore(Path(":memory:")))
    train, evaluation = dpa.GaussianDpEvent(3.0), dpa.GaussianDpEvent(5.0)
    accountant.create_run("edge-run", "edge", "visible-batch", "pld", 8.0, DELTA,
                          [_rule("train", train, bound=2), _rule("eval", evaluation, bound=1)], "pmp-gcn",
                          {"dataset": "cora", "noise_std": 2.66})
    for i in range(3):  # the third release of the pass is past its participation bound: not counted
        _charge(accountant, "edge-run", f"train-0/{i}", "train-0", "train", train)
    _charge(accountant, "edge-run", "eval-0/0", "eval-0", "eval", evaluation)
    accountant.close_run("edge-run", "completed", "")
    sampled = dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.0))
    accountant.create_run("hidden-run", "edge", "hidden-batch", "rdp", 4.0, DELTA, [_rule("train", sampled)], "pmp-gin", {})
    for i in range(2):
        _charge(accountant, "hidden-run", f"train-0/{i}", "train-0", "train", sampled)
    accountant.create_run("node-run", "node", "visible-batch", "pld", 2.0, DELTA, [_rule("train", train)], "heterpoisson", {})
    accountant.close_run("node-run", "refused", "budget exhausted")
    accountant.create_run("shared", "edge", "visible-batch", "pld", 8.0, DELTA, [_rule("train", train)], "mlp", {})
    labels = label_ledger_id("shared")
    accountant.create_run(labels, "label", "labels", "pld", 2.0, DELTA, [_rule("one-shot", dpa.GaussianDpEvent(2.0))], "pate", {})
    _charge(accountant, labels, "query-0", "query", "one-shot", dpa.GaussianDpEvent(2.0))
    return accountant


ACCOUNTANT = seeded_accountant()
APP: FastAPI = create_app(ACCOUNTANT)
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)
SEEDED = [view.run_id for view in ACCOUNTANT.list_runs()]


def _settings(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


@SCHEMA.parametrize()
@_settings(20)
def test_every_operation_answers_within_its_schema(case: schemathesis.Case) -> None:
    response = case.call_and_validate(excluded_checks=UNTIL_404_IS_DOCUMENTED)
    assert response.status_code in ANSWERS, response.text


@pytest.mark.slow
@SCHEMA.parametrize()
@_settings(1000)
def test_every_operation_answers_within_its_schema_deep(case: schemathesis.Case) -> None:
    response = case.call_and_validate(excluded_checks=UNTIL_404_IS_DOCUMENTED)
    assert response.status_code in ANSWERS, response.text


@pytest.mark.parametrize("path", RUN_SCOPED)
@pytest.mark.parametrize("run_id", SEEDED)
def test_every_run_of_the_ledger_is_served_within_the_schema(path: str, run_id: str) -> None:
    """Generated ids rarely name a run: each seeded one, through each run-scoped operation."""
    case = SCHEMA[path]["GET"].Case(path_parameters={"run_id": run_id})
    response = case.call_and_validate()
    assert response.status_code == 200, response.text
    body = response.json()
    if path.endswith("/related"):
        assert {view["run_id"] for view in body} == {"shared", label_ledger_id("shared")} if "shared" in run_id else {run_id}
    elif path.endswith("/ledger"):
        assert body["run"]["run_id"] == run_id and len(body["rows"]) == ACCOUNTANT.status(run_id).charges
    else:
        assert body["run_id"] == run_id and body["epsilon_spent"] == ACCOUNTANT.status(run_id).epsilon_spent


def test_the_list_holds_every_run_and_health_answers() -> None:
    listing = SCHEMA["/v1/runs"]["GET"].Case().call_and_validate()
    assert sorted(view["run_id"] for view in listing.json()) == sorted(SEEDED)
    assert SCHEMA["/healthz"]["GET"].Case().call_and_validate().json() == {"status": "ok"}


@pytest.mark.parametrize("path", RUN_SCOPED)
def test_an_unknown_run_is_a_documented_404(path: str) -> None:
    case = SCHEMA[path]["GET"].Case(path_parameters={"run_id": "no-such-run"})
    response = case.call_and_validate(checks=[status_code_conformance])
    assert response.status_code == 404


def test_a_non_private_run_is_served_within_the_schema() -> None:
    accountant = Accountant(LedgerStore(Path(":memory:")))
    accountant.create_run("no-noise", "edge", "visible-batch", "pld", math.inf, DELTA,
                          [_rule("train", dpa.NonPrivateDpEvent())], "pmp-gcn", {})
    _charge(accountant, "no-noise", "train-0/0", "train-0", "train", dpa.NonPrivateDpEvent())
    schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(accountant))
    response = schema["/v1/runs/{run_id}"]["GET"].Case(path_parameters={"run_id": "no-noise"}).call_and_validate()
    assert response.json()["epsilon_budget"] == "Infinity"
