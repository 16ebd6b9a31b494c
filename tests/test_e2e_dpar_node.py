"""dpar-node end to end: three real services on loopback, the real CLI, Cora.

The run must complete under the node-level ledger (δ = 1/|V|, privacy unit "node" in the
accountant's status), charge the one-shot DP-APPR release first, then one Gaussian per
training pass and per evaluation sweep (N_e = 1, docs/extractors/dpar-node.md), stay
within ε, and B must receive only releases that were charged before.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from e2e import ledger, receipts, vesper

from vesper.common.config import DEFAULT_DELTA
from vesper.coordinator.processes import LocalCluster
from vesper.party_a.extractors.dpar_node import DparNodeParams, split_multipliers

pytestmark = pytest.mark.e2e

CORA_NODES = 2708


def test_node_level_run_charges_the_one_shot_then_one_gaussian_per_pass(cluster: LocalCluster, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    code, output = vesper(
        "train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--epochs", "2", "--batch-size", "512",
        "--extractor", "dpar-node", "--epsilon", "4",
        # a small random input projection keeps the per-sample gradients cheap for the test
        "--param", "input_projection=32", "--param", "top_k=2", "--param", "ista_iterations=5", "--json-out", str(out),
    )
    assert code == 0, output
    summary = json.loads(out.read_text())
    print(f"dpar-node e2e run: {summary['seconds']} s")
    assert summary["status"] == "completed" and summary["extractor"] == "dpar-node"
    assert summary["privacy_unit"] == "node" and summary["delta"] == DEFAULT_DELTA
    assert 0 < summary["epsilon_spent"] <= 4 and summary["participation_bound"] == 1
    assert 0 <= summary["test_metric"]["value"] <= 1
    run_id, z = summary["run_id"], summary["noise_multiplier"]

    status = httpx.get(f"{cluster.status_url}/v1/runs/{run_id}", timeout=10).json()
    assert status["privacy_unit"] == "node" and status["epsilon_spent"] == summary["epsilon_spent"]

    record = ledger(cluster.status_url, run_id)
    run, rows = record["run"], sorted(record["rows"], key=lambda r: r["seq"])
    assert run["privacy_unit"] == "node" and run["details"]["sensitivity_form"] == "per-pass"
    # the declared events: Gaussians with the multipliers of eqs. Z1-Z3 for the run's z
    d = DparNodeParams()
    m = split_multipliers(z, d.forward_share, d.eval_share, d.appr_share, 2, one_shot=True)
    expected = {"train": m.train, "eval": m.eval, "one-shot": m.one_shot}
    bounds = {"train": 1, "eval": 1, "one-shot": None}
    for rule in run["rules"]:
        event = json.loads(rule["release_event"])
        assert event["type"] == "GaussianDpEvent"
        assert event["noise_multiplier"] == pytest.approx(expected[rule["kind"]], rel=1e-9)
        assert rule["participation_bound"] == bounds[rule["kind"]]

    # one-shot first, then the training passes (first release of each counted), then the sweep
    assert rows[0]["kind"] == "one-shot" and rows[0]["counted"] and rows[0]["num_nodes"] == CORA_NODES
    passes: dict[str, list[bool]] = defaultdict(list)
    for row in rows[1:]:
        passes[row["pass_id"]].append(row["counted"])
    steps = summary["steps"] // 2  # training steps per epoch
    assert steps == math.ceil(CORA_NODES // 2 / 512)  # B's stratified 50 % train split
    assert list(passes) == ["train-0", "train-1", "eval-0"]
    assert passes["train-0"] == passes["train-1"] == [True] + [False] * (steps - 1)
    assert passes["eval-0"][0] and not any(passes["eval-0"][1:])
    assert [r["kind"] for r in rows[1 : 1 + 2 * steps]] == ["train"] * (2 * steps)

    code, output = vesper("ledger", "verify", run_id, "--url", cluster.status_url)
    assert code == 0 and f"= {summary['epsilon_spent']!r}" in output, output

    # write-ahead: B received only charged releases, each after its charge
    charged_at = {row["release_key"]: datetime.fromisoformat(row["created_at"]).timestamp() for row in rows}
    received = receipts(cluster.workdir / "receipts.jsonl", run_id)
    train = [r for r in received if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(summary["steps"]))
    for entry in train:
        epoch, index = divmod(entry["step"], steps)
        assert charged_at[f"train-{epoch}/{index}"] <= entry["received_at"]
