"""Membership inference from party B's position (auditor/membership_attack.py, docs/audit-attacks.md).

Records are built the way party B keeps them (party_b/release_record.py): one evaluation
release and one posterior per node, with its split. "Leaky" records give B's training
nodes (members) confident, correct posteriors and held-out nodes diffuse ones; "null"
records draw every posterior from one distribution, whatever the split.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vesper.auditor import membership_attack as ma
from vesper.auditor.received_releases import ReceivedReleases
from vesper.party_b.release_record import SPLIT_CODES

DIM = 16
NULL_TOLERANCE = 0.05  # |mean AUC − 0.5| over seeds; one AUC's null std here is ≈ 0.02 (≈ 700 vs 350 targets)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def record(
    nodes: int, classes: int, seed: int, member_margin: float, other_margin: float
) -> tuple[ReceivedReleases, np.ndarray]:
    """A record of ``nodes`` nodes split 50/25/25 (train/val/test); each posterior is the softmax
    of N(0, 1) logits plus ``member_margin`` (train) or ``other_margin`` (val, test) on the true
    class. Evaluation releases are noisy class centres, so a shadow decoder has something to learn."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, nodes)
    splits = rng.choice(3, nodes, p=[0.5, 0.25, 0.25])
    centres = rng.normal(size=(classes, DIM)) * 0.6
    releases = (centres[labels] + rng.normal(size=(nodes, DIM))).astype(np.float32)[:, :, None]
    logits = rng.normal(size=(nodes, classes))
    logits[np.arange(nodes), labels] += np.where(splits == SPLIT_CODES["train"], member_margin, other_margin)
    posteriors = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    received = ReceivedReleases(
        train_sum=np.zeros((nodes, DIM, 1)), train_count=np.zeros(nodes, np.int64),
        eval_embedding=releases, eval_seen=np.ones(nodes, bool),
        posterior_ids=np.arange(nodes), posterior_splits=splits, posteriors=posteriors.astype(np.float32),
    )
    return received, labels


# -- the shadow-model attack (more than two classes) -----------------------------------------------
def test_shadow_attack_finds_confident_members() -> None:
    received, labels = record(1200, 4, seed=0, member_margin=5.0, other_margin=0.5)
    result = ma.membership_attack(received, labels, 4, seed=0)
    assert result.attack == "shadow"
    assert result.auc > 0.9
    assert result.members == received.split_ids("train").size


def test_shadow_attack_takes_under_five_seconds_on_a_small_record() -> None:
    # the first call pays for imports (torch's optimisers, scipy.stats): not the attack's cost
    ma.membership_attack(*record(200, 3, seed=5, member_margin=1.0, other_margin=1.0), 3, seed=5)
    received, labels = record(1200, 4, seed=3, member_margin=5.0, other_margin=0.5)
    start = time.process_time()  # CPU time: the shared test machine's load does not count (one torch thread)
    ma.membership_attack(received, labels, 4, seed=3)
    assert time.process_time() - start < 5.0


def test_shadow_attack_is_at_chance_when_posteriors_do_not_depend_on_membership() -> None:
    aucs = []
    for seed in range(3):
        received, labels = record(1400, 4, seed=seed, member_margin=1.0, other_margin=1.0)
        aucs.append(ma.membership_attack(received, labels, 4, seed=seed).auc)
    assert abs(statistics.fmean(aucs) - 0.5) < NULL_TOLERANCE, aucs
    assert all(abs(a - 0.5) < 2 * NULL_TOLERANCE for a in aucs), aucs


def test_shadow_set_comes_from_the_validation_split_and_is_not_scored() -> None:
    received, labels = record(1200, 4, seed=1, member_margin=5.0, other_margin=0.5)
    per_class = 20
    result = ma.membership_attack(received, labels, 4, seed=1, shadow_per_class=per_class)
    assert result.shadow_nodes == 4 * per_class  # every class has more than 20 validation nodes here
    assert result.non_members == received.split_ids("test").size  # validation nodes are spent on the shadow
    assert "validation split" in result.note


def test_shadow_pool_falls_back_to_half_the_test_split_without_validation_posteriors() -> None:
    received, labels = record(1200, 4, seed=2, member_margin=5.0, other_margin=0.5)
    keep = received.posterior_splits != SPLIT_CODES["val"]
    without_val = ReceivedReleases(
        received.train_sum, received.train_count, received.eval_embedding, received.eval_seen,
        received.posterior_ids[keep], received.posterior_splits[keep], received.posteriors[keep],
    )
    result = ma.membership_attack(without_val, labels, 4, seed=2)
    tests = received.split_ids("test").size
    assert result.non_members == tests - tests // 2
    assert result.shadow_nodes <= tests // 2
    assert result.auc > 0.9


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1), classes=st.integers(2, 6), per_class=st.integers(1, 30), size=st.integers(1, 200),
)
def test_shadow_split_is_disjoint_within_the_pool_and_capped_per_class(
    seed: int, classes: int, per_class: int, size: int
) -> None:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, 500)
    pool = rng.choice(500, size=size, replace=False)
    shadow_in, shadow_out = ma.shadow_split(pool, labels, per_class, rng)
    assert np.intersect1d(shadow_in, shadow_out).size == 0
    assert np.isin(shadow_in, pool).all() and np.isin(shadow_out, pool).all()
    chosen = np.concatenate([shadow_in, shadow_out])
    assert np.unique(chosen).size == chosen.size
    counts = np.bincount(labels[chosen], minlength=classes)
    available = np.bincount(labels[pool], minlength=classes)
    assert (counts == np.minimum(available, per_class)).all()


def test_a_record_without_training_posteriors_is_refused() -> None:
    received, labels = record(300, 4, seed=0, member_margin=5.0, other_margin=0.5)
    keep = received.posterior_splits != SPLIT_CODES["train"]
    no_tfts = ReceivedReleases(
        received.train_sum, received.train_count, received.eval_embedding, received.eval_seen,
        received.posterior_ids[keep], received.posterior_splits[keep], received.posteriors[keep],
    )
    with pytest.raises(ValueError, match="audit.membership"):
        ma.membership_attack(no_tfts, labels, 4, seed=0)


# -- the entropy attack (two classes) --------------------------------------------------------------
def test_two_classes_use_the_entropy_attack_and_find_confident_members() -> None:
    received, labels = record(1000, 2, seed=0, member_margin=5.0, other_margin=0.3)
    result = ma.membership_attack(received, labels, 2, seed=0)
    assert result.attack == "entropy" and result.shadow_nodes == 0
    assert result.auc > 0.9 and result.auc == result.entropy_auc
    assert result.non_members == received.split_ids("val").size + received.split_ids("test").size


def test_entropy_attack_is_at_chance_without_a_membership_signal() -> None:
    records = [record(1400, 2, seed=s, member_margin=1.0, other_margin=1.0) for s in range(5)]
    aucs = [ma.membership_attack(received, labels, 2, seed=s).auc for s, (received, labels) in enumerate(records)]
    assert abs(statistics.fmean(aucs) - 0.5) < NULL_TOLERANCE, aucs


@settings(max_examples=50, deadline=None)
@given(logits=st.lists(st.lists(st.floats(-30, 30), min_size=2, max_size=8), min_size=1, max_size=20).filter(
    lambda rows: len({len(r) for r in rows}) == 1
))
def test_entropy_lies_between_zero_and_log_classes(logits: list[list[float]]) -> None:
    z = np.asarray(logits)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    h = ma.posterior_entropy(p)
    assert (h >= -1e-9).all() and (h <= math.log(z.shape[1]) + 1e-9).all()
    assert np.allclose(ma.posterior_entropy(np.eye(z.shape[1])), 0.0)
    assert np.allclose(ma.posterior_entropy(np.full((1, z.shape[1]), 1 / z.shape[1])), math.log(z.shape[1]))


def test_a_node_evaluated_twice_counts_once_with_its_last_posterior() -> None:
    received, _ = record(50, 3, seed=0, member_margin=1.0, other_margin=1.0)
    doubled = ReceivedReleases(
        received.train_sum, received.train_count, received.eval_embedding, received.eval_seen,
        np.concatenate([received.posterior_ids, [7]]),
        np.concatenate([received.posterior_splits, [received.posterior_splits[7]]]),
        np.concatenate([received.posteriors, np.full((1, 3), 1 / 3, np.float32)]),
    )
    unique = ma.unique_posteriors(doubled)
    assert unique.ids.size == 50
    assert np.allclose(unique.rows(np.array([7])), 1 / 3)
