"""Party B's metrics, decoders and session."""

import copy

import numpy as np
import pytest
import torch

from vesper.common.config import DecoderConfig, OptimizerConfig
from vesper.common.dataset_files import resolve_dataset
from vesper.party_b.decoders import build_decoder
from vesper.party_b.label_data import load_labels
from vesper.party_b.metrics import accuracy, compute_metric, roc_auc
from vesper.party_b.session import LabelSession


def test_roc_auc_matches_the_pairwise_definition() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 200).astype(float)  # many ties
    labels = rng.random(200) < 0.3
    pos, neg = scores[labels], scores[~labels]
    pairwise = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) / (pos.size * neg.size)
    assert roc_auc(scores, labels) == pytest.approx(pairwise)
    assert roc_auc(np.array([0.1, 0.9]), np.array([0, 1])) == 1.0
    with pytest.raises(ValueError, match="one positive and one negative"):
        roc_auc(np.array([0.1, 0.2]), np.array([1, 1]))


def test_accuracy_and_metric_names() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
    labels = torch.tensor([0, 1, 1])
    assert accuracy(logits, labels) == pytest.approx(2 / 3)
    # positives score 0.73 and 0.12, the negative 0.12: one win and one tie
    assert compute_metric("roc_auc", logits, labels) == pytest.approx(0.75)


@pytest.mark.parametrize("kind", ["concat", "gru"])
def test_decoders_read_b_by_d_by_l(kind: str) -> None:
    decoder = build_decoder(DecoderConfig(kind=kind, hidden_dim=16), dim=8, layers=3, classes=5)
    assert decoder(torch.rand(4, 8, 3)).shape == (4, 5)


def test_session_returns_the_gradient_of_the_mean_loss() -> None:
    store = load_labels(resolve_dataset("cora"), split_seed=0)
    session = LabelSession("r", store, DecoderConfig(hidden_dim=16), OptimizerConfig(), 8, 2, "float32", 0, torch.device("cpu"))
    before = copy.deepcopy(session.decoder)
    ids = torch.from_numpy(store.split.train[:6])
    embeddings = torch.rand(6, 8, 2)
    gradient, loss = session.train_step(ids, embeddings)
    assert gradient.shape == (6, 8, 2) and session.next_step == 1
    # eq. 38: dLoss/dH of the mean cross-entropy, under the decoder as it was before the update
    probe = embeddings.clone().requires_grad_(True)
    expected_loss = torch.nn.functional.cross_entropy(before(probe), store.labels[ids])
    expected_loss.backward()
    assert torch.allclose(gradient, probe.grad, atol=1e-6)
    assert loss == pytest.approx(expected_loss.item(), rel=1e-6)
    assert not all(torch.equal(a, b) for a, b in zip(before.parameters(), session.decoder.parameters()))
