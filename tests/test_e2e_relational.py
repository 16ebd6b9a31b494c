"""relational and relational-gap through the real services: three processes on loopback, the CLI, Cora.

Checks: the pre-training is charged first, as ``pre-train`` rows of
SelfComposed(PoissonSampled(q, Gaussian(z)), steps per charge), and training and
evaluation are free; relational-gap adds K one-shot Gaussian rows after them; the status,
the ledger replay (``vesper ledger verify``) and the summary agree on ε, which is
dp-accounting's ε of exactly those rows; the ledger names the privacy unit "edge";
training 1 or 5 epochs changes neither ε nor a pre-train row; a budget too small for the
pre-training is refused before B receives anything; B receives only charged releases.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import dp_accounting as dpa
import httpx
import pytest
from e2e import NO_PATH_STAGE, ledger, receipts, vesper

from vesper.common.config import DEFAULT_DELTA
from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.events import event_from_json
from vesper.coordinator.processes import LocalCluster

pytestmark = pytest.mark.e2e

CORA_NODES, CORA_EDGES = 2708, 5278  # Cora's published edges, declared as the public edge bound
CORA_DELTA = DEFAULT_DELTA  # declared, never 1/|E| (docs/privacy.md, section 1)
BATCH = 1024  # expected positive edges per DP-SGD step: q = 1024/5278
STEPS_PER_CHARGE = math.ceil(CORA_EDGES / BATCH)  # one epoch: 6 steps per pre-train release
PRETRAIN = (
    "--param", f"pretrain_steps={2 * STEPS_PER_CHARGE}", "--param", f"expected_batch={BATCH}",
    "--edge-bound", str(CORA_EDGES),
)


def train(cluster: LocalCluster, out: Path, extractor: str, epochs: int, *extra: str) -> tuple[int, dict]:
    code, output = vesper(
        "train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--batch-size", "512",
        "--extractor", extractor, "--epochs", str(epochs), "--seed", "3", *PRETRAIN,
        *NO_PATH_STAGE, *extra, "--json-out", str(out),
    )
    assert out.exists(), output
    return code, json.loads(out.read_text())


@pytest.fixture(scope="module")
def relational_runs(cluster: LocalCluster, tmp_path_factory) -> dict[int, dict]:
    """relational at ε = 4 trained 1 and 5 epochs, everything else equal."""
    out = tmp_path_factory.mktemp("relational-runs")
    runs = {}
    for epochs in (1, 5):
        code, summary = train(cluster, out / f"{epochs}.json", "relational", epochs, "--epsilon", "4")
        assert code == 0 and summary["status"] == "completed", summary["message"]
        runs[epochs] = summary
    return runs


def sorted_rows(cluster: LocalCluster, run_id: str) -> tuple[dict, list[dict]]:
    record = ledger(cluster.status_url, run_id)
    return record["run"], sorted(record["rows"], key=lambda r: r["seq"])


def check_verified(cluster: LocalCluster, summary: dict) -> None:
    status = httpx.get(f"{cluster.status_url}/v1/runs/{summary['run_id']}", timeout=10).json()
    assert status["privacy_unit"] == "edge" and status["epsilon_spent"] == summary["epsilon_spent"]
    code, output = vesper("ledger", "verify", summary["run_id"], "--url", cluster.status_url)
    assert code == 0 and f"= {summary['epsilon_spent']!r}" in output, output


def pre_train_event(run: dict) -> dpa.DpEvent:
    rule = next(r for r in run["rules"] if r["kind"] == "pre-train")
    assert rule["participation_bound"] is None
    return event_from_json(rule["release_event"])


def test_relational_charges_pre_training_first_and_trains_for_free(
    cluster: LocalCluster, relational_runs: dict[int, dict]
) -> None:
    for epochs, summary in relational_runs.items():
        assert summary["privacy_unit"] == "edge" and summary["extractor"] == "relational"
        assert 0 < summary["epsilon_spent"] <= summary["epsilon_budget"] == 4
        assert summary["delta"] == pytest.approx(CORA_DELTA) and summary["pre_train_releases"] == 2
        assert 0 <= summary["test_metric"]["value"] <= 1
        check_verified(cluster, summary)
        run, rows = sorted_rows(cluster, summary["run_id"])
        assert run["privacy_unit"] == "edge" and run["details"]["pretrain_q"] == pytest.approx(BATCH / CORA_EDGES)
        z = summary["noise_multiplier"]
        one_chunk = dpa.SelfComposedDpEvent(
            dpa.PoissonSampledDpEvent(BATCH / CORA_EDGES, dpa.GaussianDpEvent(z)), STEPS_PER_CHARGE
        )
        assert pre_train_event(run) == one_chunk
        rules = {r["kind"]: r for r in run["rules"]}
        assert set(rules) == {"pre-train", "train", "eval", "predict"}
        # training, evaluation and prediction passes re-serve the charged pre-training: free
        assert all("NoOpDpEvent" in rules[kind]["release_event"] for kind in ("train", "eval", "predict"))
        pre = [r for r in rows if r["kind"] == "pre-train"]
        assert [r["seq"] for r in pre] == [0, 1] and all(r["counted"] and r["num_nodes"] == CORA_NODES for r in pre)
        assert len([r for r in rows if r["kind"] == "train"]) == summary["steps"] == epochs * 3
        # ε is fixed once the last chunk is charged: dp-accounting's ε of the two pre-train rows
        expected = epsilon_of(dpa.SelfComposedDpEvent(one_chunk, 2), CORA_DELTA).epsilon
        assert summary["epsilon_spent"] == pytest.approx(expected, rel=1e-9)
        assert {r["epsilon_after"] for r in rows[1:]} == {summary["epsilon_spent"]}


def test_vfl_epochs_change_neither_epsilon_nor_the_pre_train_rows(
    cluster: LocalCluster, relational_runs: dict[int, dict]
) -> None:
    one, five = relational_runs[1], relational_runs[5]
    assert one["noise_multiplier"] == five["noise_multiplier"] > 0
    assert one["epsilon_spent"] == five["epsilon_spent"]
    keys = ("seq", "kind", "pass_id", "release_key", "nodes_digest", "num_nodes", "release_event", "counted",
            "epsilon_after")
    pre = [
        [{k: r[k] for k in keys} for r in sorted_rows(cluster, s["run_id"])[1] if r["kind"] == "pre-train"]
        for s in (one, five)
    ]
    assert pre[0] == pre[1] and len(pre[0]) == 2


def test_relational_gap_composes_pre_training_and_k_hops(cluster: LocalCluster, tmp_path: Path) -> None:
    code, summary = train(
        cluster, tmp_path / "gap.json", "relational-gap", 1, "--epsilon", "4", "--layers", "2",
        "--param", "hop_noise_scale=0.5", "--param", "encoder_epochs=1",
    )
    assert code == 0 and summary["status"] == "completed", summary["message"]
    assert summary["privacy_unit"] == "edge" and 0 < summary["epsilon_spent"] <= 4
    check_verified(cluster, summary)
    run, rows = sorted_rows(cluster, summary["run_id"])
    z = summary["noise_multiplier"]
    hop = event_from_json(next(r for r in run["rules"] if r["kind"] == "one-shot")["release_event"])
    assert hop == dpa.GaussianDpEvent(0.5 * z)
    assert summary["noise_std"] == pytest.approx(0.5 * z * math.sqrt(2))
    # pre-training, GAP's edge-free encoder stage (one epoch, no-op rows), the K hops, then free training
    kinds = [r["kind"] for r in rows]
    assert kinds[:2] == ["pre-train"] * 2 and kinds[2:5] == ["train"] * 3 and kinds[5:7] == ["one-shot"] * 2
    assert all(r["pass_id"] == "encoder-0" and "NoOpDpEvent" in r["release_event"] for r in rows[2:5])
    assert all(r["counted"] for r in rows[:2] + rows[5:7]) and set(kinds[7:]) == {"train", "eval"}
    composed = dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(pre_train_event(run), 2), dpa.SelfComposedDpEvent(hop, 2),
    ])
    assert summary["epsilon_spent"] == pytest.approx(epsilon_of(composed, CORA_DELTA).epsilon, rel=1e-9)


def test_b_received_only_charged_releases_after_the_pre_training(
    cluster: LocalCluster, relational_runs: dict[int, dict]
) -> None:
    for summary in relational_runs.values():
        run_id = summary["run_id"]
        rows = sorted_rows(cluster, run_id)[1]
        charged_at = {r["release_key"]: datetime.fromisoformat(r["created_at"]).timestamp() for r in rows}
        last_pre_train = max(charged_at[r["release_key"]] for r in rows if r["kind"] == "pre-train")
        received = receipts(cluster.workdir / "receipts.jsonl", run_id)
        assert len(received) == sum(1 for r in rows if r["kind"] in ("train", "eval"))
        for entry in received:
            assert entry["received_at"] >= last_pre_train
        for entry in (e for e in received if e["kind"] == "train"):
            epoch, index = divmod(entry["step"], 3)
            assert charged_at[f"train-{epoch}/{index}"] <= entry["received_at"]


def test_a_budget_too_small_for_the_pre_training_is_refused_before_anything_is_sent(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    code, summary = train(
        cluster, tmp_path / "refused.json", "relational", 1, "--epsilon", "0.5", "--noise-multiplier", "0.6",
    )
    assert code == 3 and summary["status"] == "refused" and "nothing was sent" in summary["message"]
    assert summary["epsilon_spent"] == 0 and summary["steps"] == 0
    assert receipts(cluster.workdir / "receipts.jsonl", summary["run_id"]) == []
    run, rows = sorted_rows(cluster, summary["run_id"])
    assert rows == [] and run["status"] == "refused" and run["privacy_unit"] == "edge"
