"""ProGAP through the real services: stage, hop, stage, hop, then free training and evaluation.

One run on Cora with K = 2 hops, 1-epoch stages and a 1-epoch stage of the edge-free path:
it completes within its budget; the ledger interleaves the stages' no-op rows with the K
counted one-shot Gaussian rows in the order stage 0, hop 1, stage 1, hop 2, path stage,
training; B received each stage in a session of its own with i + 1 slices, and only after
each release was charged; the ε spent is that of K Gaussian events at the run's z.
"""

from __future__ import annotations

import json
from datetime import datetime

import dp_accounting as dpa
import pytest
from e2e import fast_run, ledger, receipts, vesper

from vesper.common.config import DEFAULT_DELTA
from vesper.common.privacy.accounting import epsilon_of
from vesper.coordinator.processes import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # one services run: make test-slow

HOPS = 2
CORA_STEPS = 6  # ceil(train nodes / 256) for Cora's stratified split


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[LocalCluster, dict]:
    workdir = tmp_path_factory.mktemp("progap-cluster")
    receipt_log = str(workdir / "receipts.jsonl")
    with LocalCluster(workdir, party_a={"secret_seed": 5}, party_b={"receipt_log": receipt_log}) as cluster:
        out = workdir / "summary.json"
        args = fast_run(
            "--extractor", "progap", "--layers", str(HOPS), "--param", "stage_epochs=1", "--edge-free-path-epochs", "1",
            "--epsilon", "4",
        )
        args[args.index("--epochs") + 1] = "1"
        code, output = vesper("train", "--party-a", cluster.party_a_address, *args, "--json-out", str(out))
        assert code == 0, output
        summary = json.loads(out.read_text())
        assert summary["status"] == "completed", summary["message"]
        yield cluster, summary


def test_stages_and_hops_alternate_in_the_ledger(run: tuple[LocalCluster, dict]) -> None:
    cluster, summary = run
    assert 0 < summary["epsilon_spent"] <= summary["epsilon_budget"] == 4
    record = ledger(cluster.status_url, summary["run_id"])
    rows = sorted(record["rows"], key=lambda r: r["seq"])
    rules = {r["kind"]: r for r in record["run"]["rules"]}
    assert "GaussianDpEvent" in rules["one-shot"]["release_event"] and rules["one-shot"]["participation_bound"] is None
    order = []
    for row in rows:
        what = "hop" if row["kind"] == "one-shot" else row["pass_id"].rsplit("-", 1)[0]
        if not order or order[-1] != what:
            order.append(what)
    assert order == ["stage-0", "hop", "stage-1", "hop", "edge-free-path", "train", "eval"]
    hops = [r for r in rows if r["kind"] == "one-shot"]
    assert len(hops) == HOPS and all(r["counted"] and r["num_nodes"] == 2708 for r in hops)
    assert all("NoOpDpEvent" in r["release_event"] for r in rows if r["kind"] != "one-shot")
    assert {r["epsilon_after"] for r in rows if r["seq"] < hops[0]["seq"]} == {0.0}
    z = summary["noise_multiplier"]
    expected = epsilon_of(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), HOPS), DEFAULT_DELTA).epsilon
    assert summary["epsilon_spent"] == pytest.approx(expected, rel=1e-6)
    code, output = vesper("ledger", "verify", summary["run_id"], "--url", cluster.status_url)
    assert code == 0, output


def test_b_received_each_stage_in_its_own_session_and_only_charged_releases(run: tuple[LocalCluster, dict]) -> None:
    cluster, summary = run
    run_id = summary["run_id"]
    rows = sorted(ledger(cluster.status_url, run_id)["rows"], key=lambda r: r["seq"])
    log = cluster.workdir / "receipts.jsonl"
    for stage in ("stage-0", "stage-1"):
        received = [e for e in receipts(log, f"{run_id}.{stage}") if e["kind"] == "train"]
        charged = [r for r in rows if r["pass_id"].startswith(f"{stage}-")]
        assert len(received) == len(charged) == CORA_STEPS, stage
        for entry, row in zip(received, charged):
            assert entry["num_nodes"] == row["num_nodes"]
            assert entry["received_at"] >= datetime.fromisoformat(row["created_at"]).timestamp(), stage
    # stage 1 was sent after hop 1 was charged, and read it: its session came after that row
    hop1 = next(r for r in rows if r["kind"] == "one-shot")
    first = receipts(log, f"{run_id}.stage-1")[0]
    assert first["received_at"] >= datetime.fromisoformat(hop1["created_at"]).timestamp()
