"""The fault drill of docs/faults.md, as code: a run, one service killed (SIGKILL) mid-run
and started again on the same addresses, the run resumed, and its ledger compared with
the ledger of the same run never interrupted."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from e2e import ledger, receipts
from rich.console import Console

from vesper.common.config import RunConfig, RunSummary
from vesper.common.privacy.ledger import LedgerRow, RunRecord, replay
from vesper.coordinator.processes import LocalCluster
from vesper.coordinator.run_client import RunClientError, drive_run

QUIET = Console(file=io.StringIO())
# PMP-GCN (per-step releases: a charge every step): 1354 Cora training nodes in batches of 64, 22 steps
# in the one epoch, a checkpoint every 5 steps
DRILL_RUN = {"dataset": "cora", "extractor": {"name": "pmp-gcn"}, "epochs": 1, "batch_size": 64, "privacy": {"epsilon": 8}}
DRILL_SETTINGS = {"secret_seed": 5, "checkpoint_every": 5, "peer_retry_s": 30.0, "step_timeout_s": 30.0}


@dataclass
class DrillOutcome:
    first: RunSummary | None  # what the interrupted attempt reported (None: party A itself was killed)
    first_error: str
    run_id: str
    final: RunSummary  # after resuming (or the first attempt, if it carried on by itself)


def drill_cluster(workdir: Path) -> LocalCluster:
    return LocalCluster(workdir, party_a=dict(DRILL_SETTINGS), party_b={"receipt_log": str(workdir / "receipts.jsonl")})


def uninterrupted(cluster: LocalCluster) -> RunSummary:
    return drive_run(cluster.party_a_address, RunConfig.model_validate(DRILL_RUN), QUIET)


def kill_mid_run(
    cluster: LocalCluster, victim: str, after_steps: int = 13, down_s: float = 0.0,
    before_resume: Callable[[str], None] | None = None,
) -> DrillOutcome:
    """Start the drill run, SIGKILL ``victim`` once B has received ``after_steps`` steps of it,
    start the victim again ``down_s`` later, and resume the run if it did not carry on by itself
    (calling ``before_resume(run_id)`` first)."""
    log = Path(cluster.extra_b["receipt_log"])
    before = len(log.read_text().splitlines()) if log.exists() else 0
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["summary"] = drive_run(cluster.party_a_address, RunConfig.model_validate(DRILL_RUN), QUIET)
        except RunClientError as exc:
            outcome["error"] = str(exc)

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < before + after_steps):
        time.sleep(0.01)
    cluster.services[victim].kill()
    time.sleep(down_s)
    cluster.restart(victim)
    runner.join(timeout=180)
    first = outcome.get("summary")
    error = outcome.get("error", "")
    run_id = first.run_id if first else error.split("during run ")[1].split()[0]
    final = first
    if first is None or first.status != "completed":
        if before_resume is not None:
            before_resume(run_id)
        final = drive_run(cluster.party_a_address, None, QUIET, resume_run_id=run_id)
    return DrillOutcome(first, error, run_id, final)


def ledger_rows(status_url: str, run_id: str) -> list[tuple]:
    """A run's ledger, step for step, without what names the run or the time."""
    view = ledger(status_url, run_id)
    result = replay(RunRecord.model_validate(view["run"]), [LedgerRow.model_validate(r) for r in view["rows"]])
    assert result.consistent, result.problems
    return [
        (r["seq"], r["release_key"], r["pass_id"], r["kind"], r["num_nodes"], r["nodes_digest"], r["counted"],
         r["epsilon_after"], r["release_event"])
        for r in view["rows"]
    ]


def received_steps(cluster: LocalCluster, run_id: str) -> list[int]:
    return [entry["step"] for entry in receipts(Path(cluster.extra_b["receipt_log"]), run_id) if entry["kind"] == "train"]


def received_digests(cluster: LocalCluster, run_id: str) -> dict[int, set[str]]:
    """Per training step of the run, the SHA-256 of each release B received for it (B's receipt log)."""
    digests: dict[int, set[str]] = {}
    for entry in receipts(Path(cluster.extra_b["receipt_log"]), run_id):
        if entry["kind"] == "train":
            digests.setdefault(entry["step"], set()).add(entry["sha256"])
    return digests
