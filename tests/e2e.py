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
    """B's receipt log's entries of ``run_id``; a last line B is still writing (no newline yet) is
    not one yet."""
    if not path.exists():
        return []
    text = path.read_text()
    complete = text[: text.rfind("\n") + 1]
    return [entry for entry in map(json.loads, complete.splitlines()) if entry["run_id"] == run_id]


def ledger(status_url: str, run_id: str) -> dict:
    response = httpx.get(f"{status_url}/v1/runs/{run_id}/ledger", timeout=10)
    response.raise_for_status()
    return response.json()


# flags that turn the edge-free path's own stage off: an extractor released once would train it up
# to 49 epochs before a short test run (the stage itself: test_e2e_gap)
NO_PATH_STAGE = ("--edge-free-path-epochs", "0")


def fast_run(*extra: str) -> list[str]:
    """Flags for a short Cora run of PMP-GCN (per-step releases, a charge every step), unless
    ``extra`` names another extractor (the last --extractor wins). The edge-free path's own
    stage is off (NO_PATH_STAGE), unless ``extra`` sets it (the last wins)."""
    return ["--dataset", "cora", "--extractor", "pmp-gcn", "--epochs", "2", "--batch-size", "256", *NO_PATH_STAGE, *extra]
