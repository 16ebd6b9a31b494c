"""The fault drill of docs/faults.md for party A and the accountant (party B's is in
test_e2e_faults.py, in the default suite): SIGKILL mid-run, restart, resume; the final
ledger equals the uninterrupted run's, step for step, and so does the model."""

from __future__ import annotations

import pytest
from fault_drill import DRILL_SETTINGS, drill_cluster, kill_mid_run, ledger_rows, uninterrupted

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with drill_cluster(tmp_path_factory.mktemp("drill")) as running:
        reference = uninterrupted(running)
        assert reference.status == "completed", reference.message
        yield running, reference


def test_killing_party_a_mid_run_then_resuming_gives_the_uninterrupted_ledger(cluster) -> None:
    running, reference = cluster
    outcome = kill_mid_run(running, "party-a")
    assert outcome.first is None and f"vesper train --resume {outcome.run_id}" in outcome.first_error
    assert outcome.final.status == "completed", outcome.final.message
    assert ledger_rows(running.status_url, outcome.run_id) == ledger_rows(running.status_url, reference.run_id)
    assert outcome.final.test_metric == reference.test_metric


def test_killing_the_accountant_mid_run_is_ridden_out_by_retries(cluster) -> None:
    """Party A retries its charges (same release keys) until the accountant is back: no resume needed."""
    running, reference = cluster
    outcome = kill_mid_run(running, "accountant")
    assert outcome.first is not None and outcome.first.status == "completed", outcome.first
    assert ledger_rows(running.status_url, outcome.run_id) == ledger_rows(running.status_url, reference.run_id)
    assert outcome.final.test_metric == reference.test_metric


def test_an_accountant_that_stays_away_interrupts_the_run_and_resuming_completes_it(cluster) -> None:
    """Down for longer than party A's patience (peer_retry_s): a clear interrupted state, then a resume."""
    running, reference = cluster
    outcome = kill_mid_run(running, "accountant", down_s=DRILL_SETTINGS["peer_retry_s"] + 10)
    first = outcome.first
    assert first is not None and first.status == "interrupted", first
    assert "accountant at" in first.message and f"vesper train --resume {first.run_id}" in first.message
    assert outcome.final.status == "completed", outcome.final.message
    assert ledger_rows(running.status_url, outcome.run_id) == ledger_rows(running.status_url, reference.run_id)
    assert outcome.final.test_metric == reference.test_metric
