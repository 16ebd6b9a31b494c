"""Graceful degradation by construction: an extractor's edge-free path is the MLP run.

With the same run seed and party A's same secret base, the edge-free path of an extractor's
run draws the MLP run's dropout keys (party_a.extractors.pmp_plugin.MlpPlugin), trains on its
batches in its order (a one-shot extractor's path stage and the run are one pass,
Stage.continues) and B's edge-free head trains as the MLP's decoder does (it starts from the
stage's decoder, optimiser and dropout stream). So B's edge-free head scores exactly what the
MLP run scores, on validation and on test: where B keeps it, the extractor's run is the MLP's
(docs/utility.md, section 7). Through the real code, in process (coordinator/in_process.py),
on Cora.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from vesper.common.config import RunConfig, RunSummary
from vesper.coordinator.in_process import InProcessCluster

# settings the run gives; the rest are each extractor's defaults (GAP's d = 16, the MLP's 64)
SHARED = {"encoder_hidden": 32, "dropout": 0.5}


def _config(extractor: str, epochs: int, **settings: object) -> RunConfig:
    return RunConfig.model_validate({
        "dataset": "cora", "seed": 5, "epochs": epochs, "privacy": {"epsilon": 4.0},
        "extractor": {"name": extractor, **SHARED, **settings},
    })


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[InProcessCluster]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with InProcessCluster(
            tmp_path_factory.mktemp("crn"), party_a={"secret_seed": 11}, party_b={"secret_seed": 13},
        ) as cluster:
            yield cluster
    finally:
        torch.set_num_threads(threads)


def _edge_free_head(summary: RunSummary) -> tuple[float, float]:
    assert summary.status == "completed", summary.message
    return summary.head_metrics["val@edge-free"].value, summary.head_metrics["test@edge-free"].value


def _mlp(summary: RunSummary) -> tuple[float, float]:
    assert summary.status == "completed", summary.message
    assert summary.val_metric is not None and summary.test_metric is not None
    return summary.val_metric.value, summary.test_metric.value


@pytest.mark.e2e
def test_a_per_step_extractor_s_edge_free_head_scores_what_the_mlp_run_scores(cluster: InProcessCluster) -> None:
    mlp = cluster.drive(_config("mlp", epochs=3))
    pmp = cluster.drive(_config("pmp-gcn", epochs=3))
    assert _edge_free_head(pmp) == _mlp(mlp)
    # not by accident: another run seed gives the MLP other numbers
    assert _mlp(cluster.drive(_config("mlp", epochs=3).model_copy(update={"seed": 6}))) != _mlp(mlp)


@pytest.mark.e2e
def test_a_one_shot_extractor_s_path_stage_and_run_are_the_mlp_run(cluster: InProcessCluster) -> None:
    """GAP: 2 epochs of its path alone, then 2 with the run: the MLP run's 4, one pass at both parties.
    GAP's own d = 16 is not the path's: the path is the MLP's d = 64, released as 4 slices of 16."""
    mlp = cluster.drive(_config("mlp", epochs=4))
    gap = cluster.drive(_config("gap", epochs=2, edge_free_path_epochs=2, params={"encoder_epochs": 1}))
    assert _edge_free_head(gap) == _mlp(mlp)
    # the same run with the path at GAP's width (before the path had its own): another model
    narrow = cluster.drive(_config("gap", epochs=2, edge_free_path_epochs=2, edge_free_path_dim=16, params={"encoder_epochs": 1}))
    assert _edge_free_head(narrow) != _mlp(mlp)
