"""VFGNN [VFGNN]: output perturbation of an L-layer message passing ([VESPER, App. C.5], [VESPER, Prop. 3]).

The baseline VESPER compares against. Per step, for the step's roots r, party A computes

    (V1)  m_v^(0) = h_v^(0) = normalize(relu(MLP(x_v)))                 the encoder, no edges
    (V2)  m_v^(l) = normalize(m_v^(l-1) + AGG_{u ∈ N_s(v)} m_u^(l-1))   l = 1..L, weight-free
    (V3)  õ_r = o_r + N(0, θ² I_d),  o_r = m_r^(L)                      output perturbation
    (V3') released: [h_r^(0)], γ · õ_r                                  post-processing

with AGG the mean or the sum over v's sampled neighbours N_s(v) (0 when there are none).
Only the last layer's output is perturbed and released, as in the paper's VFGNN (not
PMP's per-layer outputs); ``self_slice`` puts the edge-free h_r^(0) before it. The
release is B x d x L', L' = 2 (h^(0), γ õ) or 1 (γ õ); γ is a learned scalar gain.

Sensitivity (docs/extractors/vfgnn.md, section 3): every m^(l) is non-negative with norm
≤ 1 (C = 1 in [VESPER, Prop. 3]), so one root's output moves by at most √2 (V4; the
paper's 2C ignores the sign), and only the N_e roots within L − 1 hops of a node whose
neighbourhood the edge changed can move (V5). A pass is one Gaussian mechanism with
S_pass² = 2 N_e (V6), charged as one counted release per pass; where N_e is unbounded,
every release counts with S_step² = 2 n for n roots per release (V7).

Under ``hidden-batch`` ([VESPER, Thm. 2.1] as published, no guarantee against B; section
5): every training step is PoissonSampled(γ, Gaussian(θ/S_step)) with γ of [VESPER, Thm. 2.1] and
the per-step sensitivity S_step² = 2 min(N_e, n) (V8), every step counted; the evaluation
sweep keeps its visible-batch rule.

A's training (section 2): the gradient of õ_r w.r.t. A's weights would read the
un-noised graph, so (V2) has no weights and runs under no_grad on a detached encoder;
the encoder trains only through the edge-free slice h_r^(0) (without it, it stays at
its random initialisation), and γ only through õ_r, which is charged. A's parameters
then depend on the graph only through charged releases.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from vesper.common.privacy.hidden_batch_reproduction import participation_count, theorem21_gamma
from vesper.common.privacy.ledger import PlanRule
from vesper.common.seeded_init import seeded
from vesper.party_a.degree_projection import project_degree
from vesper.party_a.encoder import MlpEncoder
from vesper.party_a.extractors.base import (
    ChargePlan,
    ExtractorBase,
    ExtractorSetup,
    ExtractorSpec,
    ReleaseKind,
    RootPlan,
)
from vesper.party_a.extractors.sensitivity import projected_edge_reach
from vesper.party_a.sampler import Block, NeighbourSampler, SampledSubgraph, draw_order_key

Aggregation = Literal["mean", "sum"]

# eq. (V4): ‖o − o'‖ ≤ √2 · C for non-negative o, o' of norm ≤ C = 1 (docs/privacy.md, Lemma 1)
ROOT_BOUND = math.sqrt(2.0)


class VfgnnParams(BaseModel):
    """extractor.params of ``vfgnn``."""

    model_config = ConfigDict(extra="forbid")

    aggregation: Aggregation = Field(
        "mean",
        description="AGG of the weight-free message passing (V2): mean or sum over the sampled neighbours; "
        "both read only the node's own sample, so the sensitivity and N_e are the same",
    )
    self_slice: bool = Field(
        True,
        description="also release the edge-free encoder output h^(0) of each root (no noise, no cost) "
        "before the noisy output, so A's encoder can be trained soundly; false = the paper's release "
        "(the noisy output only) with A's encoder frozen at its random initialisation",
    )


# ---------------------------------------------------------------------------------------
# The mechanism (eqs. V1-V3)
# ---------------------------------------------------------------------------------------


def neighbour_aggregate(block: Block, m_src: torch.Tensor, aggregation: Aggregation) -> torch.Tensor:
    """AGG_{u ∈ N_s(v)} m_u for the block's destination nodes (0 without sampled neighbours)."""
    out = m_src.new_zeros(block.dst_count, m_src.shape[1])
    out.index_add_(0, block.edge_dst, m_src[block.edge_src])
    if aggregation == "mean":
        count = torch.bincount(block.edge_dst, minlength=block.dst_count).clamp(min=1)
        out = out / count.to(m_src.dtype)[:, None]
    return out


def message_passing_layer(block: Block, m_src: torch.Tensor, aggregation: Aggregation) -> torch.Tensor:
    """Eq. (V2): m_v^(l) = normalize(m_v^(l-1) + AGG_v). Non-negative in, non-negative out, norm ≤ 1."""
    own = m_src[: block.dst_count]  # the block's destinations are its first sources
    return F.normalize(own + neighbour_aggregate(block, m_src, aggregation), dim=-1)


@torch.no_grad()
def message_passing_output(subgraph: SampledSubgraph, h0: torch.Tensor, aggregation: Aggregation) -> torch.Tensor:
    """o_r = m_r^(L) for the roots: the pre-noise output that [VESPER, Prop. 3] perturbs.

    ``h0`` holds m^(0) of ``subgraph.input_nodes`` (non-negative rows of norm ≤ 1). No
    gradient exists here: nothing A learns can read the graph except through õ.
    """
    m = h0
    for block in subgraph.blocks:
        m = message_passing_layer(block, m, aggregation)
    return m[: subgraph.roots.numel()]


# ---------------------------------------------------------------------------------------
# What one edge can change, and what a pass is charged (docs/extractors/vfgnn.md, 3-4)
# ---------------------------------------------------------------------------------------


def edge_reach(layers: int, fanout: int, degree_bound: int) -> int | None:
    """N_e: roots whose output o_r one added edge can change (eq. V5).

    Raw graph (sampled at ``fanout``, 0 = all): only u*, v* change their own sample
    (docs/privacy.md, Lemma 2), so at L = 1 N_e = 2; from L = 2 on every node that can
    sample an endpoint is reached, unboundedly many: None. Projection P(G), read whole:
    the changed neighbourhoods are the ≤ 4 core nodes of docs/privacy.md's Lemma 4, and the roots within
    L − 1 hops of them are PMP-GIN's N_e (docs/privacy.md, eq. N3): 4, 4D, ...
    """
    if layers < 1 or fanout < 0 or degree_bound < 0:
        raise ValueError(f"need layers >= 1, fanout >= 0, degree_bound >= 0; got {layers}, {fanout}, {degree_bound}")
    if degree_bound > 0:
        return projected_edge_reach("pmp-gin", layers, degree_bound)
    return 2 if layers == 1 else None


@dataclass(frozen=True)
class VfgnnCharge:
    """How each kind of release is charged (eqs. V6, V7): its sensitivity and counted releases."""

    sensitivity: dict[str, float]  # per kind: θ_kind = z · sensitivity[kind]
    participation_bound: int | None  # counted releases per pass (None: every release)
    form: str  # "per-pass" or "per-step"
    edge_reach: int | None  # N_e roots
    derivation: str
    details: dict[str, Any] = field(default_factory=dict)


def charge(layers: int, fanout: int, degree_bound: int, roots_per_release: dict[str, int]) -> VfgnnCharge:
    """The cheaper valid form for one pass (docs/extractors/vfgnn.md, section 4).

    Per-pass (N_e finite), eq. V6: every root is released at most once per pass, so the
    pass's releases compose to one Gaussian mechanism with S_pass² = 2 N_e; one counted
    release per pass. Per-step, eq. V7: S_step² = 2 min(N_e, n) for n roots per release
    and N_e counted releases per pass — never cheaper than V6 (N_e · 2 min(N_e, n) ≥ 2 N_e),
    so it is used only where N_e is unbounded, with every release counted.
    """
    reach = edge_reach(layers, fanout, degree_bound)
    if reach is not None:
        s_pass = ROOT_BOUND * math.sqrt(reach)
        return VfgnnCharge(
            {kind: s_pass for kind in roots_per_release}, 1, "per-pass", reach,
            "docs/extractors/vfgnn.md: per-root bound V4, N_e eq. V5, per-pass form V6",
        )
    sensitivity = {kind: ROOT_BOUND * math.sqrt(max(1, n)) for kind, n in roots_per_release.items()}
    return VfgnnCharge(
        sensitivity, None, "per-step", None,
        "docs/extractors/vfgnn.md: per-root bound V4, N_e unbounded (V5), per-step form V7",
        {"roots_per_release": dict(roots_per_release)},
    )


def step_sensitivity(layers: int, fanout: int, degree_bound: int, roots_per_release: int) -> float:
    """S_step = √(2 min(N_e, n)): the L2 change of one release of n roots (eq. V8).

    A release moves only the roots in it that the edge can reach, each by at most √2
    (V4, V5): s_t² = Σ_{r ∈ step} ‖Δo_r‖² ≤ 2 |step ∩ R| ≤ 2 min(N_e, n), for every pair,
    root order and seed. Never above S_pass = √(2 N_e) (V6); below it once N_e > n.
    """
    reach = edge_reach(layers, fanout, degree_bound)
    roots = max(1, roots_per_release)
    return ROOT_BOUND * math.sqrt(roots if reach is None else min(reach, roots))


@dataclass(frozen=True)
class HiddenBatchCharge:
    """The hidden-batch reproduction (docs/extractors/vfgnn.md, section 5): eqs. V8, V9.

    Training steps: PoissonSampled(γ, Gaussian(θ_train / S_step)), every step counted;
    the evaluation sweep: its visible-batch rule (V6/V7), nothing sampled there.
    """

    gamma: float  # γ of [VESPER, Thm. 2.1] (eq. V9)
    gamma_degree: int  # D in γ: the degree bound, else the fanout
    paper_reach: int  # N_e^paper = 2 Σ_{l<L} D^l, the roots γ assumes one edge can reach
    edge_reach: int | None  # vesper's N_e (V5); None: unbounded
    train_sensitivity: float  # S_step of one training release (V8)
    evaluation: VfgnnCharge  # the sweep's visible-batch rule

    @property
    def gamma_covers_reach(self) -> bool:
        """Whether γ counts every root the edge can move (N_e ≤ N_e^paper), a necessary
        condition for γ to bound P[a step's batch holds such a root]."""
        return self.edge_reach is not None and self.edge_reach <= self.paper_reach


def hidden_batch_gamma(train_nodes: int, batch_size: int, degree: int, layers: int) -> float:
    """γ = 1 − C(N_T − N_e^paper, B) / C(N_T, B), N_e^paper = 2 Σ_{l<L} D^l ([VESPER, Thm. 2.1]; eq. V9).

    As published, and as PMP's hidden-batch plan computes it; B is capped at N_T (the
    last, smaller batch of an epoch only lowers the probability).
    """
    return theorem21_gamma(train_nodes, min(batch_size, train_nodes), degree, layers)


def hidden_batch_charge(
    layers: int, fanout: int, degree_bound: int, train_nodes: int, batch_size: int,
    roots_per_release: dict[str, int], gamma_degree: int,
) -> HiddenBatchCharge:
    """The γ of [VESPER, Thm. 2.1] for the training steps with S_step (V8, V9); the sweep as visible-batch.

    ``fanout`` is what the extractor reads (0 on a projection); ``gamma_degree`` is the D
    of [VESPER, Thm. 2.1]: the degree bound, else the configured fanout.
    """
    return HiddenBatchCharge(
        gamma=hidden_batch_gamma(train_nodes, batch_size, gamma_degree, layers),
        gamma_degree=gamma_degree,
        paper_reach=participation_count(gamma_degree, layers),
        edge_reach=edge_reach(layers, fanout, degree_bound),
        train_sensitivity=step_sensitivity(layers, fanout, degree_bound, roots_per_release["train"]),
        evaluation=charge(layers, fanout, degree_bound, roots_per_release),
    )


def largest_release(roots: RootPlan, batch_size: int, eval_chunk: int) -> dict[str, int]:
    """n per kind: the most roots one train step or evaluation chunk can carry (under pate the
    evaluation pass also carries B's labelled nodes and the queries, i.e. train_ids)."""
    pate = roots.teacher_ids.numel() > 0
    parts = [roots.val_ids, roots.test_ids, *((roots.teacher_ids, roots.train_ids) if pate else ())]
    largest_split = max(part.numel() for part in parts)
    return {"train": min(batch_size, roots.train_ids.numel()), "eval": min(eval_chunk, largest_split)}


@contextmanager
def _evaluation_mode(module: nn.Module):
    """Run ``module`` without dropout, restoring its mode: the graph part must not draw
    from torch's RNG a number of times that depends on the graph (section 2)."""
    was_training = module.training
    module.train(False)
    try:
        yield module
    finally:
        module.train(was_training)


# ---------------------------------------------------------------------------------------
# The plugin
# ---------------------------------------------------------------------------------------


class VfgnnExtractor(ExtractorBase):
    """VFGNN output perturbation as a party-A plugin (docs/extractors/vfgnn.md)."""

    spec: ClassVar[ExtractorSpec] = ExtractorSpec(
        name="vfgnn", privacy_unit="edge", cost_model="per-step",
        summary="VFGNN baseline: Gaussian noise on the normalised output of L weight-free message-passing "
        "layers, every step ([VESPER, App. C.5, Prop. 3])",
        params=VfgnnParams,
        uses=("layers", "dim", "encoder_hidden", "dropout", "noise_multiplier", "fanout", "degree_bound"),
        accountings=("visible-batch", "hidden-batch"), edge_sampling=False, docs="docs/extractors/vfgnn.md",
    )

    def __init__(self, setup: ExtractorSetup) -> None:
        super().__init__(setup)
        ex = setup.config.extractor
        self.params: VfgnnParams = setup.params  # type: ignore[assignment]
        self.graph = setup.graph
        if ex.degree_bound > 0:
            # the stable degree-D projection under a seed only A knows (docs/privacy.md, 3.5)
            seed = torch.randint(0, 1 << 32, (2,), generator=setup.sampling_generator, dtype=torch.int64).tolist()
            self.graph = project_degree(setup.graph, ex.degree_bound, (seed[0], seed[1]))
        self.fanout = 0 if ex.degree_bound > 0 else ex.fanout  # a projection is read whole
        self.sampler = NeighbourSampler(self.graph, self.fanout, ex.layers, draw_order_key(setup.sampling_generator, self.fanout))
        with seeded(setup.config.seed):
            self.encoder = MlpEncoder(setup.features.shape[1], ex.encoder_hidden, ex.dim, ex.dropout).to(setup.device)
        if not self.params.self_slice:
            # no edge-free path to train it through: frozen at its (graph-free) initialisation
            self.encoder.requires_grad_(False)
        # γ of eq. (V3'): applied after the noise, so B's gradient may train it (section 2)
        self.output_gain = nn.Parameter(torch.ones((), device=setup.device, dtype=setup.features.dtype))
        self.sensitivity: dict[str, float] = {"train": 0.0, "eval": 0.0}
        self.noise_std: dict[str, float] = {"train": 0.0, "eval": 0.0}

    @property
    def output_layers(self) -> int:
        return 2 if self.params.self_slice else 1

    # -- what it costs ----------------------------------------------------------------------
    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        """Both kinds: GaussianDpEvent(z) with θ_kind = z · S_kind (eqs. V6/V7).

        hidden-batch: training steps PoissonSampled(γ, Gaussian(z)) with θ_train = z · S_step
        (V8, V9), every step counted; the evaluation sweep as under visible-batch.
        """
        cfg, ex = self.setup.config, self.setup.config.extractor
        if cfg.privacy.accounting == "hidden-batch":
            return self.hidden_batch_plan(roots)
        rule = charge(ex.layers, self.fanout, ex.degree_bound, largest_release(roots, cfg.batch_size, cfg.eval_chunk))
        self.sensitivity = dict(rule.sensitivity)
        rules = [PlanRule(kind=kind, participation_bound=rule.participation_bound) for kind in ("train", "eval")]
        details = {
            "sensitivity_form": rule.form, "derivation": rule.derivation, "edge_reach": rule.edge_reach,
            "eval_sensitivity": rule.sensitivity["eval"], "root_bound": ROOT_BOUND,
            "aggregation": self.params.aggregation, "self_slice": self.params.self_slice,
            "released": "h0, noisy output" if self.params.self_slice else "noisy output",
            **rule.details,
        }
        return ChargePlan(
            rules, rule.sensitivity["train"], participation_bound=rule.participation_bound, details=details,
        )

    def hidden_batch_plan(self, roots: RootPlan) -> ChargePlan:
        """[VESPER, Thm. 2.1] as published (a reproduction, no guarantee against B): eqs. V8, V9."""
        cfg, ex = self.setup.config, self.setup.config.extractor
        hidden = hidden_batch_charge(
            ex.layers, self.fanout, ex.degree_bound, roots.train_ids.numel(), cfg.batch_size,
            largest_release(roots, cfg.batch_size, cfg.eval_chunk), ex.degree_bound or ex.fanout,
        )
        if hidden.gamma >= 1.0:
            # every batch holds an endpoint: nothing to amplify, and [VESPER, bound (6)] (charged when
            # larger) stays above any budget at γ = 1 (docs/extractors/vfgnn.md, 5.3)
            raise ValueError(
                f"hidden-batch: γ = 1 for {roots.train_ids.numel()} training roots in batches of {cfg.batch_size} "
                "(every batch holds the edge), so VESPER Theorem 2.1 amplifies nothing; use visible-batch"
            )
        sweep = hidden.evaluation
        self.sensitivity = {"train": hidden.train_sensitivity, "eval": sweep.sensitivity["eval"]}
        rules = [
            PlanRule(kind="train", participation_bound=None, sampling_probability=hidden.gamma),
            PlanRule(kind="eval", participation_bound=sweep.participation_bound),
        ]
        details = {
            "sensitivity_form": "per-step", "eval_sensitivity_form": sweep.form,
            "derivation": "docs/extractors/vfgnn.md: per-root bound V4, N_e eq. V5, per-step sensitivity V8, "
            "VESPER Theorem 2.1's γ V9 (hidden-batch: assumes B cannot tell which edges a step used)",
            "gamma": hidden.gamma, "gamma_degree": hidden.gamma_degree, "gamma_reach": hidden.paper_reach,
            "edge_reach": hidden.edge_reach, "gamma_covers_reach": hidden.gamma_covers_reach,
            "step_sensitivity": hidden.train_sensitivity, "eval_sensitivity": sweep.sensitivity["eval"],
            "root_bound": ROOT_BOUND, "aggregation": self.params.aggregation, "self_slice": self.params.self_slice,
            "released": "h0, noisy output" if self.params.self_slice else "noisy output",
        }
        return ChargePlan(rules, hidden.train_sensitivity, participation_bound=None, details=details)

    def bind(self, noise_multiplier: float | None) -> None:
        super().bind(noise_multiplier)
        z = 0.0 if noise_multiplier is None else noise_multiplier
        self.noise_std = {kind: z * s for kind, s in self.sensitivity.items()}
        noise_norm_squared = self.setup.config.extractor.dim * self.noise_std["train"] ** 2
        with torch.no_grad():
            # start γ where ‖γ õ‖ ≈ 1: a unit output plus noise of norm ≈ θ √d
            self.output_gain.fill_(1.0 / math.sqrt(1.0 + noise_norm_squared))

    # -- what it releases -------------------------------------------------------------------
    def graph_output(self, roots: torch.Tensor) -> torch.Tensor:
        """o_r = m_r^(L) (eqs. V1-V2) over the roots' sampled subgraphs, pre-noise, no gradient."""
        subgraph = self.sampler.sample(roots, self.sampler.layer_seeds(self.setup.sampling_generator))
        with torch.no_grad(), _evaluation_mode(self.encoder) as encoder:
            h0 = encoder(self.setup.features[subgraph.input_nodes])
        return message_passing_output(subgraph, h0, self.params.aggregation)

    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        """B x d x L': [h_r^(0)], γ õ_r with õ_r = o_r + N(0, θ_kind² I) (eqs. V3, V3'), pre-charge."""
        output = self.perturb(self.graph_output(roots), self.noise_std[kind], rows=roots)
        slices = [self.output_gain * output]
        if self.params.self_slice:
            # edge-free: the only path B's gradient takes into A's encoder
            slices.insert(0, self.encoder(self.setup.features[roots], roots, self.dropout_key()))
        return torch.stack(slices, dim=-1)
