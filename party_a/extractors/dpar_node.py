"""DPAR with node-level DP ([DPAR], dpar.txt), as a party-A plugin: "as in the paper, plus noise on
the forward release" (shared/design/privacy.md). Derivations: docs/extractors/dpar-node.md.

Privacy unit: one of A's nodes — its feature vector and all its edges — under
**add/remove** ("zero-out"): in the neighbouring graph the node's record is absent. Node
ids are public and aligned with B, so the id stays: the node is isolated and has no
features (a row of NaN in ``features``), and an absent node's embedding is 0. Replacing a
node is two such steps (twice every sensitivity below).

What A does, in order (section numbers of the docs page):

1. **One-shot: DP-APPR top-K** (the paper's DP-APPR-GM, [DPAR, Alg. 3]). For every root B
   may ask about, the approximate personalised PageRank vector p_s (ISTA, shared core
   ``party_a.extractors.appr``), the root itself excluded, clipped to ‖û_s‖₂ ≤ C₁, plus
   N(0, σ₁²) on every entry; the K largest noisy entries are the root's neighbourhood.
   One Gaussian release of sensitivity √(2|S|) C₁ (eq. A-S), charged before any use.
2. **Neighbourhood weights** (post-processing of step 1): root s gives itself weight β and
   its K neighbours 1 − β; then every column u of the weight matrix W is clipped to
   ‖W_{:,u}‖₁ ≤ τ₁ and ‖W_{:,u}‖₂ ≤ τ₂ ([DPAR, Alg. 2, line 3], plus the ℓ2 clip
   that the forward release needs).
3. **Forward release, per step** (what the paper leaves unprotected): with the per-node
   encoder h_u = f_θ(x_u), ‖h_u‖ ≤ 1 (E1),

       (F1)  ẽ_s = Σ_u W_su h_u + N(0, σ_f² I),   σ_f = z_f τ₂                  B x d x 1

4. **DP-SGD at A** ([DPAR, Alg. 2, lines 7-14], with the clipping unit moved from the root to
   the node, so that the column norms bound it): with g_s B's gradient of root s's loss,

       (G1)  ψ_u = J_θ[h_u]ᵀ Σ_{s ∈ step} W_su g_s,      m_u = Σ_{s ∈ step} W_su
       (G2)  g̃ = (Σ_{steps of the update} Σ_u ψ_u min(1, C m_u / ‖ψ_u‖) + N(0, σ_g² I)) / roots,
             σ_g = z_g C τ₁

Per pass (one epoch, or the evaluation sweep) every root is released once, so one node
moves the pass's forward releases by at most τ₂ (F-S) and its clipped gradient sums by at
most C τ₁ in total (G-S), however the roots are batched: a training pass is one Gaussian
mechanism of multiplier z, 1/z² = 1/z_f² + 1/z_g² (charged once per pass, N_e = 1), and the
evaluation sweep one of multiplier z_e.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import nn
from torch.func import functional_call, grad, vmap

from vesper.common.privacy.ledger import PlanRule
from vesper.common.seeded_init import seeded
from vesper.party_a.extractors import appr
from vesper.party_a.extractors.base import (
    ChargePlan,
    ExtractorBase,
    ExtractorSetup,
    ExtractorSpec,
    PrepareSession,
    ReleaseKind,
    RootPlan,
)
from vesper.party_a.extractors.private_backward import PrivateBackward
from vesper.party_a.graph_store import Graph
from vesper.party_a.noise import NoiseSource

EMBEDDING_NORM = 1.0  # ‖h_u‖ ≤ 1 (E1): the encoder's output is projected onto the unit sphere


class DparNodeParams(BaseModel):
    """DPAR-node's hyper-parameters (width d = extractor.dim, encoder width = extractor.encoder_hidden)."""

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(0.25, gt=0.0, lt=1.0, description="α, teleport probability of the personalised PageRank")
    rho: float = Field(
        1e-4, ge=0.0, lt=1.0, description="ρ, ISTA's ℓ1 regularisation: entries below about ρ·α·degree become 0"
    )
    ista_iterations: int = Field(
        10, ge=1, le=1000, description="T, ISTA iterations (fixed in advance: a data-dependent stop would leak)"
    )
    appr_clip: float = Field(
        0.01, gt=0.0,
        description="C₁, ℓ2 clip of each root's APPR vector (itself excluded) before its Gaussian noise; below "
        "the smallest row norm it only sets the scale (the paper's C₁ = 0.01)",
    )
    top_k: int = Field(
        4, ge=0, le=1024,
        description="K, neighbours each root aggregates besides itself, the K largest entries of its noisy APPR "
        "vector (0 = none: no one-shot release, a node-level DP-SGD encoder with noisy forward releases)",
    )
    self_weight: float = Field(
        0.5, ge=0.0, le=1.0, description="β, the root's own weight in its aggregate; its K neighbours share 1 − β"
    )
    neighbour_weights: Literal["uniform", "appr"] = Field(
        "uniform",
        description="how the K neighbours share 1 − β: 'uniform' equally (the paper's option I, 1/K), 'appr' in "
        "proportion to their noisy APPR values",
    )
    column_l1: float = Field(
        1.0, gt=0.0,
        description="τ₁, clip of every column's ℓ1 norm of the weight matrix (one node's total weight over all "
        "roots), which bounds its share of the DP-SGD gradients (the paper's τ, [DPAR, Alg. 2] line 3)",
    )
    column_l2: float = Field(
        0.6, gt=0.0,
        description="τ₂, clip of every column's ℓ2 norm of the weight matrix, which bounds one node's change of a "
        "pass's forward releases",
    )
    grad_clip: float = Field(1.0, gt=0.0, description="C, DP-SGD clip of each node's gradient per unit of its weight")
    train_encoder: bool = Field(
        True,
        description="train A's encoder with DP-SGD from B's gradients; false: the encoder stays at its seeded "
        "random initialisation and the whole training pass budget goes to the forward release",
    )
    forward_share: float = Field(
        0.7, gt=0.0, lt=1.0,
        description="ρ, share of each training pass's privacy (μ²) spent on the forward release; the rest goes to "
        "the DP-SGD gradients",
    )
    eval_share: float = Field(
        0.3, gt=0.0, lt=1.0,
        description="b, share of the whole run's privacy (μ²) spent on the evaluation sweep's forward release",
    )
    appr_share: float = Field(
        0.1, gt=0.0, lt=1.0,
        description="a, share of the whole run's privacy (μ²) spent on the one-shot DP-APPR release (unused when "
        "top_k = 0); the training passes share what a and b leave",
    )
    input_projection: int = Field(
        0, ge=0, le=1 << 16,
        description="p: multiply the features by a fixed random Gaussian p x F matrix first (seeded by the run's "
        "public seed, independent of the data, so free) to cut the encoder's parameters and with them the "
        "DP-SGD noise (0 = off)",
    )
    dp_batch: int = Field(
        0, ge=0, le=1 << 24,
        description="roots per DP-SGD update of A's encoder: A sums the node-clipped gradients of consecutive "
        "steps and adds its noise once per update (0 = every step); a pass costs the same either way",
    )
    grad_chunk: int = Field(
        256, ge=1, le=1 << 20, description="nodes per chunk of per-sample gradients (memory: chunk x parameters)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> DparNodeParams:
        if self.top_k == 0 and self.self_weight == 0:
            raise ValueError("top_k = 0 and self_weight = 0 would release nothing but noise")
        if (self.appr_share if self.top_k else 0.0) + self.eval_share >= 1.0:
            raise ValueError("appr_share + eval_share must leave a share for the training passes (sum < 1)")
        return self


# -- the privacy arithmetic (docs section 3) -------------------------------------------------------
@dataclass(frozen=True)
class Multipliers:
    """Noise multipliers (noise std / sensitivity) of each part, for the run's z."""

    train: float  # a training pass: forward and gradient composed into one Gaussian
    forward: float  # z_f: the forward release of a training step
    gradient: float  # z_g: the DP-SGD gradient (∞: nothing is trained)
    eval: float  # z_e: the forward release of the evaluation sweep
    one_shot: float  # z₁: the DP-APPR release (∞: no one-shot)


def split_multipliers(
    z: float, forward_share: float, eval_share: float, appr_share: float, epochs: int, one_shot: bool
) -> Multipliers:
    """Each part's multiplier for the run's z (section 3.4, eqs. Z1-Z3).

    Every part is a Gaussian mechanism without sampling, so the run is one Gaussian with
    μ² = μ₁² + E μ_pass² + μ_e². A training pass is Gaussian(z), μ_pass² = 1/z², split as
    ρ/z² forward and (1 − ρ)/z² gradient (Z1: z_f = z/√ρ, z_g = z/√(1 − ρ); 1/z_f² + 1/z_g²
    = 1/z², ρ = 1 when nothing is trained). The one-shot and the sweep take the shares a and
    b of μ², the E passes the rest, μ² = E/((1 − a − b) z²) (Z2), hence
    z_e = z √((1 − a − b)/(b E)) and z₁ = z √((1 − a − b)/(a E)) (Z3; a = 0 without a one-shot).
    """
    rho, a, b = forward_share, (appr_share if one_shot else 0.0), eval_share
    rest = 1.0 - a - b
    return Multipliers(
        train=z,
        forward=z / math.sqrt(rho),
        gradient=z / math.sqrt(1.0 - rho) if rho < 1.0 else math.inf,
        eval=z * math.sqrt(rest / (b * epochs)),
        one_shot=z * math.sqrt(rest / (a * epochs)) if one_shot else math.inf,
    )


def one_shot_sensitivity(num_sources: int, appr_clip: float) -> float:
    """(A-S) L2 sensitivity of the clipped APPR matrix {û_s} over ``num_sources`` roots.

    Removing a node can change every source's vector; each row is non-negative with
    ‖û_s‖₂ ≤ C₁ under both graphs, so ‖û_s − û'_s‖² ≤ ‖û_s‖² + ‖û'_s‖² ≤ 2C₁², and over
    the rows S₁ = √(2|S|) C₁. (The paper charges C₁ per row: too small by √2.)
    """
    return math.sqrt(2.0 * num_sources) * appr_clip


def forward_pass_sensitivity(column_l2: float) -> float:
    """(F-S) L2 change of one pass's forward releases when one node v* is added or removed.

    Given the released neighbourhoods, only h_{v*} changes (to 0), so root s moves by
    W_sv* ‖h_{v*}‖ ≤ W_sv*; each root is released once per pass: √(Σ_s W_sv*²) ≤ τ₂.
    """
    return EMBEDDING_NORM * column_l2


def gradient_pass_sensitivity(grad_clip: float, column_l1: float) -> float:
    """(G-S) L2 sensitivity of one pass's clipped gradient sums, composed over its updates.

    Only ψ_{v*} changes (to 0), clipped to C m_{v*,t} in step t, so update w has
    sensitivity s_w ≤ C Σ_{t ∈ w} m_{v*,t} and Σ_w s_w² ≤ (Σ_w s_w)² ≤ (C Σ_s W_sv*)² ≤ (C τ₁)².
    """
    return grad_clip * column_l1


# -- step 1: the private top-K (the paper's DP-APPR-GM) ---------------------------------------------
def clip_rows(scores: torch.Tensor, clip: float) -> torch.Tensor:
    """û_s = u_s / max(1, ‖u_s‖₂ / C₁) [DPAR, Alg. 3, line 6]; −∞ (the excluded source) stays −∞."""
    finite = torch.where(torch.isfinite(scores), scores, torch.zeros_like(scores))
    scale = torch.clamp(clip / finite.norm(dim=1).clamp(min=torch.finfo(scores.dtype).tiny), max=1.0)
    return scores * scale[:, None]


def dp_appr_top_k(
    graph: Graph, sources: torch.Tensor, *, alpha: float, rho: float, iterations: int, clip: float, k: int,
    noise_std: float, source: NoiseSource | None, progress: Callable[[str], None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1: [S, K] neighbours of every source (−1: none) and their noisy scores.

    Per batch of sources: ISTA APPR (appr.ista_appr), the source excluded
    (appr.clip_scores with no element clip), the row clip, then report-noisy-top-K
    (appr.gaussian_top_k): releasing the whole noisy matrix is the Gaussian mechanism of
    (A-S), and the K largest entries are post-processing. A selected entry whose noisy
    score is ≤ 0 is dropped (post-processing too; with σ = 0 it drops unreachable nodes).
    ``progress`` hears after every batch (a long silent prepare can lose the coordinator's stream).
    """
    op = appr.walk_operator(graph)
    k_eff = min(k, graph.num_nodes - 1)
    chosen, scores = [], []
    batches = sources.split(appr.batch_size_for(graph.num_nodes))
    for number, batch in enumerate(batches):
        if progress is not None:
            progress(f"dpar-node: DP-APPR, batch {number + 1} of {len(batches)} of sources")
        u = clip_rows(appr.clip_scores(appr.ista_appr(op, batch, alpha, rho, iterations), batch, math.inf), clip)
        indices, values = appr.gaussian_top_k(u, k_eff, noise_std, source, batch)
        chosen.append(torch.where(values > 0, indices, torch.full_like(indices, -1)))
        scores.append(values)
    nodes, values = torch.cat(chosen), torch.cat(scores)
    if k_eff < k:  # fewer candidates than K: pad with empty slots
        pad = k - k_eff
        nodes = torch.cat([nodes, nodes.new_full((nodes.shape[0], pad), -1)], dim=1)
        values = torch.cat([values, values.new_zeros((values.shape[0], pad))], dim=1)
    return nodes, values


# -- step 2: the neighbourhood weights ---------------------------------------------------------------
@dataclass(frozen=True)
class Neighbourhoods:
    """Row i: root ``roots[i]``'s aggregation slots; slot 0 is the root itself."""

    roots: torch.Tensor  # [M] int64
    nodes: torch.Tensor  # [M, K+1] int64 node ids (an empty slot repeats the root, with weight 0)
    weights: torch.Tensor  # [M, K+1] W after column clipping
    row_of: torch.Tensor  # [N] int64: row of each node, −1 for nodes that are not roots


def neighbourhood_weights(top_nodes: torch.Tensor, top_values: torch.Tensor, self_weight: float, mode: str) -> torch.Tensor:
    """[M, K+1] row weights: β for the root, 1 − β shared by its neighbours (0 for empty slots)."""
    valid = (top_nodes >= 0).to(top_values.dtype)
    count = valid.sum(dim=1, keepdim=True)
    share = valid / count.clamp(min=1.0)
    if mode == "appr":
        mass = top_values.clamp(min=0.0) * valid
        total = mass.sum(dim=1, keepdim=True)
        share = torch.where(total > 0, mass / total.clamp(min=torch.finfo(mass.dtype).tiny), share)
    own = torch.full((top_nodes.shape[0], 1), self_weight, dtype=top_values.dtype, device=top_values.device)
    return torch.cat([own, (1.0 - self_weight) * share], dim=1)


def column_norms(nodes: torch.Tensor, weights: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(‖W_{:,u}‖₁, ‖W_{:,u}‖₂) of every node u: what (F-S) and (G-S) bound."""
    flat_nodes, flat_w = nodes.reshape(-1), weights.reshape(-1)
    l1 = torch.zeros(num_nodes, dtype=weights.dtype, device=weights.device).index_add_(0, flat_nodes, flat_w.abs())
    l2 = torch.zeros_like(l1).index_add_(0, flat_nodes, flat_w * flat_w).sqrt()
    return l1, l2


def clip_columns(nodes: torch.Tensor, weights: torch.Tensor, num_nodes: int, tau1: float, tau2: float) -> torch.Tensor:
    """W_su ← W_su min(1, τ₁/‖W_{:,u}‖₁, τ₂/‖W_{:,u}‖₂) for every column u (step 2).

    The scale of column u depends on column u alone, so afterwards every column meets both
    bounds (a node's weight may repeat within a row: the norms are over slots, which
    bounds the per-root sums too). Rows of popular nodes' roots then sum to less than 1.
    """
    l1, l2 = column_norms(nodes, weights, num_nodes)
    tiny = torch.finfo(weights.dtype).tiny
    scale = torch.minimum(tau1 / l1.clamp(min=tiny), tau2 / l2.clamp(min=tiny)).clamp(max=1.0)
    return weights * scale[nodes]


def build_neighbourhoods(
    roots: torch.Tensor, top_nodes: torch.Tensor, top_values: torch.Tensor, num_nodes: int, params: DparNodeParams
) -> Neighbourhoods:
    """Step 2 in full: slots [root, N_K(root)], row weights, column clipping, row lookup."""
    weights = neighbourhood_weights(top_nodes, top_values, params.self_weight, params.neighbour_weights)
    nodes = torch.cat([roots[:, None], torch.where(top_nodes >= 0, top_nodes, roots[:, None])], dim=1)
    weights = clip_columns(nodes, weights, num_nodes, params.column_l1, params.column_l2)
    row_of = torch.full((num_nodes,), -1, dtype=torch.int64, device=roots.device)
    row_of[roots] = torch.arange(roots.numel(), device=roots.device)
    return Neighbourhoods(roots, nodes, weights, row_of)


# -- steps 3 and 4: the encoder, the forward release and DP-SGD --------------------------------------
def random_projection(features: torch.Tensor, dims: int) -> torch.Tensor:
    """x_u ↦ R x_u, R ~ N(0, 1/p)^{F x p} from torch's global generator (the caller seeds it with
    the run's public seed). Row-wise and data-independent: node u's projection depends on
    x_u alone. ``dims`` = 0 or ≥ F: unchanged."""
    if dims == 0 or dims >= features.shape[1]:
        return features
    projection = torch.randn(features.shape[1], dims, dtype=features.dtype) / math.sqrt(dims)
    return features @ projection.to(features.device)


class NodeEncoder(nn.Module):
    """h_u = f_θ(x_u) = normalize(W₂ relu(W₁ x_u + b₁) + b₂): one node, no edges, ‖h_u‖ ≤ 1 (E1).

    Per node on purpose: h_u depends on x_u and θ alone, so adding or removing v* changes
    h_{v*} only. No dropout, so the per-sample gradients of step 4 differentiate exactly
    the function whose output was released.
    """

    def __init__(self, in_features: int, hidden: int, dim: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, dim))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(features), dim=-1)


def aggregate(h: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """e_s = Σ_k W_{s,k} h_{slot(s,k)} (F1 before its noise); ``slots`` index the rows of h."""
    return torch.einsum("bk,bkd->bd", weights.to(h.dtype), h[slots])


def node_gradient_targets(
    slots: torch.Tensor, weights: torch.Tensor, root_grads: torch.Tensor, num_unique: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_u, m_u) of (G1): q_u = Σ_s W_su g_s and m_u = Σ_s W_su over the step's roots."""
    flat, dim = slots.reshape(-1), root_grads.shape[1]
    w = weights.to(root_grads.dtype)
    q = root_grads.new_zeros(num_unique, dim).index_add_(0, flat, (w[:, :, None] * root_grads[:, None, :]).reshape(-1, dim))
    m = root_grads.new_zeros(num_unique).index_add_(0, flat, w.reshape(-1))
    return q, m


def clipped_gradient_sum(
    encoder: NodeEncoder, features: torch.Tensor, targets: torch.Tensor, bounds: torch.Tensor, chunk: int
) -> dict[str, torch.Tensor]:
    """Σ_u ψ_u min(1, b_u/‖ψ_u‖), ψ_u = ∇_θ ⟨f_θ(x_u), q_u⟩ (G1-G2 before the noise).

    Per-sample gradients with torch.func (vmap of grad over nodes), ``chunk`` nodes at a
    time so memory stays at chunk x |θ|. Only parameters with requires_grad are differentiated.
    """
    params = {name: p.detach() for name, p in encoder.named_parameters() if p.requires_grad}

    def inner(p: dict[str, torch.Tensor], x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        return (functional_call(encoder, p, (x[None],))[0] * q).sum()

    per_node = vmap(grad(inner), in_dims=(None, 0, 0))
    total = {name: torch.zeros_like(p) for name, p in params.items()}
    for start in range(0, targets.shape[0], chunk):
        part = slice(start, start + chunk)
        grads = per_node(params, features[part], targets[part])
        norms = torch.sqrt(sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads.values()))
        factor = torch.clamp(bounds[part] / norms.clamp(min=torch.finfo(norms.dtype).tiny), max=1.0)
        for name, g in grads.items():
            total[name] += torch.tensordot(factor, g, dims=1)
    return total


@dataclass
class _Window:
    """Un-noised clipped gradient sums of the current DP-SGD update (never leave A un-noised)."""

    pass_roots: int  # training roots per pass: an update never spans two passes
    sums: dict[str, torch.Tensor] = field(default_factory=dict)
    roots: int = 0
    seen_in_pass: int = 0

    def add(self, sums: dict[str, torch.Tensor], roots: int) -> None:
        for name, value in sums.items():
            self.sums[name] = self.sums[name] + value if name in self.sums else value
        self.roots += roots
        self.seen_in_pass += roots

    def full(self, dp_batch: int) -> bool:
        return self.roots >= dp_batch or self.seen_in_pass >= self.pass_roots

    def flush(self) -> None:
        if self.seen_in_pass >= self.pass_roots:
            self.seen_in_pass = 0
        self.sums, self.roots = {}, 0


@dataclass
class _Step:
    """What step 4 needs from a training step's forward release."""

    extractor: DparNodeExtractor
    unique: torch.Tensor  # nodes whose embeddings the step read
    slots: torch.Tensor  # [B, K+1] positions in ``unique``
    weights: torch.Tensor  # [B, K+1]


class DparNodeExtractor(ExtractorBase):
    """Node-level DPAR: one-shot DP-APPR neighbourhoods, then DP-SGD with a noised forward release."""

    spec: ClassVar[ExtractorSpec] = ExtractorSpec(
        name="dpar-node", privacy_unit="node", cost_model="one-shot + per-step",
        summary="DPAR with node-level DP (add/remove one node with its features and edges): one-shot DP-APPR "
        "top-K neighbourhoods, then DP-SGD at A over them, with noise on every forward release too",
        params=DparNodeParams, uses=("dim", "encoder_hidden", "noise_multiplier"),
        accountings=("visible-batch",),
        no_prediction="its private neighbourhoods cover the run's roots only, not every node",
        docs="docs/extractors/dpar-node.md",
    )

    def __init__(self, setup: ExtractorSetup) -> None:
        super().__init__(setup)
        ex = setup.config.extractor
        self.params: DparNodeParams = setup.params  # type: ignore[assignment]
        # an absent node (the neighbouring graph's removed record) has no features: embedding 0
        self.present = torch.isfinite(setup.features).all(dim=1)
        features = torch.where(self.present[:, None], setup.features, torch.zeros_like(setup.features))
        with seeded(setup.config.seed):  # public: B may know the initialisation
            self.features = random_projection(features, self.params.input_projection)
            self.encoder = NodeEncoder(self.features.shape[1], ex.encoder_hidden, ex.dim).to(
                device=setup.device, dtype=setup.features.dtype
            )
        self.encoder.requires_grad_(self.params.train_encoder)
        # ρ of split_multipliers: with nothing trained a pass is its forward release alone
        self.forward_share = self.params.forward_share if self.params.train_encoder else 1.0
        self.multipliers: Multipliers | None = None
        self.forward_std = self.eval_std = self.gradient_std = self.one_shot_std = 0.0
        self.window = _Window(pass_roots=1)
        self.hoods: Neighbourhoods | None = None

    @property
    def output_layers(self) -> int:
        return 1

    # -- what it costs ------------------------------------------------------------------------
    @staticmethod
    def sources(roots: RootPlan) -> torch.Tensor:
        """Every root B may ask about: each gets its own private neighbourhood."""
        return torch.unique(torch.cat([roots.train_ids, roots.val_ids, roots.test_ids]))

    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        """Gaussian(z₁) once (if K > 0), Gaussian(z) per training pass, Gaussian(z_e) per
        evaluation sweep; the first release of a pass carries the whole pass (N_e = 1)."""
        p, epochs = self.params, self.setup.config.epochs
        one_shot = p.top_k > 0
        unit = split_multipliers(1.0, self.forward_share, p.eval_share, p.appr_share, epochs, one_shot)
        self.window = _Window(pass_roots=roots.train_ids.numel())
        rules = [
            PlanRule(kind="train", participation_bound=1, noise_scale=unit.train),
            PlanRule(kind="eval", participation_bound=1, noise_scale=unit.eval),
        ]
        s_forward = forward_pass_sensitivity(p.column_l2)
        details: dict[str, Any] = {
            "sensitivity_form": "per-pass",
            "neighbouring": "add/remove one node: its features and all its edges (its public id stays)",
            "forward_pass_sensitivity": s_forward,
            "gradient_pass_sensitivity": gradient_pass_sensitivity(p.grad_clip, p.column_l1) if p.train_encoder else 0.0,
            "multipliers_per_z": {"forward": unit.forward, "gradient": unit.gradient, "eval": unit.eval},
            "derivation": "per pass one node moves the forward releases by <= tau2 (F-S) and the clipped gradient "
            "sums by <= C tau1 (G-S); a training pass is Gaussian(z) with 1/z^2 = 1/z_f^2 + 1/z_g^2, the eval "
            "sweep Gaussian(z_e), the DP-APPR release Gaussian(z_1) of sensitivity sqrt(2|S|) C1 "
            "(docs/extractors/dpar-node.md)",
        }
        if one_shot:
            rules.append(PlanRule(kind="one-shot", participation_bound=None, noise_scale=unit.one_shot))
            sources = self.sources(roots).numel()
            details.update({
                "one_shot_sensitivity": one_shot_sensitivity(sources, p.appr_clip), "appr_sources": sources,
            })
            details["multipliers_per_z"]["one_shot"] = unit.one_shot
        # the summary's θ = z · S is the training forward noise std: S = τ₂ z_f / z
        return ChargePlan(
            rules, s_forward * unit.forward, one_shot_releases=int(one_shot), participation_bound=1, details=details,
        )

    def bind(self, noise_multiplier: float | None) -> None:
        super().bind(noise_multiplier)
        p = self.params
        self.multipliers = None
        self.forward_std = self.eval_std = self.gradient_std = self.one_shot_std = 0.0
        if noise_multiplier is None:
            return
        m = split_multipliers(
            noise_multiplier, self.forward_share, p.eval_share, p.appr_share, self.setup.config.epochs, p.top_k > 0
        )
        self.multipliers = m
        self.forward_std = m.forward * forward_pass_sensitivity(p.column_l2)
        self.eval_std = m.eval * forward_pass_sensitivity(p.column_l2)
        if p.train_encoder:
            self.gradient_std = m.gradient * gradient_pass_sensitivity(p.grad_clip, p.column_l1)
        # the one-shot std needs |S|, known in prepare(); m.one_shot is kept for it

    # -- steps 1 and 2: the private neighbourhoods -----------------------------------------------
    def prepare(self, session: PrepareSession) -> None:
        """Step 1 (charged before anything uses it) and step 2 (post-processing)."""
        p, device = self.params, self.setup.device
        sources = self.sources(session.roots).to(device)
        num_nodes = self.setup.graph.num_nodes
        if p.top_k == 0:
            empty = torch.empty((sources.numel(), 0), dtype=torch.int64, device=device)
            self.hoods = build_neighbourhoods(sources, empty, empty.to(self.features.dtype), num_nodes, p)
            return
        if self.multipliers is not None:
            self.one_shot_std = self.multipliers.one_shot * one_shot_sensitivity(sources.numel(), p.appr_clip)
        session.progress(f"dpar-node: DP-APPR top-{p.top_k} neighbourhoods of {sources.numel()} roots")
        top_nodes, top_values = dp_appr_top_k(
            self.setup.graph, sources, alpha=p.alpha, rho=p.rho, iterations=p.ista_iterations, clip=p.appr_clip,
            k=p.top_k, noise_std=self.one_shot_std, source=self.setup.noise, progress=session.progress,
        )
        # write-ahead: nothing derived from the noisy APPR is used before the charge is committed;
        # a refusal raises here and the computed neighbourhoods are dropped
        session.charge_one_shot(0, sources)
        self.hoods = build_neighbourhoods(sources, top_nodes, top_values, num_nodes, p)

    # -- steps 3 and 4 ----------------------------------------------------------------------------
    def embed(self, nodes: torch.Tensor) -> torch.Tensor:
        """h_u for ``nodes`` (0 for an absent node)."""
        return self.encoder(self.features[nodes]) * self.present[nodes, None].to(self.features.dtype)

    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        """ẽ_s = Σ_u W_su h_u + N(0, σ² I) for the roots (F1), B x d x 1, σ = σ_f (train) or σ_e
        (eval); in training its backward is the DP-SGD gradient (G1-G2)."""
        if self.hoods is None:
            raise RuntimeError("dpar-node aggregates over its private neighbourhoods: prepare() must run first")
        rows = self.hoods.row_of[roots]
        if bool((rows < 0).any()):
            raise ValueError("dpar-node was asked about a node that is not one of the run's roots")
        nodes, weights = self.hoods.nodes[rows], self.hoods.weights[rows]
        unique, slots = torch.unique(nodes, return_inverse=True)
        with torch.no_grad():
            released = aggregate(self.embed(unique), slots, weights)
            released = self.perturb(released, self.forward_std if kind == "train" else self.eval_std, rows=roots)
        released = released.unsqueeze(-1)
        if kind != "train" or not self.params.train_encoder or not torch.is_grad_enabled():
            return released
        return PrivateBackward.apply(released, _Step(self, unique, slots, weights), *self.encoder.parameters())

    def private_gradient(self, step: _Step, grad_output: torch.Tensor) -> list[torch.Tensor | None]:
        """Step 4 (G1-G2): node-clipped gradients summed over ``dp_batch`` roots, then noised once.

        Returns None for every parameter (no update: the optimiser skips parameters
        without a gradient) until the update's roots are complete or the pass ends.
        """
        batch = grad_output.shape[0]
        # B's loss is the batch mean: g_s · |batch| is the gradient of root s's own loss
        root_grads = grad_output[:, :, 0] * batch
        q, m = node_gradient_targets(step.slots, step.weights, root_grads, step.unique.numel())
        active = (m > 0) & self.present[step.unique]
        sums = clipped_gradient_sum(
            self.encoder, self.features[step.unique[active]], q[active], self.params.grad_clip * m[active],
            self.params.grad_chunk,
        )
        self.window.add(sums, batch)
        if not self.window.full(self.params.dp_batch):
            return [None] * len(sums)
        out: list[torch.Tensor | None] = []
        for name, _ in self.encoder.named_parameters():
            total = self.window.sums[name]
            out.append(self.perturb(total.clone(), self.gradient_std) / self.window.roots)
        self.window.flush()
        return out

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.encoder.parameters() if p.requires_grad]
