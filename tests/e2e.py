"""Helpers for end-to-end tests: real services as processes, the real CLI in process."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from typer.testing import CliRunner

from vesper.coordinator.cli import app

runner = CliRunner()


def vesper(*args: str) -> tuple[int, str]:
    """Run ``vesper ARGS`` (the coordinator is only a client, so in process is faithful)."""
    result = runner.invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def receipts(path: Path, run_id: str) -> list[dict]:
    if not path.exists():
        return []
    return [entry for entry in map(json.loads, path.read_text().splitlines()) if entry["run_id"] == run_id]


def ledger(status_url: str, run_id: str) -> dict:
    response = httpx.get(f"{status_url}/v1/runs/{run_id}/ledger", timeout=10)
    response.raise_for_status()
    return response.json()


def fast_run(*extra: str) -> list[str]:
    """Flags for a short Cora run."""
    return ["--dataset", "cora", "--epochs", "2", "--batch-size", "256", *extra]
