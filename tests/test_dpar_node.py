"""dpar-node: empirical node-level sensitivity of every release it charges, and its plumbing.

Neighbouring graphs differ by one node v* with its features and all its edges
(add/remove: in G' v* is isolated and its features are NaN, "absent"). Every check runs
the production code without noise on G and G' and compares the L2 distance with the
sensitivity the accountant is charged (docs/extractors/dpar-node.md, section 3):

  (A-S)  the one-shot DP-APPR scores û over all roots:      ≤ √(2|S|) C₁
  (F-S)  one pass of forward releases, given the released
         neighbourhoods:                                    ≤ τ₂
  (G-S)  one pass of clipped gradient sums (per update s_t):
         Σ_t s_t ≤ C τ₁ (which implies √(Σ_t s_t²) ≤ C τ₁)

on hypothesis-drawn random graphs and on adversarial ones (a hub in every
neighbourhood, an isolated node, a leaf), and shows that deliberately too small claims
are caught, so the checks can fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vesper.common.config import RunConfig
from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.ledger import composed_event, counted_per_kind
from vesper.party_a.extractors import appr
from vesper.party_a.extractors.base import ExtractorSetup, RootPlan
from vesper.party_a.extractors.dpar_node import (
    DparNodeExtractor,
    DparNodeParams,
    build_neighbourhoods,
    clip_rows,
    column_norms,
    dp_appr_top_k,
    forward_pass_sensitivity,
    gradient_pass_sensitivity,
    one_shot_sensitivity,
    split_multipliers,
)
from vesper.party_a.graph_store import Graph, build_graph
from vesper.party_a.noise import NoiseSource

TOLERANCE = 1e-5
DIM, HIDDEN, FEATURES = 4, 6, 5


# -- neighbouring pairs ------------------------------------------------------------------------
def graph_from(edges: list[tuple[int, int]], n: int) -> Graph:
    return build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), n)


def without_node(graph: Graph, features: torch.Tensor, v: int) -> tuple[Graph, torch.Tensor]:
    """G' of the add/remove relation: every edge of v removed, v's features absent (NaN)."""
    rows = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.degree)
    keep = (rows != v) & (graph.indices != v)
    reduced = build_graph(torch.stack([rows[keep], graph.indices[keep]], 1), graph.num_nodes)
    absent = features.clone()
    absent[v] = math.nan
    return reduced, absent


def star(leaves: int) -> Graph:
    """Node 0 is the hub: every leaf's only neighbour, so in every leaf's top-K."""
    return graph_from([(0, i) for i in range(1, leaves + 1)], leaves + 1)


def extractor(graph: Graph, features: torch.Tensor, params: dict, batch: int = 4, seed: int = 0) -> DparNodeExtractor:
    """The production extractor, noise off (z = None), as the trainer builds it."""
    config = RunConfig(
        epochs=1, batch_size=batch, seed=seed,
        extractor={"name": "dpar-node", "dim": DIM, "encoder_hidden": HIDDEN, "params": params},
    )
    parsed = DparNodeParams.model_validate(params)
    setup = ExtractorSetup(
        config, parsed, graph, features, torch.device("cpu"), torch.Generator().manual_seed(1),
        torch.Generator().manual_seed(2), 1e-3,
    )
    ex = DparNodeExtractor(setup)
    n = graph.num_nodes
    ex.charge_plan(RootPlan(torch.arange(n), torch.arange(0), torch.arange(n), math.ceil(n / batch), 1))
    ex.bind(None)
    return ex


@dataclass(frozen=True)
class Pair:
    """A neighbouring pair and the released neighbourhoods both worlds are conditioned on."""

    graph: Graph
    features: torch.Tensor
    v: int
    params: dict
    batch: int
    appr_noise: float = 0.0  # σ₁ of the one-shot whose output both worlds condition on
    seed: int = 0

    def worlds(self) -> tuple[DparNodeExtractor, DparNodeExtractor]:
        """(G, G'): same encoder initialisation, the same released neighbourhoods."""
        g_prime, x_prime = without_node(self.graph, self.features, self.v)
        with_v = extractor(self.graph, self.features, self.params, self.batch, self.seed)
        without_v = extractor(g_prime, x_prime, self.params, self.batch, self.seed)
        p = with_v.params
        sources = torch.arange(self.graph.num_nodes)
        top_nodes, top_values = dp_appr_top_k(
            self.graph, sources, alpha=p.alpha, rho=p.rho, iterations=p.ista_iterations, clip=p.appr_clip,
            k=p.top_k, noise_std=self.appr_noise, source=NoiseSource(torch.Generator().manual_seed(self.seed)),
        )
        hoods = build_neighbourhoods(sources, top_nodes, top_values, self.graph.num_nodes, p)
        with_v.hoods = without_v.hoods = hoods
        return with_v, without_v

    def order(self) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed)
        return list(torch.randperm(self.graph.num_nodes, generator=generator).split(self.batch))


# -- the three measurements ------------------------------------------------------------------
def forward_pass_distance(pair: Pair) -> float:
    """√(Σ_steps ‖ΔB x d x 1‖²) of one pass of forward releases (F-S), noise off."""
    with_v, without_v = pair.worlds()
    squared = 0.0
    for kind in ("train", "eval"):
        total = 0.0
        for roots in pair.order():
            with torch.no_grad():
                total += float((with_v.release(roots, kind) - without_v.release(roots, kind)).pow(2).sum())
        squared = max(squared, total)
    return math.sqrt(squared)


def gradient_pass_distances(pair: Pair, gain: float = 50.0) -> list[float]:
    """s_t = ‖Δ(clipped gradient sum)‖ of every step of one pass, θ fixed, noise off (G-S).

    B's gradients are the same in both worlds (they are post-processing of the released
    embeddings) and large, so the clip binds and the bound can be approached.
    """
    with_v, without_v = pair.worlds()
    generator = torch.Generator().manual_seed(pair.seed + 7)
    distances = []
    for roots in pair.order():
        b_gradient = gain * torch.randn((roots.numel(), DIM, 1), generator=generator) / roots.numel()
        sums = []
        for ex in (with_v, without_v):
            for p in ex.encoder.parameters():
                p.grad = None
            ex.release(roots, "train").backward(b_gradient)
            # dp_batch = 0: each step is one update, and the optimiser sees sum / |batch|
            sums.append(torch.cat([p.grad.reshape(-1) * roots.numel() for p in ex.encoder.parameters()]))
        distances.append(float((sums[0] - sums[1]).norm()))
    return distances


def one_shot_distance(pair: Pair) -> float:
    """‖Δû‖_F of the clipped APPR scores of every root before their noise (A-S)."""
    g_prime, _ = without_node(pair.graph, pair.features, pair.v)
    p = DparNodeParams.model_validate(pair.params)
    sources = torch.arange(pair.graph.num_nodes)
    scores = []
    for graph in (pair.graph, g_prime):
        op = appr.walk_operator(graph)
        u = clip_rows(appr.clip_scores(appr.ista_appr(op, sources, p.alpha, p.rho, p.ista_iterations), sources, math.inf), p.appr_clip)
        scores.append(torch.where(torch.isfinite(u), u, torch.zeros_like(u)))
    return float((scores[0] - scores[1]).norm())


def claimed(pair: Pair) -> tuple[float, float, float]:
    """What the accountant is charged: (A-S), (F-S), (G-S)."""
    p = DparNodeParams.model_validate(pair.params)
    return (
        one_shot_sensitivity(pair.graph.num_nodes, p.appr_clip),
        forward_pass_sensitivity(p.column_l2),
        gradient_pass_sensitivity(p.grad_clip, p.column_l1),
    )


def check(pair: Pair) -> None:
    s_one_shot, s_forward, s_gradient = claimed(pair)
    assert one_shot_distance(pair) <= s_one_shot + TOLERANCE
    assert forward_pass_distance(pair) <= s_forward + TOLERANCE
    steps = gradient_pass_distances(pair)
    assert sum(steps) <= s_gradient + TOLERANCE
    assert math.sqrt(sum(s * s for s in steps)) <= s_gradient + TOLERANCE


# -- scenarios -----------------------------------------------------------------------------------
def features_for(n: int, seed: int) -> torch.Tensor:
    return torch.randn((n, FEATURES), generator=torch.Generator().manual_seed(seed))


@st.composite
def random_pairs(draw: st.DrawFn) -> Pair:
    n = draw(st.integers(4, 12))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    params = {
        "top_k": draw(st.integers(1, 3)),
        "self_weight": draw(st.sampled_from([0.0, 0.3, 0.5, 1.0])),
        "neighbour_weights": draw(st.sampled_from(["uniform", "appr"])),
        "column_l1": draw(st.sampled_from([0.4, 1.0, 2.5])),
        "column_l2": draw(st.sampled_from([0.3, 0.6, 1.5])),
        "grad_clip": draw(st.sampled_from([0.5, 1.0])),
        "appr_clip": draw(st.sampled_from([0.01, 0.3])),
        "ista_iterations": draw(st.integers(2, 6)),
    }
    seed = draw(st.integers(0, 1000))
    return Pair(
        graph_from(edges, n), features_for(n, seed), draw(st.integers(0, n - 1)), params,
        batch=draw(st.integers(1, n)), appr_noise=draw(st.sampled_from([0.0, 0.01])), seed=seed,
    )


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_pairs())
def test_random_pairs_stay_within_every_charged_sensitivity(pair: Pair) -> None:
    check(pair)


# the hub's column before clipping: β = 0.5 and eight leaves at (1 − β)/K = 0.25, so ‖·‖₁ = 2.5 and
# ‖·‖₂ = √0.75; with τ₁/τ₂ = 2.5/√0.75 both clips bind at once and both bounds can be reached
HUB = Pair(star(8), features_for(9, 3), v=0, params={"top_k": 2, "column_l1": math.sqrt(3.0), "column_l2": 0.6}, batch=9)


@pytest.mark.parametrize("pair", [
    HUB,  # the hub is in every leaf's neighbourhood: column clipping is what bounds it
    Pair(star(8), features_for(9, 4), v=3, params={"top_k": 2}, batch=2),  # a leaf
    Pair(graph_from([(1, 2), (2, 3), (3, 1)], 5), features_for(5, 5), v=4, params={"top_k": 2}, batch=2, appr_noise=0.05),  # isolated
    Pair(star(6), features_for(7, 6), v=0, params={"top_k": 3, "self_weight": 0.0, "neighbour_weights": "appr",
                                                    "column_l1": 3.0, "column_l2": 2.0}, batch=3),
], ids=["hub", "leaf", "isolated", "hub-appr-weights"])
def test_adversarial_pairs_stay_within_every_charged_sensitivity(pair: Pair) -> None:
    check(pair)


def test_the_hub_attains_the_bounds_and_too_small_claims_are_caught() -> None:
    """The checks can fail: the hub reaches τ₂ and C τ₁, so smaller claims are violated."""
    s_one_shot, s_forward, s_gradient = claimed(HUB)
    forward = forward_pass_distance(HUB)
    steps = gradient_pass_distances(HUB)
    one_shot = one_shot_distance(HUB)
    assert forward == pytest.approx(s_forward, rel=1e-4)  # ‖h_{v*}‖ = 1 and its column sits at τ₂
    assert sum(steps) == pytest.approx(s_gradient, rel=1e-4)  # all of v*'s roots in one step, clip binding
    # wrong claims a careless derivation would make, each caught on this pair:
    own_root_only = HUB.params.get("self_weight", 0.5)  # "v* changes only its own root's release"
    assert forward > own_root_only + 0.05
    assert sum(steps) > gradient_pass_sensitivity(1.0, HUB.params["column_l2"]) + 0.1  # ℓ2 column norm for the gradient
    assert one_shot > DparNodeParams().appr_clip  # the paper's C₁: one node changes many APPR rows
    assert s_one_shot >= one_shot


# -- plumbing --------------------------------------------------------------------------------------
def test_the_private_gradient_is_the_exact_gradient_when_nothing_clips() -> None:
    """(G1-G2) with a huge C and no noise equals autograd's gradient of ⟨ẽ, g⟩ / |batch|."""
    pair = Pair(star(5), features_for(6, 9), v=0, params={"top_k": 2, "grad_clip": 1e6}, batch=6)
    ex, _ = pair.worlds()
    roots = torch.arange(6)
    g = torch.randn((6, DIM, 1), generator=torch.Generator().manual_seed(0))
    ex.release(roots, "train").backward(g)
    private = [p.grad.clone() for p in ex.encoder.parameters()]
    for p in ex.encoder.parameters():
        p.grad = None
    rows = ex.hoods.row_of[roots]
    nodes, weights = ex.hoods.nodes[rows], ex.hoods.weights[rows]
    exact = torch.einsum("bk,bkd->bd", weights, ex.embed(nodes.reshape(-1)).reshape(6, -1, DIM))
    (exact * g[:, :, 0]).sum().backward()
    for mine, reference in zip(private, [p.grad for p in ex.encoder.parameters()], strict=True):
        assert torch.allclose(mine, reference, atol=1e-5)


def test_column_clipping_meets_both_bounds() -> None:
    pair = Pair(star(30), features_for(31, 1), v=0, params={"top_k": 3, "column_l1": 0.7, "column_l2": 0.4}, batch=4)
    ex, _ = pair.worlds()
    l1, l2 = column_norms(ex.hoods.nodes, ex.hoods.weights, 31)
    assert float(l1.max()) <= 0.7 + 1e-6 and float(l2.max()) <= 0.4 + 1e-6


def test_an_absent_node_has_embedding_zero() -> None:
    graph = star(3)
    g_prime, x_prime = without_node(graph, features_for(4, 0), 0)
    ex = extractor(g_prime, x_prime, {"top_k": 1})
    assert torch.all(ex.embed(torch.tensor([0])) == 0) and torch.all(ex.embed(torch.tensor([1])).norm(dim=1) > 0.99)


def test_the_multipliers_compose_to_the_planned_shares() -> None:
    """(Z1-Z3): a pass is Gaussian(z); the one-shot and the sweep hold shares a and b of μ²."""
    z, rho, a, b, epochs = 1.7, 0.6, 0.15, 0.25, 4
    m = split_multipliers(z, rho, b, a, epochs, one_shot=True)
    assert 1 / m.forward**2 + 1 / m.gradient**2 == pytest.approx(1 / z**2)
    total = epochs / z**2 + 1 / m.eval**2 + 1 / m.one_shot**2
    assert 1 / m.one_shot**2 == pytest.approx(a * total) and 1 / m.eval**2 == pytest.approx(b * total)


def test_the_plan_charges_one_shot_then_one_gaussian_per_pass() -> None:
    graph = star(7)
    ex = extractor(graph, features_for(8, 0), {"top_k": 2})
    roots = RootPlan(torch.arange(4), torch.arange(4, 6), torch.arange(6, 8), 2, 1)
    plan = ex.charge_plan(roots)
    rules = {r.kind: r for r in plan.rules}
    assert plan.one_shot_releases == 1 and rules["one-shot"].participation_bound is None
    assert rules["train"].participation_bound == 1 and rules["eval"].participation_bound == 1
    assert all(r.mechanism == "gaussian" for r in plan.rules)
    # the run's ε is that of one Gaussian with μ² = 1/z₁² + E/z² + 1/z_e²
    z, delta = 2.0, 1e-3
    passes = plan.passes(3, roots)
    counted = counted_per_kind(passes, {r.kind: r.participation_bound for r in plan.rules})
    assert counted == {"one-shot": 1, "train": 3, "eval": 1}
    event = composed_event({r.kind: r.event(z) for r in plan.rules}, counted)
    d = DparNodeParams()
    m = split_multipliers(z, d.forward_share, d.eval_share, d.appr_share, 1, one_shot=True)  # the config has 1 epoch
    mu = math.sqrt(1 / m.one_shot**2 + 3 / z**2 + 1 / m.eval**2)
    assert epsilon_of(event, delta).epsilon == pytest.approx(epsilon_of(dpa.GaussianDpEvent(1 / mu), delta).epsilon, rel=1e-6)


class _Session:
    def __init__(self, roots: RootPlan, log: list[str]) -> None:
        self.roots, self.log = roots, log

    def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
        self.log.append(f"charge {index} {node_ids.numel()}")

    def progress(self, message: str) -> None:
        self.log.append("progress")


def test_prepare_charges_the_one_shot_before_the_neighbourhoods_exist() -> None:
    graph = star(5)
    ex = extractor(graph, features_for(6, 0), {"top_k": 2})
    log: list[str] = []
    original = ex.hoods

    class Watching(_Session):
        def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
            assert ex.hoods is original  # nothing derived from the one-shot exists yet
            super().charge_one_shot(index, node_ids)

    ex.prepare(Watching(RootPlan(torch.arange(3), torch.arange(3, 4), torch.arange(4, 5), 1, 1), log))
    assert log[-1] == "charge 0 5" and ex.hoods is not None
    assert ex.release(torch.tensor([0, 4]), "eval").shape == (2, DIM, 1)
    with pytest.raises(ValueError, match="not one of the run's roots"):
        ex.release(torch.tensor([5]), "eval")


def test_a_refused_one_shot_leaves_nothing_to_release() -> None:
    ex = extractor(star(5), features_for(6, 0), {"top_k": 2})

    class Refusing(_Session):
        def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
            raise RuntimeError("refused")

    with pytest.raises(RuntimeError, match="refused"):
        ex.prepare(Refusing(RootPlan(torch.arange(3), torch.arange(3, 4), torch.arange(4, 6), 1, 1), []))
    assert ex.hoods is None
    with pytest.raises(RuntimeError, match="prepare"):
        ex.release(torch.tensor([0]), "eval")
