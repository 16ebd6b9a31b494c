"""GAP through the real services: the encoder stage, K one-shot hops, free training and evaluation.

Checks, on Cora with K = 2 hops, a 2-epoch encoder stage and a 1-epoch stage of the edge-free
path (docs/privacy.md, section 2.5): the run completes within its
budget; the ledger holds exactly K counted one-shot Gaussian rows and only no-op train/eval
rows; the calibrated z and ε spent do not depend on the number of epochs; a fixed z spends
exactly ε(K × Gaussian(z)); and every tensor B received (stage, training, evaluation) was
charged before it arrived.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import dp_accounting as dpa
import pytest
from e2e import fast_run, ledger, receipts, vesper

from vesper.common.config import DEFAULT_DELTA
from vesper.common.privacy.accounting import epsilon_of
from vesper.coordinator.processes import LocalCluster

pytestmark = pytest.mark.e2e

HOPS = 2
ENCODER_EPOCHS = 2
PATH_EPOCHS = 1  # the edge-free path's own stage, after the hops
CORA_STEPS = 6  # ceil(train nodes / 256) for Cora's stratified split
CORA_DELTA = DEFAULT_DELTA  # declared, never 1/|E| (docs/privacy.md, section 1)


def gap_run(cluster: LocalCluster, out: Path, epochs: int, *extra: str) -> dict:
    args = fast_run(
        "--extractor", "gap", "--layers", str(HOPS), "--param", f"encoder_epochs={ENCODER_EPOCHS}",
        "--edge-free-path-epochs", str(PATH_EPOCHS), *extra,
    )
    args[args.index("--epochs") + 1] = str(epochs)
    code, output = vesper("train", "--party-a", cluster.party_a_address, *args, "--json-out", str(out))
    assert code == 0, output
    summary = json.loads(out.read_text())
    assert summary["status"] == "completed", summary["message"]
    return summary


@pytest.fixture(scope="module")
def calibrated(cluster: LocalCluster, tmp_path_factory) -> dict[int, dict]:
    """Two runs at ε = 4 that differ only in their number of epochs."""
    out = tmp_path_factory.mktemp("gap-runs")
    return {epochs: gap_run(cluster, out / f"{epochs}.json", epochs, "--epsilon", "4") for epochs in (1, 3)}


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def test_ledger_has_k_one_shot_rows_and_only_free_training(cluster: LocalCluster, calibrated: dict[int, dict]) -> None:
    for epochs, summary in calibrated.items():
        assert 0 < summary["epsilon_spent"] <= summary["epsilon_budget"] == 4
        assert summary["test_metric"]["name"] == "accuracy" and 0 <= summary["test_metric"]["value"] <= 1
        assert summary["sensitivity"] == pytest.approx(2**0.5) and summary["sensitivity_form"] == "one-shot"
        record = ledger(cluster.status_url, summary["run_id"])
        rules = {r["kind"]: r for r in record["run"]["rules"]}
        assert "GaussianDpEvent" in rules["one-shot"]["release_event"]
        assert rules["one-shot"]["participation_bound"] is None
        assert "NoOpDpEvent" in rules["train"]["release_event"] and "NoOpDpEvent" in rules["eval"]["release_event"]
        rows = record["rows"]
        one_shot = [r for r in rows if r["kind"] == "one-shot"]
        assert len(one_shot) == HOPS and all(r["counted"] and r["num_nodes"] == 2708 for r in one_shot)
        # order: the edge-free encoder stage, the K hops, the path's stage, then the classifier's training
        stage = ENCODER_EPOCHS * CORA_STEPS
        assert [r["seq"] for r in one_shot] == list(range(stage, stage + HOPS))
        assert all(r["pass_id"].startswith("encoder-") for r in rows if r["seq"] < stage)
        path = [r["seq"] for r in rows if r["pass_id"].startswith("edge-free-path-")]
        assert path == list(range(stage + HOPS, stage + HOPS + PATH_EPOCHS * CORA_STEPS))
        train = [r for r in rows if r["kind"] == "train"]
        assert len(train) == (ENCODER_EPOCHS + PATH_EPOCHS + epochs) * CORA_STEPS == summary["steps"]
        assert all("NoOpDpEvent" in r["release_event"] for r in train + [r for r in rows if r["kind"] == "eval"])
        # ε is 0 through the stage, and stops moving once the last hop is charged
        assert {r["epsilon_after"] for r in rows if r["seq"] < stage} == {0.0}
        assert {r["epsilon_after"] for r in rows if r["seq"] >= stage + HOPS - 1} == {summary["epsilon_spent"]}
        code, output = vesper("ledger", "verify", summary["run_id"], "--url", cluster.status_url)
        assert code == 0, output


def test_epochs_do_not_change_z_or_epsilon(calibrated: dict[int, dict]) -> None:
    one, three = calibrated[1], calibrated[3]
    assert one["noise_multiplier"] == three["noise_multiplier"] > 0
    assert one["epsilon_spent"] == three["epsilon_spent"]


def test_a_fixed_z_spends_exactly_k_gaussian_events(cluster: LocalCluster, tmp_path: Path) -> None:
    summary = gap_run(cluster, tmp_path / "fixed.json", 3, "--epsilon", "8", "--noise-multiplier", "3")
    expected = epsilon_of(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(3.0), HOPS), CORA_DELTA).epsilon
    assert summary["epsilon_spent"] == pytest.approx(expected, rel=1e-9)
    assert summary["noise_std"] == pytest.approx(3 * 2**0.5)


def test_b_received_only_charged_releases(cluster: LocalCluster, calibrated: dict[int, dict]) -> None:
    log = cluster.workdir / "receipts.jsonl"
    for summary in calibrated.values():
        run_id = summary["run_id"]
        rows = sorted(ledger(cluster.status_url, run_id)["rows"], key=lambda r: r["seq"])
        streams = {
            "stage": ([e for e in receipts(log, f"{run_id}.encoder") if e["kind"] == "train"],
                      [r for r in rows if r["pass_id"].startswith("encoder-")]),
            "path stage": ([e for e in receipts(log, f"{run_id}.edge-free-path") if e["kind"] == "train"],
                           [r for r in rows if r["pass_id"].startswith("edge-free-path-")]),
            "train": ([e for e in receipts(log, run_id) if e["kind"] == "train"],
                      [r for r in rows if r["pass_id"].startswith("train-")]),
            "eval": ([e for e in receipts(log, run_id) if e["kind"] == "eval"],
                     [r for r in rows if r["kind"] == "eval"]),
        }
        for name, (received, charged) in streams.items():
            assert received and len(received) == len(charged), name
            for entry, row in zip(received, charged):
                assert entry["num_nodes"] == row["num_nodes"], name
                assert entry["received_at"] >= _time(row["created_at"]), f"{name}: received before charged"
        assert len(streams["stage"][0]) == ENCODER_EPOCHS * CORA_STEPS
        assert len(streams["path stage"][0]) == PATH_EPOCHS * CORA_STEPS


def test_the_run_s_edge_free_head_goes_on_from_the_path_stage(cluster: LocalCluster, calibrated: dict[int, dict]) -> None:
    """Through the services: the path's stage hands B's decoder to the run's edge-free head
    (FinishRunRequest.edge_free_head_to; the math is tests/test_edge_free_path.py's)."""
    log = (cluster.workdir / "logs" / "party-b.log").read_text()
    for summary in calibrated.values():
        run_id = summary["run_id"]
        assert f"run {run_id}.edge-free-path: its decoder starts the edge-free head of {run_id}" in log


def test_b_reports_each_head_and_keeps_the_rival_only_beyond_one_se(calibrated: dict[int, dict]) -> None:
    """Through the services: every head's metrics, each other head's paired SE, and a kept head
    that follows party_b.head_choice's rule from those numbers."""
    from vesper.party_b.head_choice import MARGIN_Z

    for summary in calibrated.values():
        metrics = {key: m["value"] for key, m in summary["head_metrics"].items()}
        assert set(metrics) == {f"{split}@{head}" for split in ("val", "test") for head in ("graph", "edge-free", "combined")}
        errors = {key: m["value"] for key, m in summary["head_errors"].items()}
        assert set(errors) == {"val@graph", "val@combined"} and all(0 < e < 0.1 for e in errors.values())
        rival = max(("graph", "combined"), key=lambda head: metrics[f"val@{head}"])
        beyond = metrics[f"val@{rival}"] - metrics["val@edge-free"] > MARGIN_Z * errors[f"val@{rival}"]
        assert summary["decoder_head"] == (rival if beyond else "edge-free")
        assert summary["test_metric"]["value"] == metrics[f"test@{summary['decoder_head']}"]
