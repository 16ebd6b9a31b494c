"""DPAR at edge level as a party-A plugin: private top-K APPR neighbourhoods, released once.

DPAR ([DPAR], ``shared/seeds/dpar.txt``) decouples a GNN into a private neighbourhood selection
and a feature model. In the two-party protocol, with A's edges as the privacy unit:

1. **One-shot release** (prepare): for every node B may ask about (train ∪ val ∪ test),
   the private top-K neighbourhood N_K(s) from DP-APPR (``party_a.extractors.appr``):
   ISTA APPR, scores clipped at C, and either report-noisy-top-K with Gaussian noise
   (``mechanism="gaussian"``, one ``GaussianDpEvent(z)``, σ = z·S_G) or K rounds of the
   exponential mechanism as one-shot Gumbel noise (``mechanism="exponential"``, K
   ``ZCDpEvent(1/(8z²))``, Gumbel scale b = 2z·S_EM). Charged through
   ``session.charge_one_shot`` before it is computed. Sensitivities: docs/extractors/dpar.md.
2. **Post-processing** (train/eval, charged no-op): for a root r, B receives
   ``[h_r, Σ_{j ∈ N_K(r)} w_rj h_j]`` (B x d x 2) with h = A's MlpEncoder(x) and weights w
   uniform (1/K) or from the released noisy scores. The encoder is trained by B's
   gradients: it reads A's own features (not protected at edge level) and the graph only
   through the charged N_K, so everything A learns is post-processing of the release and
   ε does not grow with the number of epochs.
"""

from __future__ import annotations

import math
import time
from typing import ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn

from vesper.common.privacy.ledger import PlanRule
from vesper.common.seeded_init import seeded
from vesper.party_a.encoder import MlpEncoder
from vesper.party_a.extractors.appr import Sensitivity, TopK, edge_level_sensitivity, private_top_k
from vesper.party_a.extractors.base import (
    ChargePlan,
    ExtractorBase,
    ExtractorSetup,
    ExtractorSpec,
    PrepareSession,
    ReleaseKind,
    RootPlan,
    post_processing_rules,
)


class DparEdgeParams(BaseModel):
    """DP-APPR's hyper-parameters (docs/extractors/dpar.md, section 5 for the tuning)."""

    model_config = ConfigDict(extra="forbid")

    mechanism: Literal["gaussian", "exponential"] = Field(
        "gaussian",
        description="private top-K: gaussian = report-noisy-top-K, one Gaussian event (PLD-exact); "
        "exponential = K rounds of the exponential mechanism (one-shot Gumbel), K zCDP events (RDP)",
    )
    alpha: float = Field(
        0.8, gt=0.0, lt=1.0,
        description="α, teleport probability of personalised PageRank; the sensitivity grows as √((1−α)/α), "
        "so a local walk (large α) pays 3.5× less noise than the paper's 0.25 for the same ranking quality",
    )
    rho: float = Field(
        0.0, ge=0.0, le=0.1,
        description="ρ, ISTA's ℓ1 regularisation (threshold ραd_j); each unit adds 2ρ per source to the "
        "sensitivity, so 0 (plain truncated PPR) is the default",
    )
    iterations: int = Field(
        3, ge=1, le=100,
        description="T, ISTA iterations (fixed, never a data-dependent tolerance): scores reach T−1 hops; "
        "each iteration past 2 hops costs one sparse x dense product over the whole graph",
    )
    top_k: int = Field(
        64, ge=1, le=256,
        description="K, neighbours released per node (the Gaussian variant costs the same for every K; "
        "the exponential one pays K rounds). 64 suits ε ≲ 100, where the neighbourhoods are nearly "
        "random and a wide average hurts least; 4-16 select better at ε in the hundreds or without noise",
    )
    clip: float = Field(
        0.05, gt=0.0, le=1.0,
        description="C, every APPR score is clipped to [0, C] before selection; the sensitivity grows as √C",
    )
    weights: Literal["uniform", "noisy-scores"] = Field(
        "uniform",
        description="aggregation weights: uniform 1/K (DPAR option I) or the released noisy scores, "
        "clamped at 0 and normalised (gaussian only: they are part of its release)",
    )

    @model_validator(mode="after")
    def _weights_need_released_scores(self) -> DparEdgeParams:
        if self.weights == "noisy-scores" and self.mechanism != "gaussian":
            raise ValueError("weights=noisy-scores needs mechanism=gaussian: the exponential mechanism releases indices only")
        return self


def split_sources(roots: RootPlan) -> torch.Tensor:
    """Every node B may ask about: the sources whose neighbourhoods are released."""
    return torch.unique(torch.cat([roots.train_ids, roots.val_ids, roots.test_ids]))


def aggregation_weights(top: TopK, weights: str) -> torch.Tensor:
    """w_rj per released neighbour: uniform 1/K, or clamp(ũ_rj, 0) normalised (uniform if all ≤ 0).

    Only reads the release (post-processing).
    """
    k = top.indices.shape[1]
    uniform = torch.full(top.indices.shape, 1.0 / max(k, 1), device=top.indices.device)
    if weights == "uniform" or top.values is None or k == 0:
        return uniform
    positive = top.values.clamp(min=0.0)
    total = positive.sum(dim=1, keepdim=True)
    return torch.where(total > 0, positive / total.clamp(min=1e-30), uniform)


class DparEdgeExtractor(ExtractorBase):
    """Private top-K APPR neighbourhoods released once; A's encoder aggregates over them."""

    spec: ClassVar[ExtractorSpec] = ExtractorSpec(
        name="dpar-edge", privacy_unit="edge", cost_model="one-shot",
        summary="DPAR: private top-K personalised-PageRank neighbourhoods of every node released once "
        "(Gaussian or exponential mechanism); the encoder then aggregates over them for free",
        params=DparEdgeParams, uses=("dim", "encoder_hidden", "dropout", "noise_multiplier"),
        accountings=("visible-batch",),
        no_prediction="its private neighbourhoods cover the run's roots only, not every node",
        docs="docs/extractors/dpar.md",
    )

    def __init__(self, setup: ExtractorSetup) -> None:
        super().__init__(setup)
        ex = setup.config.extractor
        if ex.degree_bound:
            # Theorems 1-2 of dpar.md are stated for the graph read; through the stable
            # projection one edge changes up to three (edges_changed=3), for no benefit here
            raise ValueError("extractor dpar-edge reads the whole graph and needs no degree bound: set extractor.degree_bound to 0")
        self.params: DparEdgeParams = setup.params  # type: ignore[assignment]
        with seeded(setup.config.seed):
            self.encoder = MlpEncoder(setup.features.shape[1], ex.encoder_hidden, ex.dim, ex.dropout).to(setup.device)
        self.sources: torch.Tensor | None = None
        self.sensitivity: Sensitivity | None = None
        self.noise = 0.0  # σ (gaussian) or Gumbel scale b (exponential)
        self.neighbours: torch.Tensor | None = None  # [N, K'] released N_K(r), -1 for non-sources
        self.weights: torch.Tensor | None = None  # [N, K'] w_rj

    @property
    def output_layers(self) -> int:
        return 2  # the root's own encoding and the aggregate over its private neighbourhood

    @property
    def rounds(self) -> int:
        """K' = min(K, N − 1): selections per source (exponential: rounds, one event each)."""
        return min(self.params.top_k, self.setup.graph.num_nodes - 1)

    # -- what it costs ----------------------------------------------------------------------
    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        """One-shot: Gaussian(z) once, or K rounds of ZCDp(1/(8z²)); train and eval are no-op.

        θ = z·S refers to S_G (gaussian: σ = z·S_G) or 2·S_EM (exponential: b = 2z·S_EM,
        so each round over all sources is (1/z)-bounded-range; docs/extractors/dpar.md, eq. E, 3.1).
        """
        p = self.params
        self.sources = split_sources(roots).to(self.setup.device)
        self.sensitivity = edge_level_sensitivity(p.alpha, p.rho, p.clip, self.sources.numel())
        exponential = p.mechanism == "exponential"
        mechanism = "exponential" if exponential else "gaussian"
        rules = [PlanRule(kind="one-shot", participation_bound=None, mechanism=mechanism), *post_processing_rules()]
        charged = 2.0 * self.sensitivity.exponential if exponential else self.sensitivity.gaussian
        details = {
            "sensitivity_form": "one-shot",
            "mechanism": p.mechanism,
            "sources": int(self.sources.numel()),
            "top_k": self.rounds,
            "appr_l1_change": self.sensitivity.change.l1,
            "appr_linf_change": self.sensitivity.change.linf,
            "sensitivity_gaussian": self.sensitivity.gaussian,
            "sensitivity_exponential": self.sensitivity.exponential,
            "derivation": "Σ_s‖Δp_s‖₁ ≤ 4(1−α)/α + 2ρ|S|, Σ_s‖Δp_s‖_∞ ≤ 2(1−α)/α (ρ=0); scores clipped to [0, C]: "
            "S_G² ≤ min(C, A_∞)·A₁, S_EM² ≤ min(C, A_∞)·A_∞ (docs/extractors/dpar.md, Theorems 1-2)",
        }
        releases = self.rounds if exponential else 1
        return ChargePlan(rules, charged, one_shot_releases=releases, participation_bound=0, details=details)

    def bind(self, noise_multiplier: float | None) -> None:
        super().bind(noise_multiplier)
        if self.sensitivity is None:
            raise RuntimeError("charge_plan() must run before bind()")
        if noise_multiplier is None:
            self.noise = 0.0
        elif self.params.mechanism == "exponential":
            self.noise = 2.0 * noise_multiplier * self.sensitivity.exponential
        else:
            self.noise = noise_multiplier * self.sensitivity.gaussian

    # -- the one-shot release ---------------------------------------------------------------
    def prepare(self, session: PrepareSession) -> None:
        """Charge the one-shot pass, then compute the private neighbourhoods of every source."""
        if self.sources is None:
            raise RuntimeError("charge_plan() must run before prepare()")
        p = self.params
        releases = self.rounds if p.mechanism == "exponential" else 1
        # write-ahead: the pass is charged before anything is computed from the graph
        for index in range(releases):
            session.charge_one_shot(index, self.sources)
        # C / noise is public (both are functions of the plan): below ~0.5 the released
        # neighbourhoods are close to uniformly random (docs/extractors/dpar.md, section 7)
        ratio = p.clip / self.noise if self.noise > 0 else math.inf
        session.progress(
            f"dpar-edge: private top-{self.rounds} APPR neighbourhoods of {self.sources.numel()} nodes "
            f"({p.mechanism}, noise {self.noise:.4g}, clip/noise {ratio:.3g})"
        )
        started = time.monotonic()
        top = private_top_k(
            self.setup.graph, self.sources, alpha=p.alpha, rho=p.rho, iterations=p.iterations, clip=p.clip,
            k=p.top_k, mechanism=p.mechanism, noise=self.noise, source=self.setup.noise,
        )
        self.install(top)
        session.progress(f"dpar-edge: neighbourhoods released in {time.monotonic() - started:.2f} s")

    def install(self, top: TopK) -> None:
        """Lookup tables [N, K'] of the released neighbourhoods and their weights."""
        n, k = self.setup.graph.num_nodes, top.indices.shape[1]
        device = self.setup.device
        self.neighbours = torch.full((n, k), -1, dtype=torch.int64, device=device)
        self.weights = torch.zeros((n, k), dtype=self.setup.features.dtype, device=device)
        self.neighbours[top.sources] = top.indices.to(device)
        self.weights[top.sources] = aggregation_weights(top, self.params.weights).to(device, self.weights.dtype)

    # -- what it releases -------------------------------------------------------------------
    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        """[h_r, Σ_j w_rj h_j] for every root, B x d x 2: post-processing of the one-shot release."""
        if self.neighbours is None or self.weights is None:
            raise RuntimeError("dpar-edge releases aggregates over its one-shot neighbourhoods: prepare() must run first")
        neighbours = self.neighbours[roots]
        if neighbours.numel() and bool((neighbours < 0).any()):
            raise ValueError("a root outside party B's split has no released neighbourhood")
        # encode each distinct node once (the encoder reads only A's own features)
        nodes, position = torch.unique(torch.cat([roots, neighbours.reshape(-1)]), return_inverse=True)
        encoded = self.encoder(self.setup.features[nodes], nodes, self.dropout_key())
        own = encoded[position[: roots.numel()]]
        around = encoded[position[roots.numel():]].reshape(roots.numel(), neighbours.shape[1], -1)
        aggregate = (self.weights[roots].unsqueeze(-1) * around).sum(dim=1)
        return torch.stack([own, aggregate], dim=-1)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.encoder.parameters())
