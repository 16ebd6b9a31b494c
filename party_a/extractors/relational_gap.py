"""Relational pre-training, then GAP's noisy hops: the `relational-gap` party-A plugin.

A runs, in order (docs/extractors/relational.md, section 5):

1. **Relational pre-training** (party_a.extractors.relational, [PvGaLM, Alg. 1]):
   DP-SGD on A's own edges, never leaving A; ``pre-train`` releases of
   SelfComposed(PoissonSampled(q, Gaussian(z)), steps_per_charge).
2. **GAP's encoder stage** (optional, ``encoder_epochs``): B's labels fine-tune the
   pre-trained encoder without reading an edge (no-op train releases).
3. **GAP's aggregation module**, exactly as party_a.extractors.gap computes it, from the
   frozen encoder's x̃_0 = h / ‖h‖: K = ``extractor.layers`` hops
   x_k = A x̃_{k−1} + N(0, σ_hop² I), σ_hop = hop_noise_scale · z · √2, each one
   ``one-shot`` release of GaussianDpEvent(hop_noise_scale · z), charged before any use.
4. B's classifier on [x̃_0, x̃_1, ..., x̃_K] of the roots: post-processing (no-op).

The run's ε is that of the composition of both parts, one z for both; ``hop_noise_scale``
sets how the budget is split between them. Nothing here computes ε.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from vesper.common.privacy.ledger import PlanRule
from vesper.party_a.extractors.base import (
    ChargePlan,
    ExtractorSetup,
    ExtractorSpec,
    PrepareSession,
    RootPlan,
    post_processing_rules,
)
from vesper.party_a.extractors.gap import HOP_SENSITIVITY, GapExtractor, encode_all
from vesper.party_a.extractors.relational import PretrainingParams, RelationalPretraining, pretrain_rule


class RelationalGapParams(PretrainingParams):
    """The hyper-parameters of [PvGaLM, Alg. 1], plus GAP's (K hops = extractor.layers)."""

    hop_noise_scale: float = Field(
        0.5, gt=0.0, le=1000.0,
        description="s: each hop's noise multiplier is s · z (σ_hop = s · z · √2), the pre-training's is z, so s "
        "splits the budget between them (0.5: best measured on Cora at ε = 4, docs section 7)",
    )
    encoder_epochs: int = Field(
        50, ge=0, le=10_000,
        description="epochs of GAP's edge-free encoder stage with B after pre-training (B's labels fine-tune the "
        "pre-trained encoder before the hops); free; 0 = hops of the pre-trained encoder as is",
    )


class RelationalGapExtractor(GapExtractor):
    """GAP whose encoder was first privately pre-trained on A's edges [PvGaLM, Alg. 1]."""

    spec: ClassVar[ExtractorSpec] = ExtractorSpec(
        name="relational-gap", privacy_unit="edge", cost_model="one-shot",
        summary="PvGaLM relational pre-training of A's encoder (DP-SGD inside A, Poisson-sampled), then GAP's K "
        "noisy hops over the whole graph released once; training and evaluation are free",
        params=RelationalGapParams, uses=("layers", "dim", "encoder_hidden", "noise_multiplier"),
        accountings=("visible-batch",), docs="docs/extractors/relational.md",
        # GAP's (gap.py), for the same reasons: one hop, 20 epochs over its fixed noise, and d = 16
        # (5 seeds: Tolokers 0.764 -> 0.775 at ε = 4 and 0.738 -> 0.756 at ε = 1; lower on the
        # heterophilous synthetic graph at ε = 1; every cell in docs/utility.md, section 9)
        run_defaults=dict(GapExtractor.spec.run_defaults),
    )

    def __init__(self, setup: ExtractorSetup) -> None:
        super().__init__(setup)  # GAP's adjacency, K and checks (no degree bound)
        self.params: RelationalGapParams = setup.params  # type: ignore[assignment]
        self.pretraining = RelationalPretraining(setup, self.params, self.spec.name)
        self.encoder = self.pretraining.encoder  # replaces GAP's label-only encoder

    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        """Pre-train releases, then K one-shot Gaussian(hop_noise_scale · z) hops; train/eval no-op."""
        schedule, scale = self.pretraining.schedule, self.params.hop_noise_scale
        rules = [
            PlanRule(kind="one-shot", participation_bound=None, noise_scale=scale),
            *post_processing_rules(),
        ]
        if schedule.releases:
            rules.append(pretrain_rule(schedule))
        details = {
            "sensitivity_form": "pre-train + one-shot",
            "hops": self.hops,
            "hop_sensitivity": HOP_SENSITIVITY,
            "hop_noise_scale": scale,
            "hop_derivation": "A x̃ with rows of norm <= 1: one undirected edge adds one row to each endpoint's "
            "aggregate, sqrt(2) per hop (docs/extractors/gap.md, eq. S)",
            **self.pretraining.details(),
        }
        stages = self.stages()
        # the summary's θ = z · S is the hops' noise std
        return ChargePlan(
            rules, HOP_SENSITIVITY * scale, one_shot_releases=self.hops, pre_train_releases=schedule.releases,
            stages=stages, participation_bound=0, details=details,
        )

    def bind(self, noise_multiplier: float | None) -> None:
        super().bind(noise_multiplier)
        self.pretraining.bind(noise_multiplier)
        if noise_multiplier is not None:
            self.noise_std = self.params.hop_noise_scale * noise_multiplier * HOP_SENSITIVITY

    def prepare(self, session: PrepareSession) -> None:
        """Pre-training (charged chunk by chunk), GAP's optional stage, then the K charged hops."""
        self.pretraining.run(session)
        self.train_encoder(session)
        self.encoder.requires_grad_(False)
        self.encoder.eval()
        self.released = self.release_hops(encode_all(self.encoder, self.setup.features), session)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return []  # frozen before the hops: B's gradients are discarded
