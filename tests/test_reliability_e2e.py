"""Defects of issue #24 that need the three services: one trainer per run, a disk failing under a
run (party A's here; B's and the accountant's in the slow fault-injection test), party B unable
to record a run, party A vanishing under `vesper train`, runs refused at set-up, bad data, and
the MLP baseline under hidden-batch."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e import receipts, vesper
from fault_drill import DRILL_RUN, QUIET, drill_cluster, ledger_rows, uninterrupted

from vesper.common.accountant_client import AccountantClient, LeaseRefused
from vesper.common.charge_token import read_token
from vesper.common.config import RunConfig, RunSummary
from vesper.coordinator.processes import LocalCluster
from vesper.coordinator.run_client import RunClientError, drive_run

pytestmark = pytest.mark.e2e
LONG_RUN = {**DRILL_RUN, "batch_size": 16}  # 85 steps: long enough to act while it trains


def _chattr(path: Path, flag: str) -> bool:
    return shutil.which("chattr") is not None and subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def _unwritable(path: Path) -> None:
    if not _chattr(path, "+i"):
        pytest.skip(f"{path} cannot be made unwritable here (chattr +i failed: not root, or no ext4/xfs)")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reliability")
    with drill_cluster(workdir) as running:
        reference = uninterrupted(running)
        assert reference.status == "completed", reference.message
        yield running, reference


class Background:
    """A run driven in a thread; its id as soon as party A names it."""

    def __init__(self, cluster: LocalCluster, run: dict | None = None, resume: str | None = None) -> None:
        self.run_id = resume or ""
        self.summary: RunSummary | None = None
        self.error = ""
        self._named = threading.Event()
        config = None if resume else RunConfig.model_validate(run or LONG_RUN)

        def progress(p) -> None:
            if p.run_id:
                self.run_id = p.run_id
                self._named.set()

        def drive() -> None:
            try:
                self.summary = drive_run(cluster.party_a_address, config, QUIET, resume_run_id=resume, on_progress=progress)
            except RunClientError as exc:
                self.error = str(exc)
            self._named.set()

        self.thread = threading.Thread(target=drive)
        self.thread.start()

    def wait_for_steps(self, cluster: LocalCluster, steps: int, timeout: float = 120) -> None:
        assert self._named.wait(timeout), "party A never named the run"
        log = Path(cluster.extra_b["receipt_log"])
        deadline = time.monotonic() + timeout
        while len([e for e in receipts(log, self.run_id) if e["kind"] == "train"]) < steps:
            assert time.monotonic() < deadline and self.thread.is_alive(), (self.error, self.summary)
            time.sleep(0.02)

    def join(self, timeout: float = 300) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive()


def _journal(cluster: LocalCluster, run_id: str) -> Path:
    return cluster.workdir / "party_a" / "runs" / run_id / "releases.jsonl"


def _no_release_twice(cluster: LocalCluster, run_id: str) -> None:
    keys = [json.loads(line)["key"] for line in _journal(cluster, run_id).read_text().splitlines()]
    assert len(keys) == len(set(keys)), Counter(keys).most_common(3)
    steps = [e["step"] for e in receipts(Path(cluster.extra_b["receipt_log"]), run_id) if e["kind"] == "train"]
    assert len(steps) == len(set(steps)), Counter(steps).most_common(3)


# -- 1. a run has one trainer ------------------------------------------------------------------------
@pytest.mark.slow  # a drill (15-45 s): make test-slow
def test_a_resume_of_a_run_that_still_trains_is_refused(cluster) -> None:
    running, _ = cluster
    first = Background(running)
    first.wait_for_steps(running, 5)
    with pytest.raises(RunClientError, match=r"FAILED_PRECONDITION: run \w+ is training in this party A"):
        drive_run(running.party_a_address, None, QUIET, resume_run_id=first.run_id)
    # a trainer in another party A process (its own lease) is refused by the accountant
    token = read_token(running.charge_token_file)
    other = AccountantClient(running.accountant_address, token, charge_retries=0)
    other.hold("another-process", 15.0)
    with pytest.raises(LeaseRefused, match="live trainer"):
        other.reopen_run(first.run_id, "a second trainer")
    with pytest.raises(LeaseRefused, match="live trainer"):
        other.charge(first.run_id, "train-0/999", "train-0", "train", 1, "d", "{}")
    other.close()
    first.join()
    assert first.summary is not None and first.summary.status == "completed", (first.error, first.summary)
    _no_release_twice(running, first.run_id)


# -- 2. two resumes of one interrupted run at once: exactly one proceeds ---------------------------------
@pytest.mark.slow  # a drill (15-45 s): make test-slow
def test_of_two_resumes_at_once_one_proceeds_and_the_other_changes_nothing(cluster) -> None:
    running, reference = cluster
    first = Background(running, DRILL_RUN)
    first.wait_for_steps(running, 8)
    running.services["party-b"].kill()
    first.join()
    assert first.summary is not None and first.summary.status == "interrupted", (first.error, first.summary)
    running.restart("party-b")
    run_id = first.run_id
    resumes = [Background(running, resume=run_id) for _ in range(2)]
    for resume in resumes:
        resume.join()
    outcomes = sorted((r.summary.status if r.summary else "refused: " + r.error) for r in resumes)
    assert outcomes[0] == "completed" and outcomes[1].startswith("refused: "), outcomes
    assert "one trainer" in outcomes[1]
    status = httpx.get(f"{running.status_url}/v1/runs/{run_id}", timeout=10).json()
    assert status["status"] == "completed"
    assert ledger_rows(running.status_url, run_id) == ledger_rows(running.status_url, reference.run_id)
    summary = json.loads((running.workdir / "party_a" / "runs" / run_id / "summary.json").read_text())
    assert summary["status"] == "completed"


# -- 3. party A's disk failing mid-run is an interruption, resumable once fixed ---------------------------
@pytest.mark.slow  # a drill (15-45 s): make test-slow
def test_an_unwritable_run_directory_interrupts_the_run_and_it_resumes_once_fixed(cluster) -> None:
    running, reference = cluster
    first = Background(running, DRILL_RUN)
    first.wait_for_steps(running, 6)
    journal = _journal(running, first.run_id)
    _unwritable(journal)
    try:
        first.join()
    finally:
        _chattr(journal, "-i")
    summary = first.summary
    assert summary is not None and summary.status == "interrupted", (first.error, summary)
    assert "party A cannot write its run files" in summary.message and "releases.jsonl" in summary.message
    assert f"vesper train --resume {first.run_id}" in summary.message
    status = httpx.get(f"{running.status_url}/v1/runs/{first.run_id}", timeout=10).json()
    assert status["status"] == "interrupted" and "cannot write" in status["closed_reason"]
    final = drive_run(running.party_a_address, None, QUIET, resume_run_id=first.run_id)
    assert final.status == "completed", final.message
    assert ledger_rows(running.status_url, first.run_id) == ledger_rows(running.status_url, reference.run_id)


# -- 4. party B checks it can record a run before it acknowledges it ----------------------------------------
def test_a_run_party_b_cannot_record_is_refused_before_anything_is_charged(cluster) -> None:
    running, _ = cluster
    runs = running.workdir / "party_b" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    _unwritable(runs)
    try:
        code, output = vesper("train", "--party-a", running.party_a_address, "--dataset", "cora", "--epochs", "1")
    finally:
        _chattr(runs, "-i")
    assert code == 1 and "party B cannot record run" in output and "party_b.workdir" in output, output
    run_id = output.split("run ")[-1].split()[0] if "run " in output else ""
    # the run never reached the accountant: nothing was charged, and no status URL is shown (9)
    assert "no record at the accountant" in output and "/v1/runs/" not in output, output
    listed = {r["run_id"] for r in httpx.get(f"{running.status_url}/v1/runs", timeout=10).json()}
    assert all(not rid.startswith(run_id) for rid in listed) if run_id else True


# -- 8. party A vanishing under `vesper train` means: interrupted (exit 4) -----------------------------------
@pytest.mark.slow  # a drill (15-45 s): make test-slow
def test_a_killed_party_a_makes_vesper_train_exit_4(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", party_b={"receipt_log": str(tmp_path / "receipts.jsonl")}) as running:
        train = subprocess.Popen(
            [sys.executable, "-m", "vesper.coordinator", "train", "--party-a", running.party_a_address, "--dataset",
             "cora", "--epochs", "2", "--batch-size", "16"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "COLUMNS": "200"},
        )
        log = tmp_path / "receipts.jsonl"
        deadline = time.monotonic() + 120
        while (not log.exists() or len(log.read_text().splitlines()) < 5) and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(running.services["party-a"].process.pid, signal.SIGKILL)
        output, _ = train.communicate(timeout=120)
    assert train.returncode == 4, output
    assert "interrupted" in output and "vesper train --resume" in output, output


# -- 10. bad data is a FAILED_PRECONDITION naming the file, not NOT_FOUND --------------------------------------
def test_unusable_labels_are_refused_with_a_precondition_naming_the_problem(tmp_path: Path) -> None:
    data = tmp_path / "nan-labels.npz"
    labels = np.zeros(40)
    labels[7] = np.nan
    edges = np.array([[i, i + 1] for i in range(39)])
    np.savez(data, node_features=np.random.default_rng(0).random((40, 4), dtype=np.float32), node_labels=labels, edges=edges)
    with LocalCluster(tmp_path / "cluster", datasets={"bad": str(data)}) as running:
        code, output = vesper("train", "--party-a", running.party_a_address, "--dataset", "bad", "--epochs", "1")
    assert code == 1, output
    flat = " ".join(output.split())
    assert "FAILED_PRECONDITION" in flat and "label at row 7 is nan" in flat and "NOT_FOUND" not in flat, output


# -- 13. the MLP baseline costs nothing under every accounting ----------------------------------------------
def test_the_mlp_baseline_trains_under_hidden_batch(cluster, tmp_path: Path) -> None:
    running, _ = cluster
    out = tmp_path / "mlp.json"
    code, output = vesper(
        "train", "--party-a", running.party_a_address, "--dataset", "cora", "--epochs", "1", "--extractor", "mlp",
        "--accounting", "hidden-batch", "--json-out", str(out),
    )
    summary = json.loads(out.read_text())
    assert code == 0 and summary["status"] == "completed" and summary["epsilon_spent"] == 0, output

