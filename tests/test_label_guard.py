"""Party B's label guard without services: write-ahead charging of B's own ledger, and
what a refusal leaves behind (docs/label-privacy.md).

A recording accountant client stands in for the real one (the services are exercised in
tests/test_e2e_label_privacy.py); it checks, at every charge, that nothing derived from
the labels exists yet.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import dp_accounting as dpa
import numpy as np
import pytest
import torch

from vesper.common.accountant_client import BudgetRefused
from vesper.common.config import LabelPrivacyConfig
from vesper.common.dataset_files import LabelPart
from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.events import event_from_json
from vesper.common.privacy.ledger import label_ledger_id
from vesper.common.splits import split_for
from vesper.party_b.label_data import LabelStore
from vesper.party_b.label_guard import LabelGuard, LabelGuardError, default_delta
from vesper.party_b.label_privacy import pate, randomized_response

N, CLASSES = 400, 4


def store(seed: int = 0) -> LabelStore:
    labels = np.random.default_rng(seed).integers(0, CLASSES, N)
    part = LabelPart(labels=labels, masks=None)
    return LabelStore(torch.from_numpy(labels), split_for(part, 3, label_independent=True), CLASSES, "accuracy")


class RecordingClient:
    """The accountant as B sees it; ``refuse_after`` charges are accepted, then refusals."""

    def __init__(self, refuse_after: int | None = None) -> None:
        self.calls: list[tuple] = []
        self.refuse_after = refuse_after
        self.events: list[dpa.DpEvent] = []
        self.delta = None
        self.on_charge = lambda: None

    def create_run(self, run_id, epsilon_budget, delta, rules, extractor, accounting, accountant, details, note, privacy_unit):
        self.calls.append(("create", run_id, privacy_unit, accounting))
        self.delta = delta

    def charge(self, run_id, key, pass_id, kind, num_nodes, digest, event_json):
        self.on_charge()
        if self.refuse_after is not None and len(self.events) >= self.refuse_after:
            raise BudgetRefused("over budget")
        self.calls.append(("charge", key, kind))
        self.events.append(event_from_json(event_json))
        spent = epsilon_of(dpa.ComposedDpEvent(self.events), self.delta).epsilon
        return SimpleNamespace(epsilon_spent=spent)

    def close_run(self, run_id, status, reason):
        self.calls.append(("close", status))


def guard(mode: str, client, epsilon: float = 2.0, **pate) -> LabelGuard:
    config = LabelPrivacyConfig(mode=mode, epsilon=epsilon, pate=pate)
    return LabelGuard("run1", config, store(), torch.Generator().manual_seed(7), client)


def test_rr_charges_before_any_privatised_label_exists() -> None:
    client = RecordingClient()
    g = guard("rr", client)
    truth = g.store.labels.clone()
    client.on_charge = lambda: (_ for _ in ()).throw(AssertionError("labels changed before the charge")) if not torch.equal(
        g.train_labels, truth) else None
    g.open()
    assert [c[0] for c in client.calls] == ["create", "charge"]
    assert client.calls[0][1:] == (label_ledger_id("run1"), "label", "labels")
    (event,) = client.events
    assert isinstance(event, dpa.RandomizedResponseDpEvent) and event.num_buckets == CLASSES
    assert g.epsilon_spent <= 2.0
    train = g.train_roots
    changed = (g.train_labels[train] != truth[train]).double().mean().item()
    keep = randomized_response.keep_probability(2.0, CLASSES)
    assert abs((1 - changed) - keep) < 4 * math.sqrt(keep * (1 - keep) / train.numel())
    outside = torch.ones(N, dtype=torch.bool)
    outside[train] = False
    assert torch.equal(g.train_labels[outside], truth[outside])  # held-out labels are never privatised or used


def test_rr_refused_leaves_the_true_labels_unused() -> None:
    g = guard("rr", RecordingClient(refuse_after=0))
    with pytest.raises(BudgetRefused):
        g.open()
    assert torch.equal(g.train_labels, g.store.labels) and g.note == ""


def test_label_privacy_without_an_accountant_is_refused_by_name() -> None:
    with pytest.raises(LabelGuardError, match="party_b.accountant"):
        guard("rr", None).open()


def test_pate_charges_every_query_before_answering() -> None:
    client = RecordingClient()
    g = guard("pate", client, epsilon=4.0, teachers=10, queries=40, teacher_epochs=20)
    g.open()
    assert g.train_roots.numel() == 0 and g.query_ids.numel() == 40
    assert torch.isin(g.query_ids, torch.from_numpy(g.store.split.val)).all()
    sigma1, sigma2 = g.sigmas
    assert sigma1 == sigma2  # calibrated together
    teacher_ids = torch.from_numpy(g.store.split.train)
    embeddings = torch.nn.functional.one_hot(g.store.labels, CLASSES).float() * 3 + torch.randn(N, CLASSES)
    answered_before = []
    client.on_charge = lambda: answered_before.append(g.train_roots.numel())
    outcome = g.answer_queries(teacher_ids, embeddings[teacher_ids, :, None], g.query_ids, embeddings[g.query_ids, :, None])
    assert set(answered_before) == {0}  # no answer existed while any query was being charged
    assert [c[0] for c in client.calls].count("charge") == 40
    assert all(e == pate.query_event(sigma1, sigma2) for e in client.events)
    threshold_step, gnmax_step = client.events[0].events
    assert threshold_step.noise_multiplier == sigma1 and math.isclose(gnmax_step.noise_multiplier, sigma2 / math.sqrt(2))
    assert outcome.epsilon_spent <= 4.0 and outcome.epsilon_spent > 3.99
    assert torch.isin(outcome.answered_ids, g.query_ids).all()
    assert torch.equal(g.train_mask.nonzero().flatten(), outcome.answered_ids.sort().values)
    with pytest.raises(LabelGuardError, match="already answered"):
        g.answer_queries(teacher_ids, embeddings[teacher_ids, :, None], g.query_ids, embeddings[g.query_ids, :, None])


def test_pate_refused_mid_way_answers_nothing() -> None:
    g = guard("pate", RecordingClient(refuse_after=5), epsilon=4.0, teachers=10, queries=40, teacher_epochs=5)
    g.open()
    ids = torch.from_numpy(g.store.split.train)
    emb = torch.randn(N, 8, 1)
    with pytest.raises(BudgetRefused):
        g.answer_queries(ids, emb[ids], g.query_ids, emb[g.query_ids])
    assert g.train_roots.numel() == 0 and not g.train_mask.any() and torch.equal(g.train_labels, g.store.labels)


def test_pate_settings_b_cannot_honour_are_refused() -> None:
    with pytest.raises(LabelGuardError, match="exceeds B's"):
        guard("pate", RecordingClient(), teachers=1000).open()
    with pytest.raises(LabelGuardError, match="above the label budget"):
        guard("pate", RecordingClient(), epsilon=1.0, sigma1=1.0, sigma2=1.0).open()


def test_default_delta_is_below_one_over_the_protected_labels() -> None:
    assert default_delta(100) == 1e-5 and default_delta(10**6) == 1e-6
    assert guard("rr", RecordingClient()).delta == default_delta(len(store().split.train))


def test_the_split_b_sends_a_does_not_read_labels_under_label_privacy() -> None:
    first, second = store(0).split, store(1).split  # different labels, same seed
    assert all(np.array_equal(getattr(first, s), getattr(second, s)) for s in ("train", "val", "test"))
    stratified = [split_for(LabelPart(labels=store(seed).labels.numpy(), masks=None), 3).train for seed in (0, 1)]
    assert not np.array_equal(*stratified)  # the stratified split would have leaked them


def test_plain_gnmax_answers_every_query_and_pays_no_threshold_step() -> None:
    client = RecordingClient()
    g = guard("pate", client, epsilon=4.0, teachers=10, queries=30, teacher_epochs=5, aggregator="gnmax")
    g.open()
    assert g.sigmas[0] is None and g.threshold is None
    ids = torch.from_numpy(g.store.split.train)
    emb = torch.randn(N, 8, 1)
    outcome = g.answer_queries(ids, emb[ids], g.query_ids, emb[g.query_ids])
    assert outcome.answered_ids.numel() == 30
    (gnmax_step,) = client.events[0].events if isinstance(client.events[0], dpa.ComposedDpEvent) else (client.events[0],)
    assert math.isclose(gnmax_step.noise_multiplier, g.sigmas[1] / math.sqrt(2))
    assert 3.99 < outcome.epsilon_spent <= 4.0
