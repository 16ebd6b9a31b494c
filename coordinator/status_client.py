"""Read budgets from the accountant: its REST status, or a ledger file directly.

Both sources give the same views; ``verify`` recomputes ε from the ledger alone.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from vesper.accountant.budget import Accountant, AccountantError
from vesper.accountant.ledger_store import LedgerStore
from vesper.common.privacy.ledger import LedgerView, ReplayResult, RunStatusView, replay


class StatusError(RuntimeError):
    """The status could not be read."""


class LedgerFile:
    """A ledger file read in place, through the same code the REST endpoint uses."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.accountant = Accountant(LedgerStore(path))

    def __str__(self) -> str:
        return str(self.path)


Source = str | LedgerFile


def _get(url: str) -> httpx.Response:
    try:
        response = httpx.get(url, timeout=10)
    except httpx.HTTPError as exc:
        raise StatusError(f"cannot read {url}: {exc}") from None
    if response.status_code == 404:
        raise StatusError(response.json().get("detail", f"not found: {url}"))
    if response.status_code != 200:
        raise StatusError(f"{url} answered {response.status_code}: {response.text[:200]}")
    return response


def _local(call):
    try:
        return call()
    except AccountantError as exc:
        raise StatusError(str(exc)) from None


def list_runs(source: Source) -> list[RunStatusView]:
    if isinstance(source, LedgerFile):
        return source.accountant.list_runs()
    return [RunStatusView.model_validate(item) for item in _get(f"{source.rstrip('/')}/v1/runs").json()]


def run_status(source: Source, run_id: str) -> RunStatusView:
    if isinstance(source, LedgerFile):
        return _local(lambda: source.accountant.status(run_id))
    return RunStatusView.model_validate_json(_get(f"{source.rstrip('/')}/v1/runs/{run_id}").content)


def ledger(source: Source, run_id: str) -> LedgerView:
    if isinstance(source, LedgerFile):
        _local(lambda: source.accountant.status(run_id))
        store = source.accountant.store
        return LedgerView(run=store.get_run(run_id), rows=store.charges(run_id))
    return LedgerView.model_validate_json(_get(f"{source.rstrip('/')}/v1/runs/{run_id}/ledger").content)


def verify(source: Source, run_id: str) -> ReplayResult:
    """ε recomputed here from the ledger alone, with the rule checked row by row."""
    view = ledger(source, run_id)
    return replay(view.run, view.rows)
