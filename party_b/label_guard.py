"""Party B's protection of its labels against party A, charged to B's own ledger.

One :class:`LabelGuard` per run, shared by the run's sessions (a stage's session and the
main one train on the same privatised labels and pay once). Modes (docs/label-privacy.md):

``none``  the true training labels; no ledger.
``rr``    at set-up B opens its ledger, charges one k-ary randomised response at ε and
          only then draws the privatised labels; everything B computes from them later
          (gradients, decoder, training metrics) is post-processing.
``pate``  at set-up B opens its ledger and draws the Q query nodes from its validation
          split. After A's Collect stream (A's frozen embeddings of B's labelled nodes and
          of the queries) B charges every query (both steps of Confident-GNMax,
          data-independent), then trains its teachers and labels the answered queries:
          they are the student's training roots, with the teachers' noisy labels.

B's ledger is a run of its own at the accountant (``<run id>.labels``, privacy unit
``label``, accounting ``labels``), charged with B's credential; it is never added to A's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from vesper.common.accountant_client import AccountantClient, nodes_digest
from vesper.common.config import LabelPrivacyConfig
from vesper.common.secret_randomness import secret_base
from vesper.common.wire import node_mask
from vesper.party_b.label_data import LabelStore

if TYPE_CHECKING:
    import dp_accounting as dpa

# The mechanisms and the privacy math (dp-accounting, scipy: slow to import, docs/performance-notes.md) are imported
# by the modes that use them, so that party B starts fast and a run without label privacy
# never loads them.

PASS_ID = "labels-0"


class LabelGuardError(ValueError):
    """A label-privacy request B cannot honour (bad settings, or no accountant)."""


def default_delta(train_nodes: int) -> float:
    """min(1e-5, 1/n): below one over the number of protected labels."""
    return min(1e-5, 1.0 / max(2, train_nodes))


def secret_generator(secret_seed: int | None, run_seed: int) -> torch.Generator:
    """B's randomness for its label mechanisms, never derived from anything A knows."""
    return torch.Generator().manual_seed(secret_base(secret_seed, run_seed))


@dataclass
class CollectOutcome:
    answered_ids: torch.Tensor
    epsilon_spent: float
    note: str


@dataclass
class LabelGuard:
    run_id: str
    config: LabelPrivacyConfig
    store: LabelStore
    generator: torch.Generator
    client: AccountantClient | None = None
    train_labels: torch.Tensor = field(init=False)  # [N]: what training sessions read
    train_roots: torch.Tensor = field(init=False)  # ids B accepts as training roots
    train_mask: torch.Tensor = field(init=False)  # the same, as a mask over all nodes
    query_ids: torch.Tensor = field(init=False)
    delta: float = 0.0
    epsilon_spent: float = 0.0
    note: str = ""
    collected: bool = False
    sigmas: tuple[float | None, float] | None = None  # (σ1, σ2); σ1 None: plain GNMax
    threshold: float | None = None

    def __post_init__(self) -> None:
        self.train_labels = self.store.labels.clone()
        self._set_roots(torch.from_numpy(self.store.split.train))
        self.query_ids = torch.empty(0, dtype=torch.int64)
        n_train = int(self.train_roots.numel())
        self.delta = self.config.delta or default_delta(n_train)

    def _set_roots(self, roots: torch.Tensor) -> None:
        self.train_roots = roots
        self.train_mask = node_mask(roots, self.store.num_nodes)

    # -- set-up ----------------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def ledger_id(self) -> str:
        if self.mode == "none":
            return ""
        from vesper.common.privacy.ledger import label_ledger_id

        return label_ledger_id(self.run_id)

    def open(self) -> None:
        """Open B's ledger and do the mode's set-up; nothing derived from labels has left B yet."""
        if self.mode == "rr":
            self._open_rr()
        elif self.mode == "pate":
            self._open_pate()

    def _client(self) -> AccountantClient:
        if self.client is None:
            raise LabelGuardError(
                f"label_privacy.mode={self.mode} needs party B's own ledger, but party B has no accountant "
                "configured (set party_b.accountant and party_b.accountant_token_file)"
            )
        return self.client

    def _create_ledger(self, event: dpa.DpEvent, details: dict, note: str) -> None:
        from vesper.common.privacy.events import event_to_json
        from vesper.common.privacy.ledger import LABEL_ACCOUNTING, LABEL_KIND, LABEL_UNIT, ChargeRule

        rule = ChargeRule(kind=LABEL_KIND, release_event=event_to_json(event), participation_bound=None)
        self._client().create_run(
            self.ledger_id, self.config.epsilon, self.delta, [rule], f"labels-{self.mode}", LABEL_ACCOUNTING,
            self.config.accountant, {"mode": self.mode, "labelled_train_nodes": int(self.train_roots.numel()),
                                     "num_classes": self.store.num_classes, **details},
            note, privacy_unit=LABEL_UNIT,
        )

    def _charge(self, key: str, node_ids: torch.Tensor, event: dpa.DpEvent) -> None:
        from vesper.common.privacy.events import event_to_json
        from vesper.common.privacy.ledger import LABEL_KIND

        receipt = self._client().charge(
            self.ledger_id, key, PASS_ID, LABEL_KIND, int(node_ids.numel()), nodes_digest(node_ids), event_to_json(event),
        )
        self.epsilon_spent = receipt.epsilon_spent

    def _open_rr(self) -> None:
        from vesper.party_b.label_privacy import randomized_response

        k = self.store.num_classes
        event = randomized_response.rr_event(self.config.epsilon, k)
        self._create_ledger(
            event,
            {"keep_probability": randomized_response.keep_probability(self.config.epsilon, k),
             "noise_parameter": event.noise_parameter},
            f"Randomised response over {k} classes at epsilon {self.config.epsilon:g}, drawn once per run.",
        )
        self._charge("rr/train", self.train_roots, event)  # write-ahead: before any privatised label is drawn
        private = randomized_response.randomize_labels(self.store.labels[self.train_roots], k, self.config.epsilon, self.generator)
        self.train_labels[self.train_roots] = private
        # only public quantities: the realised share of kept labels is a function of the labels
        keep = randomized_response.keep_probability(self.config.epsilon, k)
        self.note = f"randomised response over {k} classes at epsilon {self.config.epsilon:g} (keeps a label w.p. {keep:.3f})"

    def _open_pate(self) -> None:
        from vesper.common.privacy.accounting import epsilon_of
        from vesper.party_b.label_privacy import pate

        settings = self.config.pate
        n_train = int(self.train_roots.numel())
        if n_train < settings.teachers:
            raise LabelGuardError(
                f"label_privacy.pate.teachers={settings.teachers} exceeds B's {n_train} labelled training nodes"
            )
        self.query_ids = pate.select_queries(torch.from_numpy(self.store.split.val), settings.queries, self.generator)
        if self.query_ids.numel() == 0:
            raise LabelGuardError("label_privacy.mode=pate needs query nodes, but B's validation split is empty")
        queries = int(self.query_ids.numel())
        confident = settings.aggregator == "confident-gnmax"
        if settings.sigma2 is None:
            sigma = pate.calibrate_sigma(
                self.config.epsilon, self.delta, queries, self.config.accountant, threshold_step=confident
            )
            self.sigmas = (sigma if confident else None, sigma)
        else:
            self.sigmas = (settings.sigma1, float(settings.sigma2))
            planned = epsilon_of(pate.plan_event(*self.sigmas, queries), self.delta, self.config.accountant).epsilon
            if planned > self.config.epsilon:
                raise LabelGuardError(
                    f"{queries} queries at {self._sigma_text()} need label epsilon "
                    f"{planned:.4g}, above the label budget {self.config.epsilon:g}; nothing was sent"
                )
        self.threshold = (
            settings.threshold if settings.threshold is not None
            else pate.default_threshold(settings.teachers, self.store.num_classes)
        ) if confident else None
        steps = (
            "each charged for both steps (threshold: sensitivity 1; GNMax: sensitivity sqrt 2)" if confident
            else "each charged for GNMax (sensitivity sqrt 2)"
        )
        self._create_ledger(
            pate.query_event(*self.sigmas),
            {"teachers": settings.teachers, "queries": queries, "aggregator": settings.aggregator,
             "threshold": self.threshold, "sigma1": self.sigmas[0], "sigma2": self.sigmas[1]},
            f"DP-GPL: {settings.teachers} teachers on disjoint groups, {queries} {settings.aggregator} queries, "
            f"{steps}, data-independent.",
        )
        self._set_roots(torch.empty(0, dtype=torch.int64))  # the student's roots are the answered queries
        self.note = f"{queries} queries planned at {self._sigma_text()}"

    def _sigma_text(self) -> str:
        assert self.sigmas is not None
        sigma1, sigma2 = self.sigmas
        return (f"sigma1={sigma1:.4g}, " if sigma1 is not None else "") + f"sigma2={sigma2:.4g}"

    # -- pate: teachers, queries, student roots -------------------------------------------------
    def answer_queries(
        self, teacher_ids: torch.Tensor, teacher_embeddings: torch.Tensor, query_ids: torch.Tensor,
        query_embeddings: torch.Tensor,
    ) -> CollectOutcome:
        """Steps 1-4 of DP-GPL over A's frozen embeddings; every query charged before any answer leaves B."""
        from vesper.party_b.label_privacy import pate

        if self.mode != "pate":
            raise LabelGuardError(f"Collect is for label_privacy.mode=pate; this run's mode is {self.mode}")
        if self.collected:
            raise LabelGuardError("the queries of this run were already answered")
        settings = self.config.pate
        assert self.sigmas is not None
        event = pate.query_event(*self.sigmas)
        for node in query_ids.tolist():  # write-ahead: the whole plan before any teacher votes
            self._charge(f"pate/query/{node}", torch.tensor([node]), event)
        sigma1, sigma2 = self.sigmas
        outcome = pate.label_queries(
            teacher_ids, teacher_embeddings, self.store.labels[teacher_ids], query_ids, query_embeddings,
            num_classes=self.store.num_classes, teachers=settings.teachers, threshold=self.threshold,
            sigma1=sigma1, sigma2=sigma2, epochs=settings.teacher_epochs, lr=settings.teacher_lr,
            weight_decay=settings.teacher_weight_decay, generator=self.generator,
            class_balanced=settings.teacher_class_balanced,
        )
        self.collected = True
        self._set_roots(outcome.training_ids)
        self.train_labels[self.train_roots] = outcome.training_labels
        threshold = f"T={self.threshold:g}, " if self.threshold is not None else ""
        self.note = (
            f"answered {outcome.answered_count} of {query_ids.numel()} queries ({threshold}{self._sigma_text()})"
        )
        return CollectOutcome(self.train_roots.clone(), self.epsilon_spent, self.note)

    def close(self, status: str, reason: str) -> None:
        if self.mode != "none" and self.client is not None:
            self.client.close_run(self.ledger_id, status, reason)
