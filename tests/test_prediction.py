"""Prediction (docs/privacy.md, section 2.4): `vesper predict` through the real services.

A run trained on an aligned dataset is served after both parties restart: the scores of B's
test nodes reproduce the run's test metric, every key of the intersection gets a row, keys
outside it are refused, and every release of a charged prediction pass is in the ledger
before B has it; a pass the budget did not reserve is refused with nothing charged.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow.csv as pacsv
import pytest
from customers import customers_cluster
from e2e import ledger
from rich.console import Console

from vesper.common.config import RunConfig
from vesper.party_b.metrics import roc_auc

QUIET = Console(file=io.StringIO())
# the edge-free path's own stage of a one-shot extractor: 1 epoch (its state is served after a
# restart too), not the 47 of a 3-epoch run's default
ONE_PATH_EPOCH = {"edge_free_path_epochs": 1}


def _train(cluster, **settings) -> object:
    from vesper.coordinator.run_client import drive_run

    config = RunConfig.model_validate({
        "dataset": "customers-aligned", "epochs": 3, "batch_size": 16, "eval_chunk": 16,
        "privacy": {"epsilon": 8.0, **settings.pop("privacy", {})}, "extractor": settings.pop("extractor"),
        **settings,
    })
    summary = drive_run(cluster.party_a_address, config, QUIET)
    assert summary.status == "completed", summary.message
    return summary


def _predict(cluster, run_id: str, out: Path, *, keys: list[str] | None = None) -> dict:
    from vesper.coordinator.serving_client import check_keys, prediction_pass, score_request, write_scores

    request = score_request(run_id, keys, keys is None)
    plan = check_keys(cluster.party_b_address, request)
    report = None if plan.predicted else json.loads(prediction_pass(cluster.party_a_address, run_id, QUIET))
    write_scores(cluster.party_b_address, request, out)
    return {"plan": plan, "pass": report}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prediction")
    with customers_cluster(tmp) as (cluster, _, facts):
        yield cluster, facts, tmp


@pytest.mark.e2e
def test_scores_after_both_parties_restart_reproduce_the_test_metric(served) -> None:
    cluster, facts, tmp = served
    summary = _train(cluster, extractor={"name": "gap", "layers": 2, "params": {"encoder_epochs": 2}, **ONE_PATH_EPOCH})
    cluster.restart("party-a")
    cluster.restart("party-b")
    out = tmp / "scores.csv"
    done = _predict(cluster, summary.run_id, out)
    assert done["pass"]["nodes"] == 60 and done["pass"]["charged"] is False  # GAP serves its charged hops
    table = pacsv.read_csv(out).to_pydict()
    assert len(table["key"]) == 60 and set(table["predicted"]) <= {"fine", "risky"}
    probabilities = np.stack([table["p_fine"], table["p_risky"]], axis=1)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    truth = {key: ("risky" if facts["features"][key][0] > 0 else "fine") for key in facts["features"]}
    tested = [i for i, key in enumerate(table["key"]) if facts["splits"].get(key) == "test"]
    assert summary.test_metric.name == "roc_auc"  # two classes: B scores by the second class's probability
    risky = np.array([truth[table["key"][i]] == "risky" for i in tested])
    auc = roc_auc(np.array(table["p_risky"])[tested], risky)
    assert auc == pytest.approx(summary.test_metric.value, abs=1e-9)
    rows = ledger(cluster.status_url, summary.run_id)["rows"]
    assert [r["kind"] for r in rows if r["pass_id"].startswith("predict-")] == ["predict"] * 4  # 60 nodes, chunks of 16


@pytest.mark.e2e
def test_progap_serves_its_hops_through_its_trained_bases_after_a_restart(served) -> None:
    """ProGAP's releases read its charged hops through A's trained bases f_0..f_K: a free pass
    after party A restarts scores the test nodes as the run did (its state and its hops saved)."""
    cluster, facts, tmp = served
    summary = _train(cluster, extractor={"name": "progap", "layers": 2, "params": {"stage_epochs": 1}, **ONE_PATH_EPOCH})
    cluster.restart("party-a")
    out = tmp / "progap.csv"
    done = _predict(cluster, summary.run_id, out)
    assert done["pass"]["nodes"] == 60 and done["pass"]["charged"] is False
    table = pacsv.read_csv(out).to_pydict()
    truth = {key: ("risky" if facts["features"][key][0] > 0 else "fine") for key in facts["features"]}
    tested = [i for i, key in enumerate(table["key"]) if facts["splits"].get(key) == "test"]
    risky = np.array([truth[table["key"][i]] == "risky" for i in tested])
    assert roc_auc(np.array(table["p_risky"])[tested], risky) == pytest.approx(summary.test_metric.value, abs=1e-9)


@pytest.mark.e2e
def test_a_charged_pass_is_in_the_ledger_and_one_beyond_the_reservation_is_refused(served) -> None:
    from vesper.coordinator.run_client import RunClientError
    from vesper.coordinator.serving_client import prediction_pass
    from vesper.coordinator.status_client import run_status

    cluster, _, tmp = served
    summary = _train(cluster, extractor={"name": "pmp-gcn", "fanout": 5}, privacy={"prediction_passes": 1})
    before = run_status(cluster.status_url, summary.run_id)
    assert before.epsilon_spent < summary.epsilon_budget  # one pass of the budget is still reserved
    done = _predict(cluster, summary.run_id, tmp / "pmp.parquet")
    assert done["pass"]["charged"] is True
    after = run_status(cluster.status_url, summary.run_id)
    assert after.prediction_passes == 1 and before.epsilon_spent < after.epsilon_spent <= summary.epsilon_budget + 1e-9
    predicted = [r for r in ledger(cluster.status_url, summary.run_id)["rows"] if r["kind"] == "predict"]
    assert len(predicted) == 4 and {r["pass_id"] for r in predicted} == {"predict-0"}
    # a finished run keeps no release bytes for a resume, and a prediction pass (never resumed) adds none
    run_dir = tmp / "cluster" / "party_a" / "runs" / summary.run_id
    assert (run_dir / "releases.jsonl").exists() and not (run_dir / "sent").exists()
    with pytest.raises(RunClientError, match="reserved 1 prediction pass in its budget and 1 was made"):
        prediction_pass(cluster.party_a_address, summary.run_id, QUIET)
    assert run_status(cluster.status_url, summary.run_id).charges == after.charges  # nothing charged


@pytest.mark.e2e
def test_a_charged_run_without_a_reservation_cannot_predict(served) -> None:
    from vesper.coordinator.run_client import RunClientError
    from vesper.coordinator.serving_client import prediction_pass

    cluster, _, _ = served
    summary = _train(cluster, extractor={"name": "pmp-gin", "fanout": 5})
    with pytest.raises(RunClientError, match="reserved 0 prediction passes"):
        prediction_pass(cluster.party_a_address, summary.run_id, QUIET)


@pytest.mark.e2e
def test_keys_outside_the_intersection_are_refused_before_anything_is_released(served) -> None:
    from vesper.coordinator.run_client import RunClientError
    from vesper.coordinator.serving_client import check_keys, score_request

    cluster, _, _ = served
    summary = _train(cluster, extractor={"name": "mlp"}, epochs=1)
    with pytest.raises(RunClientError, match="2 of the 3 keys are not in the run's dataset.*'only-b-0'"):
        check_keys(cluster.party_b_address, score_request(summary.run_id, ["cust-001", "only-b-0", "only-a-0"], False))
    plan = check_keys(cluster.party_b_address, score_request(summary.run_id, None, False))
    assert plan.rows == 10 and not plan.predicted  # B's unlabelled keys of the intersection
