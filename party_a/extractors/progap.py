"""ProGAP (Sajadmanesh & Gatica-Perez, WSDM 2024 [ProGAP]) as a party-A plugin: GAP's noisy
hops released progressively, each one aggregating what a stage trained with B's labels learnt.

GAP [GAP] aggregates a frozen edge-free encoding K times, so hop k only re-aggregates
hop k−1 as it came out of the noise. ProGAP trains a base module per hop instead, stage by
stage, and aggregates the *trained* embedding of the newest hop. With K = ``extractor.layers``
hops and stages i = 0, ..., K (the run is the last one)::

    (P-1)  h_0 = f_0(x_v)                        f_0: A's MlpEncoder over the features
    (P-2)  h_k = f_k(x̃_k),  k = 1..K             f_k: an MlpEncoder over hop k's rows
    (P-3)  stage i trains f_0, ..., f_i with B, releasing [h_0, ..., h_i] of the roots;
           B's decoder plays ProGAP's jumping-knowledge combination and head
    (P-4)  x_{i+1} = A h_i + N(0, σ² I),  σ = z · √2;  x̃_{i+1} = x_{i+1} / ‖x_{i+1}‖

Every f_k ends in a row normalisation (MlpEncoder), so h_i has rows of norm ≤ 1 and (P-4) is
GAP's hop with GAP's sensitivity S = √2 (docs/extractors/gap.md, eq. S): K one-shot
``GaussianDpEvent(z)`` releases for the whole run, charged before anything reads them. Every
stage reads only A's features and hops already charged, so its releases, and the run's, are
post-processing (no-op), and B's gradients may train every f_k (docs/extractors/progap.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from vesper.common.seeded_init import seeded
from vesper.party_a.encoder import MlpEncoder
from vesper.party_a.extractors.base import (
    ChargePlan,
    ExtractorSetup,
    ExtractorSpec,
    PrepareSession,
    ReleaseKind,
    RootPlan,
    Stage,
)
from vesper.party_a.extractors.gap import ENCODE_CHUNK, GapExtractor, row_normalise


class ProgapParams(BaseModel):
    """ProGAP's own hyper-parameter (K hops = extractor.layers, width d = extractor.dim)."""

    model_config = ConfigDict(extra="forbid")

    stage_epochs: int = Field(
        50, ge=1, le=10_000,
        description="epochs of each of the K edge-free stages trained with B before hop 1, ..., hop K is "
        "released (the run's own epochs train the last stage). Costs no privacy.",
    )
    hop_norm: bool = Field(
        True,
        description="f_k reads log(1 + ‖x_k‖) beside x̃_k = x_k / ‖x_k‖: the noisy aggregate's scale (about the "
        "node's degree), which ProGAP's bases read as they read the unnormalised x_k; post-processing, free",
    )


class ProgapExtractor(GapExtractor):
    """K hops, each of the embedding a stage trained on the hops before it; rows per step (no-op)."""

    spec: ClassVar[ExtractorSpec] = ExtractorSpec(
        name="progap", privacy_unit="edge", cost_model="one-shot",
        summary="ProGAP progressive aggregation perturbation: K + 1 stages trained with B, each releasing "
        "one noisy hop of the last stage's embedding over the whole graph (K Gaussian events); training and "
        "evaluation are free",
        params=ProgapParams, uses=("layers", "dim", "encoder_hidden", "dropout", "noise_multiplier"),
        accountings=("visible-batch",), docs="docs/extractors/progap.md",
        # GAP's width and epochs (gap.py); two hops, as ProGAP's own default depth
        run_defaults={**GapExtractor.spec.run_defaults, "extractor.layers": 2},
    )

    def __init__(self, setup: ExtractorSetup) -> None:
        super().__init__(setup)  # f_0 (GAP's encoder), the adjacency, K, and GAP's checks
        self.params: ProgapParams = setup.params  # type: ignore[assignment]
        ex = setup.config.extractor
        self.hop_width = ex.dim + int(self.params.hop_norm)  # what f_k reads of hop k: x̃_k (and its log-norm)
        with seeded(setup.config.seed + 1):
            self.bases = nn.ModuleList(
                MlpEncoder(self.hop_width, ex.encoder_hidden, ex.dim, ex.dropout) for _ in range(self.hops)
            ).to(setup.device)
        # [N, d (+1), K]: f_k's input from the charged hop k, x̃_k (and log(1 + ‖x_k‖))
        self.released = None

    # -- what it costs ----------------------------------------------------------------------
    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        """GAP's plan (K one-shot Gaussian(z) releases of sensitivity √2, training and evaluation
        no-op) with this extractor's K stages and derivation."""
        plan = super().charge_plan(roots)
        return replace(plan, details={**plan.details, "derivation": (
            "stage i trains f_0..f_i on the features and the hops 1..i already charged; hop i+1 is A h_i with "
            "rows of h_i normalised to norm 1: one undirected edge adds one row to each endpoint's aggregate, "
            "sqrt(2) per hop; K hops adaptively composed (docs/extractors/progap.md)"
        )})

    def stages(self) -> tuple[Stage, ...]:
        """Stage i < K: i + 1 slices [h_0, ..., h_i] per step, charged as no-op train releases."""
        return tuple(Stage(name=f"stage-{i}", epochs=self.params.stage_epochs, layers=i + 1) for i in range(self.hops))

    # -- the stages ---------------------------------------------------------------------------
    def embed(self, roots: torch.Tensor, stage: int) -> torch.Tensor:
        """[h_0, ..., h_stage] of the roots (P-1, P-2), B x d x (stage + 1); in training mode each
        f_k's dropout has a fresh secret key."""
        train = self.training
        slices = [self.encoder(self.setup.features[roots], roots, self.dropout_key() if train else None)]
        for k in range(1, stage + 1):
            hop = self.released[roots, :, k - 1]  # type: ignore[index]
            slices.append(self.bases[k - 1](hop, roots, self.dropout_key() if train else None))
        return torch.stack(slices, dim=-1)

    def stage_parameters(self, stage: int) -> list[nn.Parameter]:
        """f_0, ..., f_stage: what stage ``stage`` trains (ProGAP trains the earlier bases on)."""
        return [*self.encoder.parameters(), *(p for f in self.bases[:stage] for p in f.parameters())]

    @torch.no_grad()
    def last_embedding(self, stage: int) -> torch.Tensor:
        """h_stage for every node, in evaluation mode (no dropout), in chunks: (P-4)'s input.
        The module's mode is left as it was."""
        nodes = torch.arange(self.setup.graph.num_nodes, device=self.setup.device)
        was_training = self.training
        self.train(False)
        try:
            return torch.cat([self.embed(chunk, stage)[:, :, -1] for chunk in nodes.split(ENCODE_CHUNK)])
        finally:
            self.train(was_training)

    def prepare(self, session: PrepareSession) -> None:
        """Stage i, then hop i + 1 (charged before any use), for i = 0, ..., K − 1 (P-3, P-4)."""
        num_nodes = self.setup.graph.num_nodes
        self.released = torch.zeros(num_nodes, self.hop_width, self.hops, device=self.setup.device)
        all_nodes = torch.arange(num_nodes, device=self.setup.device)
        try:
            for i, stage in enumerate(self.stages()):
                session.progress(f"progap: stage {i} of {self.hops} with B for {stage.epochs} epochs")
                self.train(True)
                session.train_stage(stage, lambda roots, i=i: self.embed(roots, i), self.stage_parameters(i))
                session.progress(f"progap: releasing hop {i + 1} of {self.hops} over all {num_nodes} nodes")
                h = self.last_embedding(i)
                self.released[:, :, i] = self.release_hop(h, i + 1, session, all_nodes)
        except BaseException:
            self.released = None  # a refused or failed hop: nothing of the preparation is served
            raise

    @torch.no_grad()  # no gradient may flow back through a read of A (docs/extractors/gap.md, 3.3)
    def release_hop(self, h: torch.Tensor, hop: int, session: PrepareSession, all_nodes: torch.Tensor) -> torch.Tensor:
        """f_hop's input from x_hop = A h̃ + N(0, σ² I) (P-4), h̃ = h / ‖h‖ (rows of norm ≤ 1 whatever
        f returned: the sensitivity √2 needs it), charged (write-ahead) before it is returned:
        x̃_hop = x_hop / ‖x_hop‖, and with ``hop_norm`` one more column, log(1 + ‖x_hop‖)."""
        engine = self.start_hop_engine()
        try:
            x = engine.hop(row_normalise(h), hop, self.noise_std, self.hop_key())
        finally:
            engine.close()
        session.charge_one_shot(hop - 1, all_nodes)  # a refusal raises here: x is dropped
        if not self.params.hop_norm:
            return row_normalise(x)
        return torch.cat([row_normalise(x), torch.log1p(x.norm(dim=-1, keepdim=True))], dim=-1)

    # -- what it releases -------------------------------------------------------------------
    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        """[h_0, ..., h_K] of the roots, B x d x (K+1): f_0..f_K over features and charged hops."""
        if self.released is None:
            raise RuntimeError("progap releases embeddings of its one-shot hops: prepare() must run first")
        return self.embed(roots, self.hops)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.stage_parameters(self.hops)  # the last stage: the run trains f_0, ..., f_K
