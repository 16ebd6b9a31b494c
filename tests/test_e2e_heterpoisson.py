"""heterpoisson end to end: three real services on loopback, the real CLI, Cora.

The run must complete under the node-level ledger (δ = 1/|V|, privacy unit "node" and the
replace-with-null relation in the accountant's status), declare both rules as
MixtureOfGaussians events over the dominating appearance law of Cora's degree table
(docs/extractors/heterpoisson.md, section 4), count every release, stay within ε, replay
to the status's ε, and B must receive only training steps charged before they arrived.

The noise multiplier is fixed (z = 40) to keep this test short: calibrating a mixture
plan builds several mixture PLDs point by point (~20 s; docs page, section 7).
`tests/test_e2e_demo.py` runs `vesper demo --extractor heterpoisson`, which calibrates.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from e2e import ledger, receipts, vesper

from vesper.common.config import DEFAULT_DELTA
from vesper.coordinator.processes import LocalCluster
from vesper.party_a.extractors.heterpoisson import dominating_law, eval_sensitivity, step_sensitivity

pytestmark = pytest.mark.e2e

CORA_NODES = 2708
CORA_TRAIN = CORA_NODES // 2  # B's stratified 50 % train split
Z, RHO, MULTIPLIER, BATCH, EPOCHS = 40.0, 0.5, 1.0, 512, 2


def test_node_level_run_charges_every_step_as_a_mixture_before_b_sees_it(cluster: LocalCluster, tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    code, output = vesper(
        "train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--epochs", str(EPOCHS),
        "--batch-size", str(BATCH), "--extractor", "heterpoisson", "--epsilon", "4", "--noise-multiplier", str(Z),
        "--dim", "8", "--param", f"multiplier={MULTIPLIER}", "--param", f"forward_share={RHO}",
        # a small random input projection keeps the per-sub-graph gradients cheap
        "--param", "input_projection=32", "--json-out", str(out),
    )
    assert code == 0, output
    summary = json.loads(out.read_text())
    print(f"heterpoisson e2e run: {summary['seconds']} s, test {summary['test_metric']}")
    assert summary["status"] == "completed", summary["message"]
    assert summary["privacy_unit"] == "node" and summary["delta"] == DEFAULT_DELTA
    assert "replace-with-null" in summary["relation"] and summary["participation_bound"] is None
    assert 0 < summary["epsilon_spent"] <= 4 and summary["noise_multiplier"] == Z
    assert 0 <= summary["test_metric"]["value"] <= 1
    run_id = summary["run_id"]

    status = httpx.get(f"{cluster.status_url}/v1/runs/{run_id}", timeout=10).json()
    assert status["privacy_unit"] == "node" and status["epsilon_spent"] == summary["epsilon_spent"]
    assert status["accountant_requested"] == "pld" and "replace-with-null" in status["assumption"]

    record = ledger(cluster.status_url, run_id)
    run, rows = record["run"], sorted(record["rows"], key=lambda r: r["seq"])
    assert run["privacy_unit"] == "node"
    # the declared events: mixtures over the law that dominates every degree (no statistic of the graph)
    assert "max_degree" not in run["details"]
    counts, train_mass = dominating_law(MULTIPLIER, CORA_TRAIN)
    eval_counts, eval_mass = dominating_law(MULTIPLIER, 4096)
    expected = {
        "train": (Z, step_sensitivity(counts, RHO), train_mass),
        "eval": (Z / math.sqrt(RHO), eval_sensitivity(eval_counts), eval_mass),
    }
    expected["predict"] = expected["eval"]  # a prediction pass is charged as the evaluation pass (privacy.md 2.4)
    assert {rule["kind"] for rule in run["rules"]} == set(expected)
    for rule in run["rules"]:
        event = json.loads(rule["release_event"])
        std, sensitivities, mass = expected[rule["kind"]]
        assert event["type"] == "MixtureOfGaussiansDpEvent" and rule["participation_bound"] is None
        assert event["standard_deviation"] == pytest.approx(std, rel=1e-12)
        assert event["sensitivities"] == pytest.approx(list(sensitivities), rel=1e-12)
        assert event["sampling_probs"] == pytest.approx(list(mass), rel=1e-9, abs=1e-300)

    # every release is counted; the train pass of an epoch has at most ceil(|train|/B) steps
    assert all(row["counted"] for row in rows)
    train_rows = [row for row in rows if row["kind"] == "train"]
    assert len(train_rows) == summary["steps"]
    steps_per_epoch = math.ceil(CORA_TRAIN / BATCH)
    for epoch in range(EPOCHS):
        assert 1 <= sum(row["pass_id"] == f"train-{epoch}" for row in train_rows) <= steps_per_epoch
    assert [row["kind"] for row in rows[: len(train_rows)]] == ["train"] * len(train_rows)

    code, output = vesper("ledger", "verify", run_id, "--url", cluster.status_url)
    assert code == 0 and f"= {summary['epsilon_spent']!r}" in output, output

    # write-ahead: B received exactly the charged training steps, each after its charge
    received = [r for r in receipts(cluster.workdir / "receipts.jsonl", run_id) if r["kind"] == "train"]
    assert [r["step"] for r in received] == list(range(len(train_rows)))
    for row, entry in zip(train_rows, received, strict=True):
        assert row["num_nodes"] == entry["num_nodes"]
        assert datetime.fromisoformat(row["created_at"]).timestamp() <= entry["received_at"]
