"""Node membership inference from party B's position ([VESPER, §3.5] and [VESPER, App. C.7];
docs/audit-attacks.md).

The setting is TFTS ("train on subgraph, test on the full graph", Olatunji et al. 2021 [ONK21]):
with ``audit.membership`` A trains on the subgraph induced by B's training nodes, then
its evaluation pass releases every node of the full graph, the training nodes included,
and B's record keeps the decoder's posterior p_v = softmax(f(e_v)) of each one. The
attack tells the training nodes (members, label 1) from held-out nodes (non-members,
label 0) by their posteriors; its ROC-AUC is the measurement.

* **Two classes** ([VESPER, App. C.7], after Song & Mittal): the entropy attack, score s_v = −H(p_v)
  with H(p) = −Σ_c p_c log p_c. A model is more confident on what it was trained on.
* **More classes** ([VESPER, App. C.7], after Olatunji et al. [ONK21]): the shadow-model attack. The paper's
  attacker has API access, a shadow set of 1000 nodes per class and the target's
  architecture. B has more: every node's label and A's evaluation release of every
  node. So B draws its shadow set from nodes it does **not** score (its validation
  split), trains a shadow decoder of the run's architecture and hyper-parameters on the
  evaluation releases of one half ("shadow-in"), queries it on both halves, and fits a
  3-layer MLP that maps a sorted posterior vector to in (1) or out (0). That model then
  scores the target posteriors.

The shadow decoder re-learns only B's half of the model, over fixed releases: A's encoder,
which also saw the members in training, is not re-trained, so the attack transfers B's
own overfitting, not A's (docs/audit-attacks.md, section 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel
from torch import nn

from vesper.auditor.received_releases import ReceivedReleases
from vesper.common.config import DecoderConfig, OptimizerConfig
from vesper.common.optim import build_optimizer
from vesper.common.seeded_init import seeded
from vesper.party_b.decoders import build_decoder
from vesper.party_b.metrics import roc_auc
from vesper.party_b.release_record import SPLIT_CODES

ATTACK_HIDDEN = 64  # width of the attack MLP's two hidden layers
ATTACK_STEPS = 300  # full-batch Adam steps of the attack MLP
ATTACK_LR = 0.01
ENTROPY_FLOOR = 1e-12  # p log p at p = 0 is 0; the floor keeps log finite
SHADOW_GAP_MARGIN = 0.05  # |shadow-in vs shadow-out entropy AUC − 0.5| below this: the shadow shows no gap


class MembershipResult(BaseModel):
    """One membership attack on one run's record."""

    attack: Literal["entropy", "shadow"]
    auc: float  # ROC-AUC of members (1) against non-members (0); 0.5 = chance
    members: int  # B's training nodes scored
    non_members: int  # held-out nodes scored
    shadow_nodes: int  # nodes spent on the shadow set (in + out); 0 for the entropy attack
    entropy_auc: float  # the entropy score on the same targets, as a reference next to the shadow attack
    # the entropy score on shadow-in against shadow-out: ≈ 0.5 = the shadow shows no gap to learn from
    shadow_entropy_auc: float | None = None
    note: str


@dataclass(frozen=True)
class Posteriors:
    """The record's posteriors, one row per evaluated node (the last one when a node came twice)."""

    ids: np.ndarray  # int64 [M]
    splits: np.ndarray  # int64 [M], SPLIT_CODES
    values: np.ndarray  # float [M, C]

    def of_split(self, split: str) -> np.ndarray:
        return self.ids[self.splits == SPLIT_CODES[split]]

    def rows(self, ids: np.ndarray) -> np.ndarray:
        order = np.argsort(self.ids)
        return self.values[order[np.searchsorted(self.ids[order], ids)]]


def unique_posteriors(received: ReceivedReleases) -> Posteriors:
    """One posterior per node: the last the record holds."""
    ids = received.posterior_ids[::-1]
    _, first = np.unique(ids, return_index=True)
    keep = received.posterior_ids.size - 1 - first
    return Posteriors(received.posterior_ids[keep], received.posterior_splits[keep], received.posteriors[keep])


def posterior_entropy(posteriors: np.ndarray) -> np.ndarray:
    """H(p) = −Σ_c p_c log p_c per row (nats)."""
    p = np.clip(np.asarray(posteriors, dtype=np.float64), 0.0, 1.0)
    return -(p * np.log(np.maximum(p, ENTROPY_FLOOR))).sum(axis=1)


def entropy_scores(posteriors: np.ndarray) -> np.ndarray:
    """s = −H(p): larger for more confident posteriors, which the entropy attack calls members."""
    return -posterior_entropy(posteriors)


def sorted_posteriors(posteriors: np.ndarray) -> np.ndarray:
    """The attack model's input: each posterior sorted in decreasing order, so the model reads
    the shape of the confidence and not which class it went to (Olatunji et al. [ONK21], Shokri et al. [SSSS17])."""
    return -np.sort(-np.asarray(posteriors, dtype=np.float32), axis=1)


def shadow_split(
    pool: np.ndarray, labels: np.ndarray, per_class: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """The shadow set: up to ``per_class`` nodes of each class drawn from ``pool``, each
    class split at random into halves, shadow-in (trained on) and shadow-out."""
    chosen_in, chosen_out = [], []
    pool_labels = labels[pool]
    for label in np.unique(pool_labels):
        members = rng.permutation(pool[pool_labels == label])[:per_class]
        half = (members.size + 1) // 2
        chosen_in.append(members[:half])
        chosen_out.append(members[half:])
    return np.concatenate(chosen_in), np.concatenate(chosen_out)


def train_shadow_decoder(
    embeddings: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    decoder: DecoderConfig,
    optimizer: OptimizerConfig,
    epochs: int,
    batch_size: int,
    seed: int,
) -> nn.Module:
    """A decoder of the run's kind and width, trained like the run's (``epochs`` passes of
    shuffled batches, the run's optimiser) on the shadow-in nodes' evaluation releases."""
    _, dim, layers = embeddings.shape
    x = torch.from_numpy(np.ascontiguousarray(embeddings, dtype=np.float32))
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    with seeded(seed):
        model = build_decoder(decoder, dim, layers, num_classes)
        opt = build_optimizer(optimizer, model.parameters())
        model.train()
        for _ in range(epochs):
            for batch in torch.randperm(x.shape[0]).split(batch_size):
                loss = F.cross_entropy(model(x[batch]), y[batch])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
    return model.eval()


@torch.no_grad()
def query_posteriors(model: nn.Module, embeddings: np.ndarray) -> np.ndarray:
    """softmax(f(e)) of a decoder over releases, as the run's evaluation computes it."""
    logits = model(torch.from_numpy(np.ascontiguousarray(embeddings, dtype=np.float32)))
    return torch.softmax(logits, dim=-1).numpy()


def train_attack_model(features: np.ndarray, is_in: np.ndarray, seed: int) -> nn.Module:
    """The 3-layer MLP of [VESPER, App. C.7]: sorted posterior → logit of "in", trained with binary
    cross-entropy on the shadow model's answers (in = 1, out = 0), full batch."""
    x = torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32))
    y = torch.from_numpy(np.asarray(is_in, dtype=np.float32))
    with seeded(seed):
        model = nn.Sequential(
            nn.Linear(x.shape[1], ATTACK_HIDDEN), nn.ReLU(),
            nn.Linear(ATTACK_HIDDEN, ATTACK_HIDDEN), nn.ReLU(),
            nn.Linear(ATTACK_HIDDEN, 1),
        )
        opt = torch.optim.Adam(model.parameters(), lr=ATTACK_LR)
        for _ in range(ATTACK_STEPS):
            loss = F.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return model.eval()


@torch.no_grad()
def attack_scores(model: nn.Module, posteriors: np.ndarray) -> np.ndarray:
    """The attack model's logit of "member" for each target posterior."""
    return model(torch.from_numpy(sorted_posteriors(posteriors))).squeeze(1).double().numpy()


def membership_auc(member_scores: np.ndarray, non_member_scores: np.ndarray) -> float:
    """ROC-AUC with members as positives (ties averaged)."""
    scores = np.concatenate([member_scores, non_member_scores])
    truth = np.concatenate([np.ones(member_scores.size, bool), np.zeros(non_member_scores.size, bool)])
    return roc_auc(scores, truth)


def shadow_pool(
    posteriors: Posteriors, received: ReceivedReleases, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, str]:
    """(shadow pool, target non-members, where the pool came from).

    The pool is B's validation split: nodes B holds labels and evaluation releases of,
    outside A's training graph, and not scored. Without validation posteriors it is a
    random half of the test nodes, and the other half are the non-members."""
    val = posteriors.of_split("val")
    val = val[received.eval_seen[val]]
    test = posteriors.of_split("test")
    if val.size:
        return val, test, "validation split"
    shuffled = rng.permutation(test)
    half = shuffled.size // 2
    return shuffled[:half], shuffled[half:], "half of the test split (the record has no validation posteriors)"


def membership_attack(
    received: ReceivedReleases,
    labels: np.ndarray,
    num_classes: int,
    seed: int,
    shadow_per_class: int = 1000,
    *,
    decoder: DecoderConfig | None = None,
    optimizer: OptimizerConfig | None = None,
    epochs: int = 50,
    batch_size: int = 256,
) -> MembershipResult:
    """Members = B's training nodes with a posterior; non-members = held-out nodes with one.

    ``decoder``, ``optimizer``, ``epochs`` and ``batch_size`` are the run's (the record does
    not keep them; the defaults are RunConfig's), used only by the shadow attack.
    """
    posteriors = unique_posteriors(received)
    members = posteriors.of_split("train")
    if members.size == 0:
        raise ValueError(
            "the record holds no posterior of a training node: the membership attack needs a TFTS run "
            "(audit.membership), whose evaluation pass also releases the training nodes"
        )
    labels = np.asarray(labels, dtype=np.int64)
    if num_classes == 2:
        non_members = np.concatenate([posteriors.of_split("val"), posteriors.of_split("test")])
        _require_non_members(non_members)
        auc = membership_auc(entropy_scores(posteriors.rows(members)), entropy_scores(posteriors.rows(non_members)))
        return MembershipResult(
            attack="entropy", auc=auc, entropy_auc=auc, members=members.size, non_members=non_members.size,
            shadow_nodes=0,
            note="entropy attack (two classes): score −H(posterior); non-members = validation and test nodes",
        )
    rng = np.random.default_rng(seed)
    pool, non_members, source = shadow_pool(posteriors, received, rng)
    _require_non_members(non_members)
    shadow_in, shadow_out = shadow_split(pool, labels, shadow_per_class, rng)
    if shadow_in.size == 0 or shadow_out.size == 0:
        raise ValueError(f"the shadow pool ({source}) has too few nodes for a shadow-in and a shadow-out half")
    shadow = train_shadow_decoder(
        received.eval_embedding[shadow_in], labels[shadow_in], num_classes,
        decoder or DecoderConfig(), optimizer or OptimizerConfig(), epochs, batch_size, seed,
    )
    shadow_answers = query_posteriors(shadow, received.eval_embedding[np.concatenate([shadow_in, shadow_out])])
    is_in = np.concatenate([np.ones(shadow_in.size), np.zeros(shadow_out.size)])
    attack = train_attack_model(sorted_posteriors(shadow_answers), is_in, seed)
    in_answers, out_answers = shadow_answers[: shadow_in.size], shadow_answers[shadow_in.size :]
    shadow_gap = membership_auc(entropy_scores(in_answers), entropy_scores(out_answers))
    member_posteriors, non_member_posteriors = posteriors.rows(members), posteriors.rows(non_members)
    note = (
        f"shadow-model attack ({num_classes} classes): shadow set of up to {shadow_per_class} nodes per class from "
        f"the {source}, {shadow_in.size} in / {shadow_out.size} out, a {(decoder or DecoderConfig()).kind} shadow "
        "decoder on their evaluation releases; non-members = test nodes"
    )
    if abs(shadow_gap - 0.5) < SHADOW_GAP_MARGIN:
        note += (
            f"; the shadow decoder is about as confident on its own training nodes as on the others (entropy AUC "
            f"{shadow_gap:.3f}), so the attack model learnt no reliable direction: read entropy_auc"
        )
    return MembershipResult(
        attack="shadow",
        auc=membership_auc(attack_scores(attack, member_posteriors), attack_scores(attack, non_member_posteriors)),
        entropy_auc=membership_auc(entropy_scores(member_posteriors), entropy_scores(non_member_posteriors)),
        shadow_entropy_auc=shadow_gap,
        members=members.size, non_members=non_members.size, shadow_nodes=shadow_in.size + shadow_out.size,
        note=note,
    )


def _require_non_members(non_members: np.ndarray) -> None:
    if non_members.size == 0:
        raise ValueError("the record holds no posterior of a held-out node: nothing to compare the members with")
