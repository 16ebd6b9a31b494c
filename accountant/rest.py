"""The accountant's REST status: anyone can read any run's budget and ledger.

``GET /healthz``, ``GET /v1/runs``, ``GET /v1/runs/{id}``, ``GET /v1/runs/{id}/ledger``,
``GET /v1/runs/{id}/related`` (a run and party B's label ledger of it, ``<id>.labels``,
whichever of the two ids is given); OpenAPI at ``/openapi.json``. Infinite values are
written as the string "Infinity". The budget dashboard (HTML, ``/`` and ``/runs/{id}``,
accountant/dashboard.py) is served by the same app, outside the OpenAPI document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from vesper.accountant.budget import Accountant, AccountantError
from vesper.accountant.dashboard import add_dashboard
from vesper.common.privacy.ledger import LedgerView, RunStatusView, label_ledger_id, main_run_id


class NotFound(BaseModel):
    detail: str


NO_SUCH_RUN: dict[int | str, dict[str, Any]] = {404: {"model": NotFound, "description": "no such run"}}


def _numbers_may_be_infinite(node: object) -> None:
    """The models write infinite values as the string "Infinity" (ser_json_inf_nan="strings"): say so."""
    if isinstance(node, dict):
        if node.get("type") == "number":
            del node["type"]
            node["anyOf"] = [{"type": "number"}, {"type": "string", "enum": ["Infinity", "-Infinity", "NaN"]}]
            return
        for value in node.values():
            _numbers_may_be_infinite(value)
    elif isinstance(node, list):
        for value in node:
            _numbers_may_be_infinite(value)


def create_app(accountant: Accountant) -> FastAPI:
    app = FastAPI(
        title="vesper accountant",
        version="1",
        description="Privacy budgets of vesper runs (party A's edge and node ledgers, party B's label "
        "ledgers, which are never added together), and the ledger each ε is computed from.",
    )

    def view(run_id: str) -> RunStatusView:
        try:
            return accountant.status(run_id)
        except AccountantError as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/runs", response_model=list[RunStatusView])
    def list_runs() -> list[RunStatusView]:
        return accountant.list_runs()

    @app.get("/v1/runs/{run_id}", response_model=RunStatusView, responses=NO_SUCH_RUN)
    def get_run(run_id: str) -> RunStatusView:
        return view(run_id)

    @app.get("/v1/runs/{run_id}/ledger", response_model=LedgerView, responses=NO_SUCH_RUN)
    def get_ledger(run_id: str) -> LedgerView:
        view(run_id)
        record = accountant.store.get_run(run_id)
        return LedgerView(run=record, rows=accountant.store.charges(run_id))

    @app.get("/v1/runs/{run_id}/related", response_model=list[RunStatusView], responses=NO_SUCH_RUN)
    def get_related(run_id: str) -> list[RunStatusView]:
        """Party A's run and party B's label ledger of it: two ledgers, two budgets, never summed."""
        views = []
        for candidate in (main_run_id(run_id), label_ledger_id(main_run_id(run_id))):
            try:
                views.append(accountant.status(candidate))
            except AccountantError:
                continue
        if not views:
            raise HTTPException(status_code=404, detail=f"no run {main_run_id(run_id)!r} and no label ledger of it")
        return views

    add_dashboard(app, accountant)
    document = app.openapi()
    _numbers_may_be_infinite(document.get("components", {}))
    app.openapi_schema = document
    return app
