"""Read budgets from the accountant: its REST status, or a ledger file directly.

Both sources give the same views; ``verify`` recomputes ε from the ledger alone.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from vesper.accountant.budget import Accountant, AccountantError
from vesper.accountant.ledger_store import LedgerFileError, LedgerStore
from vesper.common.config import describe_validation_error
from vesper.common.privacy.ledger import LedgerView, ReplayResult, RunStatusView, replay

T = TypeVar("T", bound=BaseModel)


class StatusError(RuntimeError):
    """The status could not be read."""


class LedgerFile:
    """A ledger file read in place, through the same code the REST endpoint uses, read-only:
    auditing a ledger never writes a byte of it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.accountant = Accountant(LedgerStore(path, read_only=True, setting="--ledger"))
        except LedgerFileError as exc:
            raise StatusError(str(exc)) from None

    def __str__(self) -> str:
        return str(self.path)


@dataclass(frozen=True)
class StatusEndpoint:
    """The accountant's REST status. An https URL is verified against ``ca_file`` (the
    deployment's CA, ``ca.pem`` of ``vesper certs``) when given, else the system's trust
    store; reading needs no client certificate."""

    url: str
    ca_file: Path | None = None

    def __str__(self) -> str:
        return self.url

    def verify(self) -> ssl.SSLContext | bool:
        if self.ca_file is None:
            return True
        try:
            return ssl.create_default_context(cafile=str(self.ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise StatusError(f"cannot use {self.ca_file} as the CA certificate of {self.url}: {exc}") from None


Source = str | StatusEndpoint | LedgerFile


def _get(source: str | StatusEndpoint, path: str) -> httpx.Response:
    endpoint = source if isinstance(source, StatusEndpoint) else StatusEndpoint(source)
    url = f"{endpoint.url.rstrip('/')}{path}"
    try:
        response = httpx.get(url, timeout=10, verify=endpoint.verify())
    except httpx.HTTPError as exc:
        hint = ""
        if "CERTIFICATE_VERIFY_FAILED" in str(exc) and endpoint.ca_file is None:
            hint = " (a deployment's own CA: give its ca.pem with --ca, or set coordinator.tls.ca_file)"
        raise StatusError(f"cannot read {url}: {exc}{hint}") from None
    if response.status_code == 404:
        raise StatusError(response.json().get("detail", f"not found: {url}"))
    if response.status_code != 200:
        raise StatusError(f"{url} answered {response.status_code}: {response.text[:200]}")
    return response


def _read(model: type[T], data: bytes | str, source: object) -> T:
    """The accountant's answer as ``model``; a record of a newer format (or a malformed one) is a
    StatusError that says what to do, never a validation dump."""
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        problems = describe_validation_error(exc).replace("\n", "; ")
        raise StatusError(f"cannot read the accountant's answer from {source}: {problems}") from None


def _local(call):
    try:
        return call()
    except AccountantError as exc:
        raise StatusError(str(exc)) from None


def list_runs(source: Source) -> list[RunStatusView]:
    if isinstance(source, LedgerFile):
        return source.accountant.list_runs()
    return [_read(RunStatusView, json.dumps(item), source) for item in _get(source, "/v1/runs").json()]


def run_status(source: Source, run_id: str) -> RunStatusView:
    if isinstance(source, LedgerFile):
        return _local(lambda: source.accountant.status(run_id))
    return _read(RunStatusView, _get(source, f"/v1/runs/{run_id}").content, source)


def ledger(source: Source, run_id: str) -> LedgerView:
    if isinstance(source, LedgerFile):
        _local(lambda: source.accountant.status(run_id))
        store = source.accountant.store
        return LedgerView(run=store.get_run(run_id), rows=store.charges(run_id))
    return _read(LedgerView, _get(source, f"/v1/runs/{run_id}/ledger").content, source)


def verify(source: Source, run_id: str) -> ReplayResult:
    """ε recomputed here from the ledger alone, with the rule checked row by row."""
    view = ledger(source, run_id)
    return replay(view.run, view.rows)
