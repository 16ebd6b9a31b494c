"""The label-leakage attacks of a curious party A (auditor/label_attack.py, docs/label-leakage.md).

Gradients are made the way party B makes them (party_b/session.py, ``LabelSession.train_step``):
B's real decoder on A's embeddings, mean cross-entropy over a batch, autograd with respect to the
embeddings, an optimiser step; A keeps each root's gradient of the first and the last epoch.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from vesper.auditor import label_attack as la
from vesper.common.config import DecoderConfig, OptimizerConfig
from vesper.common.optim import build_optimizer
from vesper.party_b.decoders import build_decoder
from vesper.party_b.metrics import roc_auc

DIM, LAYERS = 16, 2


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Small tensors: one thread is faster, and two test processes on two cores do not thrash."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def b_gradients(labels: torch.Tensor, classes: int, seed: int, epochs: int = 3, batch: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(first-epoch, last-epoch) gradients B returns for each node, trained on ``labels``.

    A's embeddings are non-negative unit rows (what its extractors release), drawn
    independently of every label, so nothing but the gradients can carry a label.
    """
    generator = torch.Generator().manual_seed(seed)
    n = labels.numel()
    embeddings = torch.randn(n, DIM, LAYERS, generator=generator).abs()
    embeddings = embeddings / embeddings.norm(dim=1, keepdim=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        decoder = build_decoder(DecoderConfig(), DIM, LAYERS, classes)
    optimizer = build_optimizer(OptimizerConfig(), decoder.parameters())
    first, last = torch.zeros(n, DIM * LAYERS), torch.zeros(n, DIM * LAYERS)
    for epoch in range(epochs):
        for batch_ids in torch.randperm(n, generator=generator).split(batch):
            received = embeddings[batch_ids].detach().requires_grad_(True)  # as LabelSession.train_step
            loss = F.cross_entropy(decoder(received), labels[batch_ids])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            gradient = received.grad.detach().reshape(batch_ids.numel(), -1)
            if epoch == 0:
                first[batch_ids] = gradient
            if epoch == epochs - 1:
                last[batch_ids] = gradient
    return first.numpy(), last.numpy()


def randomised_response(labels: torch.Tensor, classes: int, epsilon: float, generator: torch.Generator) -> torch.Tensor:
    """k-ary RR: keep with e^ε/(e^ε + k − 1), else one of the other k − 1 classes uniformly."""
    keep = torch.rand(labels.shape, generator=generator) < math.exp(epsilon) / (math.exp(epsilon) + classes - 1)
    other = (labels + torch.randint(1, classes, labels.shape, generator=generator)) % classes
    return torch.where(keep, labels, other)


def imbalanced(n: int, seed: int, share: float = 0.2) -> torch.Tensor:
    return (torch.rand(n, generator=torch.Generator().manual_seed(seed)) < share).long()


# -- the attacks against B's real gradients -----------------------------------------------------
def test_true_labels_of_an_imbalanced_binary_task_leak_through_norm_and_direction() -> None:
    labels = imbalanced(2000, 1)
    first, last = b_gradients(labels, 2, seed=0)
    ids = np.arange(labels.numel())
    early, late = la.evaluate_attack(ids, first, labels, 2), la.evaluate_attack(ids, last, labels, 2)
    assert early.direction_auc > 0.95  # an untrained decoder already splits the classes by sign (G2)
    assert late.norm_auc > 0.9 and late.direction_auc > 0.9  # once it knows the prior, the minority's norm is larger
    assert late.headline == max(late.norm_auc, late.direction_auc) and late.chance == 0.5


def test_gradients_of_independent_random_labels_say_nothing_about_the_true_ones() -> None:
    """B trains on labels independent of the truth: every attack must sit at chance.

    Fails if an attack read the evaluation labels (it would score far above 0.5)."""
    truth, decoy = imbalanced(4000, 2), imbalanced(4000, 3)
    first, last = b_gradients(decoy, 2, seed=1)
    ids = np.arange(truth.numel())
    for gradients in (first, last):
        report = la.evaluate_attack(ids, gradients, truth, 2)
        assert abs(report.norm_auc - 0.5) < 0.05 and abs(report.direction_auc - 0.5) < 0.05
        assert la.evaluate_attack(ids, gradients, decoy, 2).headline > 0.9  # the same gradients do leak the decoy


def test_the_orientation_is_chosen_without_labels() -> None:
    """Complementing the evaluation labels must turn every AUC into 1 − AUC exactly: an
    attack that oriented itself with the labels would report max(AUC, 1 − AUC) both times."""
    labels = imbalanced(1000, 4)
    _, last = b_gradients(labels, 2, seed=2)
    ids = np.arange(labels.numel())
    straight, flipped = la.evaluate_attack(ids, last, labels, 2), la.evaluate_attack(ids, last, 1 - labels, 2)
    assert flipped.norm_auc == pytest.approx(1 - straight.norm_auc)
    assert flipped.direction_auc == pytest.approx(1 - straight.direction_auc)
    assert straight.direction_auc > 0.9 > flipped.direction_auc


def test_five_classes_cluster_by_label() -> None:
    labels = torch.randint(0, 5, (1500,), generator=torch.Generator().manual_seed(5))
    first, last = b_gradients(labels, 5, seed=3)
    for gradients in (first, last):
        report = la.evaluate_attack(np.arange(labels.numel()), gradients, labels, 5)
        assert report.task == "multiclass" and report.headline_attack == "cluster"
        assert report.cluster_accuracy > report.matched_chance + 0.4
        assert report.matched_chance < 0.3 and report.chance < 0.25


def test_randomised_response_pushes_the_attack_down_to_its_dp_ceiling_and_not_below_a_wrong_one() -> None:
    """k-RR at decreasing ε: the mean headline AUC decreases, stays within C3's ceiling
    (up to sampling error), and comes close to it, so that a ceiling claimed for half the
    ε (a deliberately too-small bound) is exceeded and caught."""
    truth_labels = imbalanced(3000, 6)
    ids = np.arange(truth_labels.numel())
    means = {}
    for epsilon in (4.0, 2.0, 1.0, 0.5):
        values = []
        for seed in range(3):
            private = randomised_response(truth_labels, 2, epsilon, torch.Generator().manual_seed(100 + seed))
            first, last = b_gradients(private, 2, seed=seed, epochs=2)
            values.append(max(la.evaluate_attack(ids, g, truth_labels, 2).headline for g in (first, last)))
        means[epsilon] = statistics.fmean(values)
        ceiling = la.auc_ceiling(epsilon)
        standard_error = la.auc_standard_error(ceiling, int(truth_labels.sum()), int((1 - truth_labels).sum()))
        assert means[epsilon] <= ceiling + 3 * standard_error / math.sqrt(3)
        assert means[epsilon] > ceiling - 0.05  # the attack nearly attains it: the ceiling is tight
        assert means[epsilon] > la.auc_ceiling(epsilon / 2) + 3 * standard_error  # a too-small claim is caught
    assert means[4.0] > means[2.0] > means[1.0] > means[0.5] > 0.55


# -- the ceilings (docs/label-leakage.md, section 4) ---------------------------------------------
@given(st.floats(0.0, 12.0), st.floats(0.0, 0.2))
@settings(max_examples=60, deadline=None)
def test_auc_ceiling_is_the_area_under_the_dp_hypothesis_testing_boundary(epsilon: float, delta: float) -> None:
    x = np.linspace(0.0, 1.0, 200_001)
    boundary = np.minimum.reduce([
        math.exp(epsilon) * x + delta, 1 - math.exp(-epsilon) * (1 - delta - x), np.ones_like(x),
    ])
    area = float(np.sum((boundary[1:] + boundary[:-1]) / 2 * np.diff(x)))
    assert la.auc_ceiling(epsilon, delta) == pytest.approx(area, abs=1e-6)
    if delta == 0:
        assert la.auc_ceiling(epsilon) == pytest.approx(math.exp(epsilon) / (1 + math.exp(epsilon)))
    assert la.auc_ceiling(epsilon + 0.1, delta) >= la.auc_ceiling(epsilon, delta)


def test_auc_ceiling_edges() -> None:
    assert la.auc_ceiling(0.0) == pytest.approx(0.5) and la.auc_ceiling(math.inf) == 1.0
    with pytest.raises(ValueError):
        la.auc_ceiling(-1.0)


@given(st.floats(0.05, 6.0), st.integers(2, 6))
@settings(max_examples=25, deadline=None)
def test_accuracy_ceiling_with_a_uniform_prior_is_the_closed_form(epsilon: float, classes: int) -> None:
    prior = np.full(classes, 1 / classes)
    e = math.exp(epsilon)
    assert la.accuracy_ceiling(epsilon, prior) == pytest.approx(e / (e + classes - 1), abs=1e-7)
    delta = 1e-3
    assert la.accuracy_ceiling(epsilon, prior, delta) == pytest.approx((e + (classes - 1) * delta) / (e + classes - 1), abs=1e-7)
    if classes == 2:  # two classes, uniform prior: the accuracy and the AUC ceilings coincide
        assert la.accuracy_ceiling(epsilon, prior) == pytest.approx(la.auc_ceiling(epsilon), abs=1e-7)


@given(st.lists(st.floats(0.01, 1.0), min_size=2, max_size=6), st.floats(0.05, 5.0))
@settings(max_examples=30, deadline=None)
def test_accuracy_ceiling_bounds_every_estimator_on_randomised_response(weights: list[float], epsilon: float) -> None:
    prior = np.array(weights) / sum(weights)
    k, e = prior.size, math.exp(epsilon)
    keep, move = e / (e + k - 1), 1 / (e + k - 1)
    # the Bayes (MAP) estimator on k-RR's output, which is ε-DP: no estimator on it does better
    bayes = sum(max(prior[c] * keep, max(prior[y] * move for y in range(k) if y != c)) for c in range(k))
    ceiling = la.accuracy_ceiling(epsilon, prior)
    assert bayes <= ceiling + 1e-7
    assert prior.max() - 1e-9 <= ceiling <= min(1.0, e * prior.max()) + 1e-7  # a constant guess is 0-DP


# -- properties of the attacks --------------------------------------------------------------------
gradient_matrices = st.integers(0, 10_000).map(
    lambda seed: np.random.default_rng(seed).normal(size=(60, 6)) * np.random.default_rng(seed + 1).uniform(0.1, 3, (60, 1))
)


@given(gradient_matrices, st.floats(0.1, 10.0), st.integers(0, 10_000))
@settings(max_examples=40, deadline=None)
def test_direction_scores_ignore_row_scale_and_a_global_sign(gradients: np.ndarray, scale: float, seed: int) -> None:
    rescaled = gradients * np.random.default_rng(seed).uniform(0.1, 10, (gradients.shape[0], 1))
    base = la.direction_scores(gradients)
    np.testing.assert_allclose(la.direction_scores(rescaled), base, atol=1e-9)
    np.testing.assert_allclose(la.direction_scores(-scale * gradients), base, atol=1e-9)  # label-free orientation
    positive = base > 0
    assert positive.sum() <= (~positive).sum() + (base == 0).sum()  # the minority side scores high
    np.testing.assert_allclose(la.norm_scores(scale * gradients), scale * la.norm_scores(gradients), rtol=1e-12)


@given(st.integers(0, 10_000), st.integers(2, 6))
@settings(max_examples=30, deadline=None)
def test_matched_accuracy_does_not_care_how_clusters_are_named(seed: int, classes: int) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, 200)
    clusters = np.where(rng.random(200) < 0.7, labels, rng.integers(0, classes, 200))
    renamed = rng.permutation(classes)[clusters]
    assert la.matched_accuracy(renamed, labels, classes) == pytest.approx(la.matched_accuracy(clusters, labels, classes))
    assert la.matched_accuracy(rng.permutation(classes)[labels], labels, classes) == 1.0


def test_the_auc_standard_error_bounds_the_spread_of_randomised_response_aucs() -> None:
    """Var(AUC) ≤ A(1 − A)/min(n₊, n₋): checked on the AUC of RR's own output, whose
    expectation is the ceiling, at a moderate ε and at ε = 8 (where Hanley-McNeil gives ~0)."""
    rng = np.random.default_rng(11)
    labels = (np.arange(400) < 100).astype(int)
    for epsilon in (1.0, 8.0):
        ceiling = la.auc_ceiling(epsilon)
        keep = rng.random((1500, labels.size)) < math.exp(epsilon) / (1 + math.exp(epsilon))
        aucs = [roc_auc(np.where(k, labels, 1 - labels), labels) for k in keep]
        assert statistics.fmean(aucs) == pytest.approx(ceiling, abs=3 * la.auc_standard_error(ceiling, 100, 300) / math.sqrt(1500))
        assert statistics.stdev(aucs) <= la.auc_standard_error(ceiling, 100, 300)
    assert la.auc_standard_error(0.5, 100, 300) == pytest.approx(math.sqrt(0.25 / 100))
    assert la.accuracy_standard_error(0.3, 100) == pytest.approx(math.sqrt(0.21 / 100))


def test_zero_gradients_stay_zero_and_evaluation_checks_its_inputs() -> None:
    gradients = np.zeros((4, 3))
    gradients[:2] = [[1, 0, 0], [-1, 0, 0]]
    assert (la.unit_rows(gradients)[2:] == 0).all() and (la.direction_scores(gradients)[2:] == 0).all()
    with pytest.raises(ValueError, match="same nodes"):
        la.evaluate_attack(np.arange(3), gradients, np.array([0, 1, 0, 1]), 2)
    with pytest.raises(ValueError, match="both classes"):
        la.evaluate_attack(np.arange(4), gradients, np.zeros(4, dtype=int), 2)
    with pytest.raises(ValueError, match="repeat"):
        la.evaluate_attack(np.array([0, 0, 1, 2]), gradients, np.array([0, 1, 0, 1]), 2)
    with pytest.raises(ValueError, match="non-finite"):
        la.evaluate_attack(np.arange(4), np.full((4, 3), np.nan), np.array([0, 1, 0, 1]), 2)
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        la.evaluate_attack(np.arange(4), gradients, np.array([0, 1, 2, 1]), 2)


def test_roc_auc_reused_from_party_b_is_the_rank_statistic() -> None:
    assert roc_auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)


# -- A's record on disk ---------------------------------------------------------------------------
def _save(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_load_recorded_reads_what_party_a_writes(tmp_path: Path) -> None:
    from vesper.party_a.gradient_record import GradientRecord

    record = GradientRecord(epochs=2, num_classes=3)
    record.add(0, torch.tensor([5, 2]), torch.ones(2, 4, 2))
    record.add(1, torch.tensor([2, 5, 9]), torch.full((3, 4, 2), 2.0))  # node 9: last epoch only
    record.save(tmp_path / "gradients.npz")
    loaded = la.load_recorded(tmp_path / "gradients.npz")
    assert loaded.node_ids.tolist() == [2, 5, 9] and loaded.num_classes == 3
    assert loaded.gradients.shape == (3, 8) and (loaded.gradients == 2).all()
    assert loaded.first_recorded.tolist() == [True, True, False]
    assert (loaded.first_gradients[:2] == 1).all()


def test_load_recorded_explains_what_is_wrong(tmp_path: Path) -> None:
    good = {"node_ids": np.arange(3), "gradients": np.ones((3, 4), np.float32), "num_classes": np.int64(2)}
    assert la.load_recorded(_save(tmp_path / "ok.npz", **good)).first_gradients is None
    with pytest.raises(la.RecordedGradientsError, match="record_gradients"):
        la.load_recorded(tmp_path / "absent.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(la.RecordedGradientsError, match="readable"):
        la.load_recorded(tmp_path / "junk.npz")
    broken = {
        "lacks gradients": {k: v for k, v in good.items() if k != "gradients"},
        "one row per node": {**good, "gradients": np.ones((2, 4))},
        "repeat": {**good, "node_ids": np.array([0, 0, 1])},
        "integers": {**good, "node_ids": np.array([0.0, 1.0, 2.0])},
        "non-finite": {**good, "gradients": np.array([[np.inf] * 4] * 3)},
        "does not match": {**good, "first_gradients": np.ones((3, 5))},
        "outside whole missing": {**good, "first_gradients": np.array([[np.nan, 1, 1, 1]] * 3)},
        "num_classes": {**good, "num_classes": np.int64(1)},
    }
    for message, arrays in broken.items():
        with pytest.raises(la.RecordedGradientsError, match=message):
            la.load_recorded(_save(tmp_path / "bad.npz", **arrays))
