"""Label privacy through the real services: three processes on loopback, the CLI, Cora.

Checks, for ``--label-privacy rr`` and ``pate``: B opens a ledger of its own
(``<run id>.labels``, privacy unit ``label``), charges it before anything derived from
its labels leaves B, and never mixes it with A's; the summary, the REST status and the
ledger replay agree on both ε; ``vesper status RUN`` shows the two ledgers separately;
under pate A releases its frozen embeddings of B's labelled nodes and of the queries in
the evaluation pass (charged to A's ledger like any evaluation release), trains the
student only on the answered queries, and never receives a gradient of a private label;
an extractor that trains with B's labels is refused under pate; a label budget below a
fixed pate plan is refused before anything is sent; gradients A records are the ones it
received.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import dp_accounting as dpa
import httpx
import numpy as np
import pytest
from e2e import ledger, vesper

from vesper.common.dataset_files import load_label_part, resolve_dataset
from vesper.common.privacy.events import event_from_json
from vesper.coordinator.processes import LocalCluster

pytestmark = pytest.mark.e2e

# Cora's published 5,278 edges, declared as the public bound relational's rate q = b/bound needs
RELATIONAL = ("--extractor", "relational", "--param", "pretrain_steps=4", "--param", "expected_batch=1024", "--edge-bound", "5278")


def train(cluster: LocalCluster, out: Path, *args: str) -> tuple[int, dict]:
    code, output = vesper(
        "train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--batch-size", "256", "--seed", "1",
        *args, "--json-out", str(out),
    )
    assert out.exists(), output
    return code, json.loads(out.read_text())


@pytest.fixture(scope="module")
def rr_run(cluster: LocalCluster, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("rr") / "rr.json"
    code, summary = train(
        cluster, out, "--extractor", "mlp", "--epochs", "3", "--label-privacy", "rr", "--label-epsilon", "2",
        "--record-gradients",
    )
    assert code == 0 and summary["status"] == "completed", summary["message"]
    return summary


@pytest.fixture(scope="module")
def pate_run(cluster: LocalCluster, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("pate") / "pate.json"
    code, summary = train(
        cluster, out, *RELATIONAL, "--epochs", "3", "--epsilon", "8", "--label-privacy", "pate",
        "--label-epsilon", "4", "--label-param", "teachers=20", "--label-param", "queries=200", "--record-gradients",
    )
    assert code == 0 and summary["status"] == "completed", summary["message"]
    return summary


def rows(cluster: LocalCluster, run_id: str) -> tuple[dict, list[dict]]:
    record = ledger(cluster.status_url, run_id)
    return record["run"], sorted(record["rows"], key=lambda r: r["seq"])


def test_rr_charges_one_randomised_response_on_bs_own_ledger(cluster: LocalCluster, rr_run: dict) -> None:
    assert rr_run["label_privacy"] == "rr" and rr_run["label_run_id"] == f"{rr_run['run_id']}.labels"
    run, label_rows = rows(cluster, rr_run["label_run_id"])
    assert run["privacy_unit"] == "label" and run["accounting"] == "labels"
    assert len(label_rows) == 1 and label_rows[0]["kind"] == "one-shot"
    event = event_from_json(label_rows[0]["release_event"])
    assert isinstance(event, dpa.RandomizedResponseDpEvent) and event.num_buckets == 7
    # k-RR at ε = 2 spends exactly ε = 2 (never more), and the summary says what the ledger says
    assert math.isclose(rr_run["label_epsilon_spent"], 2.0, rel_tol=1e-9) and rr_run["label_epsilon_spent"] <= 2.0
    assert rr_run["label_epsilon_spent"] == label_rows[0]["epsilon_after"]
    # A's ledger is an edge ledger untouched by B's labels: the MLP reads no edge
    a_run, a_rows = rows(cluster, rr_run["run_id"])
    assert a_run["privacy_unit"] == "edge" and rr_run["epsilon_spent"] == 0.0
    assert all("Randomized" not in r["release_event"] for r in a_rows)
    code, output = vesper("ledger", "verify", rr_run["label_run_id"], "--url", cluster.status_url)
    assert code == 0 and "verified" in output, output


def test_status_shows_both_ledgers_separately(cluster: LocalCluster, rr_run: dict) -> None:
    code, output = vesper("status", rr_run["run_id"], "--url", cluster.status_url)
    assert code == 0, output
    output = " ".join(output.split())  # the console wraps long lines
    assert "party A's ledger" in output and "party B's label ledger" in output
    assert "privacy unit: edge" in output and "privacy unit: label" in output
    code, output = vesper("status", rr_run["run_id"], "--url", cluster.status_url, "--json")
    both = json.loads(output)
    assert both["run"]["privacy_unit"] == "edge" and both["label_ledger"]["privacy_unit"] == "label"


def test_rr_gradients_recorded_are_the_training_roots(cluster: LocalCluster, rr_run: dict) -> None:
    path = cluster.workdir / "party_a" / "runs" / rr_run["run_id"] / "gradients.npz"
    recorded = np.load(path)
    ids = recorded["node_ids"]
    assert recorded["gradients"].shape == (ids.size, 64) and int(recorded["num_classes"]) == 7
    assert np.all(np.diff(ids) > 0) and np.isfinite(recorded["gradients"]).all()
    # the label-independent split: B trains on half of Cora's nodes, chosen without reading a label
    assert ids.size == round(0.5 * 2708)


def test_pate_teachers_answer_queries_and_the_student_trains_on_them(cluster: LocalCluster, pate_run: dict) -> None:
    run, label_rows = rows(cluster, pate_run["label_run_id"])
    assert run["privacy_unit"] == "label" and run["details"]["queries"] == 200
    assert len(label_rows) == 200 and all(r["kind"] == "one-shot" for r in label_rows)
    event = event_from_json(label_rows[0]["release_event"])
    sigma1, sigma2 = run["details"]["sigma1"], run["details"]["sigma2"]
    # both Confident-GNMax steps, with the histogram's L2 sensitivity √2
    threshold_step, gnmax_step = event.events
    assert threshold_step == dpa.GaussianDpEvent(sigma1)
    assert math.isclose(gnmax_step.noise_multiplier, sigma2 / math.sqrt(2), rel_tol=1e-15)
    assert pate_run["label_epsilon_spent"] <= 4.0 and pate_run["label_epsilon_spent"] > 3.9
    answered = int(pate_run["label_note"].split("answered ")[1].split(" of")[0])
    assert 0 < answered <= 200
    # A never received a gradient of one of B's private labels: only of answered queries
    recorded = np.load(cluster.workdir / "party_a" / "runs" / pate_run["run_id"] / "gradients.npz")
    assert recorded["node_ids"].size == answered
    labels = load_label_part(resolve_dataset("cora", {})).labels
    assert labels.size == 2708
    assert pate_run["steps"] == 3 * math.ceil(answered / 256)


def test_pate_embeddings_for_the_teachers_are_charged_in_as_evaluation_pass(cluster: LocalCluster, pate_run: dict) -> None:
    a_run, a_rows = rows(cluster, pate_run["run_id"])
    eval_rows = [r for r in a_rows if r["kind"] == "eval"]
    # teachers (1,354 labelled nodes) + 200 queries, then val and test, at 4,096 per chunk: 4 chunks, one pass
    assert [r["release_key"] for r in eval_rows] == [f"eval-0/{i}" for i in range(4)]
    assert {r["pass_id"] for r in eval_rows} == {"eval-0"}


def test_pate_refuses_an_extractor_that_trains_with_bs_labels(cluster: LocalCluster, tmp_path: Path) -> None:
    code, summary = train(
        cluster, tmp_path / "gap.json", "--extractor", "gap", "--epochs", "1", "--epsilon", "4",
        "--label-privacy", "pate", "--label-epsilon", "4",
    )
    assert code != 0 and summary["status"] == "failed"
    assert "trains stage(s)" in summary["message"] and "without B's labels" in summary["message"]
    # nothing of B's labels left B: its ledger holds no charge
    status = httpx.get(f"{cluster.status_url}/v1/runs/{summary['run_id']}.labels", timeout=10).json()
    assert status["charges"] == 0


def test_pate_plan_above_the_label_budget_is_refused(cluster: LocalCluster, tmp_path: Path) -> None:
    code, summary = train(
        cluster, tmp_path / "tight.json", *RELATIONAL, "--epochs", "1", "--epsilon", "8", "--label-privacy", "pate",
        "--label-epsilon", "1", "--label-param", "sigma1=1", "--label-param", "sigma2=1",
    )
    assert code != 0 and summary["status"] == "failed"
    assert "above the label budget" in summary["message"], summary["message"]


def test_b_bounds_its_own_label_budget_whoever_asks(cluster: LocalCluster, tmp_path: Path) -> None:
    """The run's settings reach B through A, the adversary of its labels: B's cap decides."""
    code, summary = train(
        cluster, tmp_path / "greedy.json", "--extractor", "mlp", "--epochs", "1", "--label-privacy", "rr",
        "--label-epsilon", "50",
    )
    assert code != 0 and summary["status"] == "failed"
    assert "exceeds party B's own cap of 6" in summary["message"], summary["message"]
    assert summary["label_privacy"] == "rr" and summary["label_run_id"] == "" and summary["steps"] == 0  # no ledger, no step

