"""dpar-edge end to end: real services on loopback, the real CLI, ``--extractor dpar-edge``.

The private neighbourhoods are charged once, before training (one-shot rows); every
training step and evaluation chunk after that is post-processing (no-op rows), so the
run's ε does not depend on the number of epochs and stays within the budget.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e import NO_PATH_STAGE, ledger, vesper

from vesper.common.privacy.events import event_from_json
from vesper.coordinator.processes import LocalCluster

pytestmark = pytest.mark.e2e


def _train(cluster: LocalCluster, tmp_path: Path, name: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    code, output = vesper(
        "train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--extractor", "dpar-edge",
        "--batch-size", "512", *NO_PATH_STAGE, *extra, "--json-out", str(out),
    )
    assert code == 0, output
    return json.loads(out.read_text())


def _kinds_and_events(cluster: LocalCluster, run_id: str) -> list[tuple[str, str]]:
    rows = ledger(cluster.status_url, run_id)["rows"]
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    return [(r["kind"], type(event_from_json(r["release_event"])).__name__) for r in rows]


def test_one_shot_rows_then_free_training_and_the_same_epsilon_for_1_and_3_epochs(cluster: LocalCluster, tmp_path: Path) -> None:
    runs = {epochs: _train(cluster, tmp_path, f"e{epochs}", "--epsilon", "4", "--epochs", str(epochs)) for epochs in (1, 3)}
    for epochs, summary in runs.items():
        assert summary["status"] == "completed" and summary["privacy_unit"] == "edge"
        assert 0 < summary["epsilon_spent"] <= summary["epsilon_budget"] == 4
        assert summary["test_metric"]["name"] == "accuracy" and 0 <= summary["test_metric"]["value"] <= 1
        rows = _kinds_and_events(cluster, summary["run_id"])
        assert rows[0] == ("one-shot", "GaussianDpEvent")
        rest = rows[1:]
        assert [kind for kind, _ in rest] == ["train"] * summary["steps"] + ["eval"] * (len(rest) - summary["steps"])
        assert summary["steps"] == epochs * 3 and len(rest) > summary["steps"]
        assert {event for _, event in rest} == {"NoOpDpEvent"}
    assert runs[1]["epsilon_spent"] == runs[3]["epsilon_spent"]
    code, output = vesper("ledger", "verify", runs[3]["run_id"], "--url", cluster.status_url)
    assert code == 0, output


def test_the_exponential_variant_charges_k_zcdp_rounds_through_rdp(cluster: LocalCluster, tmp_path: Path) -> None:
    summary = _train(
        cluster, tmp_path, "em", "--epsilon", "4", "--epochs", "1", "--param", "mechanism=exponential", "--param", "top_k=3",
    )
    assert summary["status"] == "completed"
    assert summary["accountant"] == "rdp-zcdp"  # the PLD accountant cannot represent zCDP: RDP, and it says so
    assert 0 < summary["epsilon_spent"] <= 4
    rows = _kinds_and_events(cluster, summary["run_id"])
    assert rows[:3] == [("one-shot", "ZCDpEvent")] * 3 and rows[3][0] == "train"
    code, output = vesper("ledger", "verify", summary["run_id"], "--url", cluster.status_url)
    assert code == 0, output
