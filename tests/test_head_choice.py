"""B keeps the edge-free head unless another leads it by more than the paired noise (party_b.head_choice)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vesper.party_b.head_choice import (
    MARGIN_Z,
    _placements,
    accuracy_difference_se,
    auc_difference_se,
    choose_head,
    difference_se,
)
from vesper.party_b.metrics import compute_metric, roc_auc

HEADS = ("edge-free", "graph", "combined")


def test_the_accuracy_se_is_the_sd_of_the_per_node_difference_over_root_n() -> None:
    truth = torch.tensor([0, 1, 1, 0, 1])
    base = torch.tensor([[1.0, 0], [0, 1], [1, 0], [1, 0], [1, 0]])  # right on nodes 0, 1, 3
    other = torch.tensor([[1.0, 0], [0, 1], [0, 1], [0, 1], [0, 1]])  # right on nodes 0, 1, 2, 4
    difference = np.array([0, 0, 1, -1, 1], dtype=float)
    assert accuracy_difference_se(truth, base, other) == pytest.approx(difference.std(ddof=1) / math.sqrt(5))
    assert accuracy_difference_se(truth[:1], base[:1], other[:1]) == math.inf


def _binary_heads(n: int, seed: int, strength: tuple[float, float] = (1.0, 1.2)) -> tuple[torch.Tensor, ...]:
    """Labels and two heads' logits that share most of their noise (paired, as B's heads are)."""
    generator = torch.Generator().manual_seed(seed)
    truth = (torch.rand(n, generator=generator) < 0.3).long()
    shared = torch.randn(n, generator=generator)
    heads = []
    for s in strength:
        score = s * truth + shared + 0.5 * torch.randn(n, generator=generator)
        heads.append(torch.stack([torch.zeros(n), score], dim=1))
    return truth, *heads


def test_delong_components_average_to_the_auc_and_the_se_matches_a_bootstrap() -> None:
    truth, base, other = _binary_heads(3000, seed=0)
    positive = truth.numpy().astype(bool)
    scores = torch.softmax(other.double(), dim=1)[:, 1].numpy()
    v10, v01 = _placements(scores, positive)
    assert v10.mean() == pytest.approx(roc_auc(scores, truth.numpy())) == pytest.approx(v01.mean())
    rng = np.random.default_rng(0)
    differences = []
    for _ in range(400):
        index = torch.from_numpy(rng.integers(0, len(truth), len(truth)))
        differences.append(
            compute_metric("roc_auc", other[index], truth[index]) - compute_metric("roc_auc", base[index], truth[index])
        )
    assert auc_difference_se(truth, base, other) == pytest.approx(np.std(differences), rel=0.15)
    # paired: below the SE of the AUC alone (against a constant score), which keeps the shared noise
    alone = auc_difference_se(truth, torch.zeros_like(base), other)
    assert auc_difference_se(truth, base, other) < alone
    assert auc_difference_se(torch.zeros_like(truth), base, other) == math.inf  # one class: nothing to rank


def _choice(z: float, truth: torch.Tensor, logits: dict[str, torch.Tensor], metric: str = "roc_auc"):
    validation = {head: compute_metric(metric, values, truth) for head, values in logits.items()}
    return choose_head(metric, truth, logits, validation, z)


def test_the_rival_is_kept_exactly_when_its_lead_exceeds_z_standard_errors() -> None:
    truth, base, other = _binary_heads(1500, seed=3, strength=(1.0, 1.1))
    logits = {"edge-free": base, "graph": other, "combined": base.clone()}
    found = _choice(MARGIN_Z, truth, logits)
    assert found.rival == "graph" and found.lead > 0 and 0 < found.standard_error < math.inf
    assert found.standard_error == pytest.approx(difference_se("roc_auc", truth, base, other))
    assert found.errors["combined"] == 0.0  # a copy of the edge-free head: its difference is nil
    ratio = found.lead / found.standard_error
    assert _choice(ratio * 0.99, truth, logits).head == "graph"
    assert _choice(ratio * 1.01, truth, logits).head == "edge-free"


def test_a_clear_lead_takes_the_rival_and_a_worse_rival_never() -> None:
    truth, base, other = _binary_heads(1500, seed=4, strength=(0.3, 2.0))
    assert _choice(MARGIN_Z, truth, {"edge-free": base, "graph": other, "combined": base}).head == "graph"
    assert _choice(MARGIN_Z, truth, {"edge-free": other, "graph": base, "combined": base}).head == "edge-free"


def test_heads_that_are_level_keep_the_edge_free_head_where_the_plain_maximum_would_not() -> None:
    """The winner's curse: three heads of one quality, each with its own noise. Taking the best by
    validation leaves the edge-free head about two times in three; the rule keeps it mostly."""
    maximum = rule = 0
    trials = 200
    for trial in range(trials):
        generator = torch.Generator().manual_seed(trial)
        truth = torch.randint(0, 4, (600,), generator=generator)
        signal = torch.nn.functional.one_hot(truth, 4).float() * 1.5 + torch.randn(600, 4, generator=generator)
        logits = {head: signal + 0.7 * torch.randn(600, 4, generator=generator) for head in HEADS}
        validation = {head: compute_metric("accuracy", values, truth) for head, values in logits.items()}
        maximum += max(HEADS, key=lambda head: (validation[head], -HEADS.index(head))) != "edge-free"
        rule += choose_head("accuracy", truth, logits, validation).head != "edge-free"
    assert maximum / trials > 0.5
    assert rule / trials < 0.35
