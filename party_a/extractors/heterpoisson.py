"""HeterPoisson (Xiang, Wang & Wang, "Preserving Node-level Privacy in Graph Neural Networks" [HeterPoisson]),
node-level DP, as a party-A plugin. Derivations: docs/extractors/heterpoisson.md.

Privacy unit: one of A's nodes — its features, label-free, and all its edges — under
**replace-with-null** (dp-accounting's ``REPLACE_SPECIAL``): in the neighbouring graph the
node keeps its public id but has zero features and no edges. A's degree table is treated
as public and the same in both graphs (the paper's model, [HeterPoisson, §3]). Replacing a node by
another node is covered by group privacy at twice every sensitivity, which is NOT charged.

Per step, with R the step's roots (Poisson at q_b, seen by B; section numbers of the docs):

1. **Sampler** ([HeterPoisson, Algs. 2-3], ``heterpoisson_sampler``): neighbours kept w.p.
   min(1, M/deg), central nodes masked out of every other sub-graph.
2. **Forward release** (what B needs; the paper releases only gradients):

       (E1)  h_r = C_f · normalize(f_θ(x_r, a_r)),   a_r = mean of G_r's peripherals' features
       (F1)  e_r = h_r + N(0, σ_f² I_d),   σ_f = z · 2C_f / √ρ                       B x d x 1

3. **A's update** ([HeterPoisson, Alg. 1, lines 4-9]), with g_r B's gradient of root r's loss:

       (G1)  ψ̂_r = ψ_r · min(1, C_g / ‖ψ_r‖),   ψ_r = J_θ[h_r]ᵀ g_r   (per sub-graph)
       (G2)  g̃ = (Σ_{r ∈ R} ψ̂_r + N(0, σ_g² I)) / |R|,   σ_g = z · 2C_g / √(1 − ρ)

4. **Accounting** (section 4): a node in k sub-graphs of a step moves the whitened joint
   output (F1, G2) by at most s(k)/z, s(k) = √(kρ + k²(1 − ρ)) (S1); k is 1 if the node is a
   root, else at most Bin(deg, min(1, M/deg)), and B knows which case holds. Every step is
   charged ``MixtureOfGaussians(z, [s(k)], [p_k])`` with p the dominating law (D1), every
   evaluation chunk ``MixtureOfGaussians(z/√ρ, [√k], [p_k])``; nothing is credited for the
   root sampling, and every release is counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from scipy import stats
from torch import nn
from torch.func import functional_call, grad, vmap

from vesper.common.privacy.ledger import PlanRule
from vesper.common.seeded_init import seeded
from vesper.party_a.extractors.base import (
    ChargePlan,
    ExtractorBase,
    ExtractorSetup,
    ExtractorSpec,
    ReleaseKind,
    RootPlan,
)
from vesper.party_a.extractors.dpar_node import random_projection
from vesper.party_a.extractors.heterpoisson_sampler import (
    SubgraphBatch,
    batches_per_epoch,
    default_rate,
    heter_poisson,
    neighbour_mean,
    poisson_root_batches,
    secret_coins,
)
from vesper.party_a.extractors.private_backward import PrivateBackward

RELATION = (
    "node-level, replace-with-null: the neighbouring graph keeps the node's public id but gives it zero "
    "features and no edges (dp-accounting REPLACE_SPECIAL); A's degree table is public and the same in both "
    "graphs; replacing a node by another node is covered only at twice the sensitivities, which is not charged"
)


class HeterPoissonParams(BaseModel):
    """HeterPoisson's hyper-parameters (width d = extractor.dim, encoder width = extractor.encoder_hidden)."""

    model_config = ConfigDict(extra="forbid")

    multiplier: float = Field(
        1.0, gt=0.0, le=1e6,
        description="M of [HeterPoisson, Alg. 3]: a root keeps each neighbour j w.p. min(1, M / deg(j)), so a node whose "
        "neighbours are all roots of a step is in M of their sub-graphs on average; the charged law grows with M",
    )
    root_rate: float | None = Field(
        None, gt=0.0, le=1.0,
        description="q_b of [HeterPoisson, Alg. 2]: each train root is a central node of a step w.p. q_b (default "
        "batch_size / |train|). B sees the roots, so q_b earns no privacy credit",
    )
    embedding_clip: float = Field(1.0, gt=0.0, description="C_f: every sub-graph embedding h_r has norm C_f (E1)")
    grad_clip: float = Field(1.0, gt=0.0, description="C_g: clip of every per-sub-graph gradient ([HeterPoisson, Alg. 1] line 6)")
    forward_share: float = Field(
        0.5, gt=0.0, le=1.0,
        description="ρ: share of each step's privacy (precision 1/z²) spent on the forward release; the rest goes "
        "to A's DP-SGD gradient. 1 = A's encoder is not trained and stays at its public initialisation",
    )
    input_projection: int = Field(
        0, ge=0, le=1 << 16,
        description="p: multiply the features by a fixed random Gaussian F x p matrix first (seeded by the run's "
        "public seed, independent of the data, so free) to cut the encoder's parameters (0 = off)",
    )
    grad_chunk: int = Field(256, ge=1, le=1 << 20, description="roots per chunk of per-sub-graph gradients (memory)")


# -- the privacy arithmetic (docs section 4) ---------------------------------------------------------
def step_sensitivity(appearances: np.ndarray, forward_share: float) -> np.ndarray:
    """(S1) z · (whitened shift of a training step) for a node in k of its sub-graphs: √(kρ + k²(1−ρ)).

    The k sub-graphs are k distinct roots' rows, each moved by ≤ 2C_f: √k · 2C_f over σ_f
    = z · 2C_f/√ρ is √(kρ)/z. Their clipped gradients all add into one sum, ≤ k · 2C_g over
    σ_g = z · 2C_g/√(1−ρ) is k√(1−ρ)/z. Together (independent noises) √(kρ + k²(1−ρ))/z.
    """
    k = np.asarray(appearances, dtype=np.float64)
    return np.sqrt(k * forward_share + k * k * (1.0 - forward_share))


def eval_sensitivity(appearances: np.ndarray) -> np.ndarray:
    """(S2) z/√ρ · (whitened shift of an evaluation chunk): √k (k rows, no gradient)."""
    return np.sqrt(np.asarray(appearances, dtype=np.float64))


def _underflow_limit(multiplier: float) -> int:
    """A j beyond which every P(Bin(D, min(1, M/D)) ≥ j) is below the smallest double.

    D ≤ M: Bin(D, 1) = D < j. D > M: the mean is M and Chernoff gives P(X ≥ j) ≤ (eM/j)^j
    ≤ e^-j for j ≥ e²M, which is 0 in float64 for j ≥ 745. Only bounds the work on graphs
    with huge hubs; it changes no computed value.
    """
    return max(math.ceil(math.e**2 * multiplier), 745)


def appearance_survival(multiplier: float, cap: int) -> np.ndarray:
    """(D1) S(j), j = 1..J+1, J = max(1, min(cap, float64 limit)): a survival function dominating every case.

    The cases: a root (exactly one appearance, masking), and a peripheral node of any degree D
    with all its neighbours among the roots (fewer roots among its neighbours is first-order
    dominated), k ~ min(Bin(D, min(1, M/D)), cap). The law depends on no statistic of A's graph
    (it is recorded with the run): for j ≤ ⌈M⌉, S(j) = 1; for j ≥ ⌈M⌉ + 1 ≥ M + 1 a binomial of
    mean ≤ M has a lighter tail than Poisson(M) (Anderson & Samuels 1967), so
    S(j) = P(Poisson(M) ≥ j) ≥ P(Bin(D, min(1, M/D)) ≥ j) for every D; S(J+1) = 0.
    """
    support = max(1, min(cap, _underflow_limit(multiplier)))  # the root case needs k = 1
    j = np.arange(1, support + 2)
    survival = np.where(j <= max(1, math.ceil(multiplier)), 1.0, stats.poisson.sf(j - 1, multiplier))
    survival[j > support] = 0.0
    return survival


def dominating_law(multiplier: float, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """(D1) the appearance counts k ≥ 1 and p_k = S(k) − S(k+1), zero-mass entries dropped.

    Σ p_k telescopes to S(1) − S(J+1) = 1 with nothing truncated.
    """
    survival = appearance_survival(multiplier, cap)
    mass = survival[:-1] - survival[1:]
    counts = np.arange(1, survival.size)
    keep = mass > 0
    return counts[keep], mass[keep]


def mixture_rule(kind: str, sensitivities: np.ndarray, probabilities: np.ndarray, noise_scale: float) -> PlanRule:
    """(M1, M2) MixtureOfGaussians(noise_scale · z, sensitivities, probabilities), every release counted."""
    return PlanRule(
        kind=kind, participation_bound=None, mechanism="mixture-of-gaussians", noise_scale=noise_scale,
        sensitivities=[float(s) for s in sensitivities], sampling_probs=[float(p) for p in probabilities],
    )


# -- the encoder and A's update (docs section 2) -------------------------------------------------------
class SubgraphEncoder(nn.Module):
    """(E1) h_r = C_f · normalize(W₂ relu(W_x x_r + W_a a_r + b₁) + b₂): one sub-graph, norm C_f.

    It reads G_r only through (x_r, a_r), so a sub-graph without the node z has the same
    h_r in both neighbouring graphs. No dropout: the per-sub-graph gradients differentiate
    exactly the function whose output was released.
    """

    def __init__(self, in_features: int, hidden: int, dim: int, clip: float) -> None:
        super().__init__()
        self.root = nn.Linear(in_features, hidden)
        self.neighbours = nn.Linear(in_features, hidden, bias=False)
        self.out = nn.Linear(hidden, dim)
        self.clip = clip

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return self.clip * F.normalize(self.out(torch.relu(self.root(x) + self.neighbours(a))), dim=-1)


def clipped_gradient_sum(
    encoder: SubgraphEncoder, x: torch.Tensor, a: torch.Tensor, targets: torch.Tensor, clip: float, chunk: int
) -> dict[str, torch.Tensor]:
    """Σ_r ψ̂_r of (G1): per-sub-graph gradients ψ_r = ∇_θ ⟨h_θ(x_r, a_r), g_r⟩, each clipped to C_g.

    torch.func's vmap of grad over the roots, ``chunk`` roots at a time (memory chunk x |θ|).
    """
    params = {name: p.detach() for name, p in encoder.named_parameters()}

    def inner(p: dict[str, torch.Tensor], xr: torch.Tensor, ar: torch.Tensor, gr: torch.Tensor) -> torch.Tensor:
        return (functional_call(encoder, p, (xr[None], ar[None]))[0] * gr).sum()

    per_root = vmap(grad(inner), in_dims=(None, 0, 0, 0))
    total = {name: torch.zeros_like(p) for name, p in params.items()}
    for start in range(0, targets.shape[0], chunk):
        part = slice(start, start + chunk)
        grads = per_root(params, x[part], a[part], targets[part])
        norms = torch.sqrt(sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads.values()))
        factor = torch.clamp(clip / norms.clamp(min=torch.finfo(norms.dtype).tiny), max=1.0)
        for name, g in grads.items():
            total[name] += torch.tensordot(factor, g, dims=1)
    return total


@dataclass
class _Step:
    """What A's update needs from a training step's forward release."""

    extractor: HeterPoissonExtractor
    x: torch.Tensor  # [B, F] roots' features
    a: torch.Tensor  # [B, F] their sub-graphs' neighbour means


class HeterPoissonExtractor(ExtractorBase):
    """HeterPoisson sub-graphs per step: a noised forward release and a DP-SGD update of A's encoder."""

    spec: ClassVar[ExtractorSpec] = ExtractorSpec(
        name="heterpoisson", privacy_unit="node", cost_model="per-step",
        summary="HeterPoisson node-level DP (one node's features and all its edges, replaced by a null node): "
        "Poisson roots, neighbours kept w.p. min(1, M/deg), noisy forward release and per-sub-graph DP-SGD, "
        "each step charged as a mixture of Gaussians (PLD only)",
        params=HeterPoissonParams, uses=("dim", "encoder_hidden", "noise_multiplier"),
        accountings=("visible-batch",), accountants=("pld",), relation=RELATION,
        docs="docs/extractors/heterpoisson.md",
        # every step is charged at node level: few, large steps (docs/extractors/heterpoisson.md)
        run_defaults={"epochs": 5, "batch_size": 512, "extractor.dim": 16},
    )

    def __init__(self, setup: ExtractorSetup) -> None:
        super().__init__(setup)
        ex = setup.config.extractor
        self.params: HeterPoissonParams = setup.params  # type: ignore[assignment]
        self.graph = setup.graph
        # the degree table of the whole graph: public, and the same in both neighbouring graphs
        self.degrees = setup.graph.degree
        self.coins = secret_coins(setup.sampling_generator)
        with seeded(setup.config.seed):  # public: B may know the initialisation
            self.features = random_projection(setup.features, self.params.input_projection)
            self.encoder = SubgraphEncoder(
                self.features.shape[1], ex.encoder_hidden, ex.dim, self.params.embedding_clip
            ).to(device=setup.device, dtype=setup.features.dtype)
        self.trains_encoder = self.params.forward_share < 1.0
        self.encoder.requires_grad_(self.trains_encoder)
        self.forward_std = self.gradient_std = 0.0

    @property
    def output_layers(self) -> int:
        return 1

    # -- what it costs ------------------------------------------------------------------------
    def per_z(self) -> tuple[float, float | None]:
        """(σ_f, σ_g) per unit of z (F1, G2); σ_g is None when nothing is trained."""
        p = self.params
        rho = p.forward_share
        gradient = 2.0 * p.grad_clip / math.sqrt(1.0 - rho) if self.trains_encoder else None
        return 2.0 * p.embedding_clip / math.sqrt(rho), gradient

    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        """(M1) per step and (M2) per evaluation chunk, every release counted (no N_e)."""
        p, config = self.params, self.setup.config
        rho = p.forward_share
        # a Poisson batch can hold every train root, so |train| (not batch_size) caps k
        train_cap, eval_cap = max(1, roots.train_ids.numel()), config.eval_chunk
        train_k, train_p = dominating_law(p.multiplier, train_cap)
        eval_k, eval_p = dominating_law(p.multiplier, eval_cap)
        rules = [
            mixture_rule("train", step_sensitivity(train_k, rho), train_p, 1.0),
            mixture_rule("eval", eval_sensitivity(eval_k), eval_p, 1.0 / math.sqrt(rho)),
        ]
        forward, gradient = self.per_z()
        details: dict[str, Any] = {
            "sensitivity_form": "per-step mixture of Gaussians",
            "neighbouring": RELATION,
            "degree_table": "public: the keep probabilities min(1, M/deg) use the whole graph's degrees",
            "multiplier": p.multiplier,
            "root_rate": self.root_rate(roots.train_ids.numel(), config.batch_size),
            "root_sampling_credit": "none: B sees every batch's ids",
            "appearance_cap": {"train": train_cap, "eval": eval_cap},
            "appearances_mean": {"train": float(train_k @ train_p), "eval": float(eval_k @ eval_p)},
            "noise_std_per_z": {"forward": forward, "gradient": gradient},
            "derivation": "a node in k sub-graphs of a step moves the forward rows by <= sqrt(k) 2C_f and the "
            "clipped gradient sum by <= k 2C_g: whitened sqrt(k rho + k^2 (1-rho))/z; k = 1 as a root, else "
            "<= Bin(deg, min(1, M/deg)); charged MixtureOfGaussians over the law dominating every degree "
            "(docs/extractors/heterpoisson.md)",
        }
        return ChargePlan(rules, forward, participation_bound=None, details=details)

    def bind(self, noise_multiplier: float | None) -> None:
        super().bind(noise_multiplier)
        forward, gradient = self.per_z()
        self.forward_std = 0.0 if noise_multiplier is None else noise_multiplier * forward
        self.gradient_std = 0.0 if noise_multiplier is None or gradient is None else noise_multiplier * gradient

    # -- the sampler ([HeterPoisson, Algs. 2-3]) -------------------------------------------
    def root_rate(self, train_roots: int, batch_size: int) -> float:
        return self.params.root_rate or default_rate(batch_size, train_roots)

    def root_batches(self, train_ids: torch.Tensor, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
        """[HeterPoisson, Alg. 2, lines 3-6]: ceil(|train|/batch_size) independent Poisson samples at q_b.

        ``generator`` is the trainer's public root-order generator: B sees the roots anyway.
        """
        count = train_ids.numel()
        return poisson_root_batches(
            train_ids, self.root_rate(count, batch_size), batches_per_epoch(count, batch_size), generator
        )

    def sample(self, roots: torch.Tensor) -> SubgraphBatch:
        """The step's sub-graphs: NeighborSampling with A's secret coins, then masking."""
        return heter_poisson(self.graph, self.degrees, roots, self.params.multiplier, self.coins)

    # -- releases -----------------------------------------------------------------------------
    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        """e_r (F1) for every root, B x d x 1; in training its backward is A's update (G1-G2)."""
        return self.release_batch(self.sample(roots), kind)

    def release_batch(self, batch: SubgraphBatch, kind: ReleaseKind) -> torch.Tensor:
        x, a = self.features[batch.roots], neighbour_mean(self.features, batch)
        with torch.no_grad():
            released = self.encoder(x, a)
            released = self.perturb(released, self.forward_std, rows=batch.roots)
        released = released.unsqueeze(-1)
        if kind != "train" or not self.trains_encoder or not torch.is_grad_enabled():
            return released
        return PrivateBackward.apply(released, _Step(self, x, a), *self.encoder.parameters())

    def private_gradient(self, step: _Step, grad_output: torch.Tensor) -> list[torch.Tensor]:
        """(G1-G2): clipped per-sub-graph gradients, summed, noised once, divided by |R|."""
        batch = grad_output.shape[0]
        # B's loss is the batch mean: g_r · |R| is the gradient of root r's own loss
        targets = grad_output[:, :, 0] * batch
        sums = clipped_gradient_sum(
            self.encoder, step.x, step.a, targets, self.params.grad_clip, self.params.grad_chunk
        )
        out = []
        for name, _ in self.encoder.named_parameters():
            out.append(self.perturb(sums[name].clone(), self.gradient_std) / max(1, batch))
        return out

    def trainable_parameters(self) -> list[nn.Parameter]:
        return list(self.encoder.parameters()) if self.trains_encoder else []
