"""Each service's disk failing during training (issue #24): the run is interrupted with a reason,
every charged release was recorded by both parties once the run is resumed, and the resumed run's
ledger equals an uninterrupted run's. A disk is made to fail by making a file the service appends
to unwritable (``chattr +i``, which holds even for root); where that cannot be made, the test
is skipped with the reason. Party A's own case runs in the default suite
(test_reliability_e2e.py); this module is slow (CI's `make test-slow`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from e2e import receipts
from fault_drill import DRILL_RUN, DRILL_SETTINGS, QUIET, drill_cluster, ledger_rows, uninterrupted
from test_reliability_e2e import Background

from vesper.coordinator.run_client import drive_run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _chattr(path: Path, flag: str) -> bool:
    return shutil.which("chattr") is not None and subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("disk-faults")
    with drill_cluster(workdir) as running:
        reference = uninterrupted(running)
        assert reference.status == "completed", reference.message
        yield running, reference


def _failing_file(cluster, victim: str, run_id: str) -> Path:
    if victim == "party-a":
        return cluster.workdir / "party_a" / "runs" / run_id / "releases.jsonl"
    if victim == "party-b":
        return Path(cluster.extra_b["receipt_log"])
    return Path(f"{cluster.ledger}-wal")  # the accountant's ledger takes every write in its log first


@pytest.mark.parametrize(("victim", "reason"), [
    ("party-a", "party A cannot write its run files"),
    ("party-b", "party B cannot record the release it received"),
    ("accountant", "the accountant cannot write its ledger"),
])
def test_a_failing_disk_interrupts_the_run_and_a_resume_completes_it_as_if_nothing_happened(cluster, victim, reason) -> None:
    running, reference = cluster
    first = Background(running, DRILL_RUN)
    first.wait_for_steps(running, 7)
    failing = _failing_file(running, victim, first.run_id)
    if not _chattr(failing, "+i"):
        first.join()
        pytest.skip(f"{failing} cannot be made unwritable here (chattr +i failed: not root, or no ext4/xfs)")
    try:
        first.join(timeout=DRILL_SETTINGS["peer_retry_s"] + 120)
    finally:
        _chattr(failing, "-i")
    summary = first.summary
    assert summary is not None and summary.status == "interrupted", (first.error, summary)
    assert reason in summary.message and f"vesper train --resume {first.run_id}" in summary.message, summary.message
    final = drive_run(running.party_a_address, None, QUIET, resume_run_id=first.run_id)
    assert final.status == "completed", final.message
    charged = ledger_rows(running.status_url, first.run_id)
    assert charged == ledger_rows(running.status_url, reference.run_id)
    # every charged release was recorded by both parties: A's journal before sending, B's receipt log on receipt
    journal = {json.loads(line)["key"] for line in _failing_file(running, "party-a", first.run_id).read_text().splitlines()}
    received = {e["step"] for e in receipts(Path(running.extra_b["receipt_log"]), first.run_id) if e["kind"] == "train"}
    train_keys = [row[1] for row in charged if row[3] == "train"]
    assert set(train_keys) <= journal and len(received) == len(train_keys) == reference.steps
    status = httpx.get(f"{running.status_url}/v1/runs/{first.run_id}", timeout=10).json()
    assert status["status"] == "completed" and status["epsilon_spent"] == reference.epsilon_spent
