"""Party A with W = 2 worker processes through the real services (issue #25, item 1): the ledger
of a W = 2 run has the rows and ε of the same run with W = 1 (a per-step extractor, and GAP, whose
hops are split over the workers), and a killed worker interrupts the run cleanly (nothing charged
twice) and `vesper train --resume` completes it with that ledger (a per-step run, and GAP's)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_drill import QUIET, ledger_rows, received_steps

from vesper.common.config import RunConfig, RunSummary
from vesper.coordinator.processes import LocalCluster
from vesper.coordinator.run_client import RunClientError, drive_run
from vesper.party_a.workers.group import WORKERS_FILE

pytestmark = pytest.mark.slow

# 1354 Cora training nodes in batches of 128: 11 steps, a checkpoint every 4; dropout and noise on
RUN = RunConfig.model_validate({
    "dataset": "cora", "epochs": 1, "batch_size": 128, "privacy": {"epsilon": 8},
    "extractor": {"name": "pmp-gcn", "dim": 32, "encoder_hidden": 64},
})
SETTINGS = {"secret_seed": 5, "checkpoint_every": 4, "peer_retry_s": 30.0, "step_timeout_s": 30.0}


def cluster(workdir: Path, workers: int) -> LocalCluster:
    return LocalCluster(
        workdir, party_a={**SETTINGS, "workers": workers}, party_b={"receipt_log": str(workdir / "receipts.jsonl")},
    )


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSummary, list[tuple]]:
    with cluster(tmp_path_factory.mktemp("one"), 1) as services:
        summary = drive_run(services.party_a_address, RUN, QUIET)
        return summary, ledger_rows(services.status_url, summary.run_id)


def without_run_names(rows: list[tuple]) -> list[tuple]:
    return [row[:-2] + (round(row[-2], 9), row[-1]) for row in rows]


def test_two_workers_charge_the_ledger_of_one(one_worker, tmp_path: Path) -> None:
    single, single_rows = one_worker
    with cluster(tmp_path, 2) as services:
        summary = drive_run(services.party_a_address, RUN, QUIET)
        rows = ledger_rows(services.status_url, summary.run_id)
    assert single.status == summary.status == "completed", summary.message
    assert len(rows) == len(single_rows) > 11
    assert without_run_names(rows) == without_run_names(single_rows)
    assert summary.epsilon_spent == pytest.approx(single.epsilon_spent, rel=1e-9)
    # the same model to float rounding: the parties' metrics agree
    assert summary.test_metric.value == pytest.approx(single.test_metric.value, abs=0.02)


def kill_the_worker(services: LocalCluster, config: RunConfig, when: Callable[[str], bool]) -> tuple[str, RunSummary]:
    """Start ``config``, SIGKILL its one worker process once ``when(run_id)`` holds (or after
    120 s), and return the run id and what the run reported."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["summary"] = drive_run(services.party_a_address, config, QUIET)
        except RunClientError as exc:
            outcome["error"] = str(exc)

    runner = threading.Thread(target=run)
    runner.start()
    runs = services.workdir / "party_a" / "runs"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(runs.glob(f"*/{WORKERS_FILE}")):
        time.sleep(0.05)
    (pids_file,) = list(runs.glob(f"*/{WORKERS_FILE}"))
    run_id = pids_file.parent.name
    while time.monotonic() < deadline and not when(run_id):
        time.sleep(0.02)
    (pid,) = json.loads(pids_file.read_text())["pids"]
    os.kill(pid, signal.SIGKILL)
    runner.join(timeout=300)
    first = outcome.get("summary")
    assert first is not None, outcome.get("error")
    return run_id, first


def test_a_killed_worker_interrupts_the_run_and_a_resume_completes_it(one_worker, tmp_path: Path) -> None:
    single, single_rows = one_worker
    with cluster(tmp_path, 2) as services:
        run_id, first = kill_the_worker(services, RUN, lambda run_id: len(received_steps(services, run_id)) >= 6)
        assert first.status == "interrupted" and "lost a worker process" in first.message, first.message
        assert "--resume" in first.message
        final = drive_run(services.party_a_address, None, QUIET, resume_run_id=run_id)
        rows = ledger_rows(services.status_url, run_id)
    assert final.status == "completed", final.message
    # every release charged once: the resumed run's ledger is the uninterrupted one-worker run's
    assert without_run_names(rows) == without_run_names(single_rows)
    assert final.epsilon_spent == pytest.approx(single.epsilon_spent, rel=1e-9)


# GAP on Cora: a 2-epoch edge-free encoder stage (no-op rows), then K = 2 hops over all 2708 nodes
# (two one-shot rows, the hops computed by blocks of rows on both ranks), a 1-epoch stage of the
# edge-free path alone (no-op rows, on rank 0), then 1 epoch of free steps
GAP_RUN = RunConfig.model_validate({
    "dataset": "cora", "epochs": 1, "batch_size": 256, "privacy": {"epsilon": 4},
    "extractor": {"name": "gap", "layers": 2, "dim": 32, "encoder_hidden": 64, "params": {"encoder_epochs": 2},
                  "edge_free_path_epochs": 1},
})


@pytest.fixture(scope="module")
def gap_one_worker(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunSummary, list[tuple]]:
    with cluster(tmp_path_factory.mktemp("gap-one"), 1) as services:
        summary = drive_run(services.party_a_address, GAP_RUN, QUIET)
        started = list((services.workdir / "party_a" / "runs").glob(f"*/{WORKERS_FILE}"))
        assert summary.status == "completed", summary.message
        assert started == []  # W = 1 starts no worker
        return summary, ledger_rows(services.status_url, summary.run_id)


def test_gaps_hops_over_two_workers_charge_the_ledger_of_one(gap_one_worker, tmp_path: Path) -> None:
    with cluster(tmp_path, 2) as services:
        double = drive_run(services.party_a_address, GAP_RUN, QUIET)
        rows = ledger_rows(services.status_url, double.run_id)
        started = list((services.workdir / "party_a" / "runs").glob(f"*/{WORKERS_FILE}"))
    assert double.status == "completed", double.message
    assert len(started) == 1  # W = 2 started its worker (for the hops)
    single, single_rows = gap_one_worker
    assert [row[3] for row in rows].count("one-shot") == 2
    assert any(row[2].startswith("edge-free-path-") for row in rows)  # the path's stage ran with W = 2 too
    assert without_run_names(rows) == without_run_names(single_rows)
    assert double.epsilon_spent == pytest.approx(single.epsilon_spent, rel=1e-9) and double.epsilon_spent > 0
    # other noise draws (keyed, not streamed), the same distribution: comparable test scores
    assert double.test_metric.value == pytest.approx(single.test_metric.value, abs=0.1)


@pytest.mark.parametrize("moment", ["before the hops", "after the hops"])
def test_a_worker_killed_in_a_gap_run_charges_nothing_twice(gap_one_worker, moment: str, tmp_path: Path) -> None:
    """SIGKILL GAP's worker as it starts, when the hops begin (before it joins the group): rank 0
    sees it exit while it waits for it (or, had it arrived, the join gives up after the group's
    timeout), the run stops as interrupted, and the resume
    replays the edge-free stages and computes the hops over a fresh worker (which failed before
    party_a.workers.group._forget_failed_join: rank 0's next group had another name). Killed
    once both hops are charged, the worker has done its part (GAP trains on rank 0) and the run
    completes by itself. Either way the ledger is the one-worker run's."""
    single, single_rows = gap_one_worker
    with cluster(tmp_path, 2) as services:
        charged: list[tuple] = []

        def ready(run_id: str) -> bool:
            charged[:] = ledger_rows(services.status_url, run_id)
            kinds = [row[3] for row in charged]
            return len(kinds) >= 3 if moment == "before the hops" else kinds.count("one-shot") == 2

        run_id, first = kill_the_worker(services, GAP_RUN, ready)
        if moment == "before the hops":
            assert "one-shot" not in [row[3] for row in charged]
            assert first.status == "interrupted" and "lost a worker process" in first.message, first.message
            assert [row[3] for row in ledger_rows(services.status_url, run_id)].count("one-shot") == 0
            final = drive_run(services.party_a_address, None, QUIET, resume_run_id=run_id)
        else:
            final = first
        rows = ledger_rows(services.status_url, run_id)
    assert final.status == "completed", final.message
    assert [row[3] for row in rows].count("one-shot") == 2  # each hop charged once
    assert without_run_names(rows) == without_run_names(single_rows)
    assert final.epsilon_spent == pytest.approx(single.epsilon_spent, rel=1e-9)
