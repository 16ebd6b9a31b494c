"""The DP-APPR core (party_a.extractors.appr): ISTA APPR, clipping, the two private top-K.

ISTA is checked against dense closed forms of personalised PageRank on small graphs, the
clipping bounds hold, and the two selections draw what they claim to draw (exact top-K
without noise; the exponential mechanism's peeling probabilities with Gumbel noise).
The sensitivities are checked empirically in test_dpar_edge.py.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from conftest import random_graph

from vesper.party_a.extractors import appr
from vesper.party_a.graph_store import Graph, build_graph
from vesper.party_a.noise import NoiseSource


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny sparse products: intra-op threads only add contention on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def dense_walk(graph: Graph) -> torch.Tensor:
    """P = D⁻¹A with P_vv = 1 for isolated v, dense float64 (the reference)."""
    n = graph.num_nodes
    adjacency = torch.zeros(n, n, dtype=torch.float64)
    for v in range(n):
        adjacency[v, graph.neighbours(v)] = 1.0
    degree = adjacency.sum(1, keepdim=True)
    return torch.where(degree > 0, adjacency / degree.clamp(min=1), torch.eye(n, dtype=torch.float64))


def graphs() -> list[Graph]:
    rng = random.Random(7)
    out = [random_graph(rng, n, p) for n, p in ((9, 0.3), (14, 0.15), (20, 0.5), (6, 0.0))]
    out.append(build_graph(torch.tensor([[0, i] for i in range(1, 11)]), 13))  # a hub, two isolated nodes
    return out


@pytest.mark.parametrize("graph", graphs(), ids=lambda g: f"n{g.num_nodes}-m{g.num_edges}")
@pytest.mark.parametrize("alpha", [0.1, 0.25, 0.8])
def test_ista_is_the_truncated_ppr_series_and_converges_to_the_closed_form(graph: Graph, alpha: float) -> None:
    walk = dense_walk(graph)
    op = appr.walk_operator(graph, torch.float64)
    sources = torch.arange(graph.num_nodes)
    for iterations in (1, 2, 3, 5):
        series = sum(alpha * (1 - alpha) ** t * torch.linalg.matrix_power(walk, t) for t in range(iterations))
        got = appr.ista_appr(op, sources, alpha, 0.0, iterations)
        torch.testing.assert_close(got, series, rtol=0, atol=1e-12)
    # the closed form π_s = α e_s (I − (1−α)P)⁻¹, reached to ℓ1 error exactly (1 − α)^T
    exact = alpha * torch.linalg.inv(torch.eye(graph.num_nodes, dtype=torch.float64) - (1 - alpha) * walk)
    assert torch.allclose(exact.sum(1), torch.ones(graph.num_nodes, dtype=torch.float64))  # rows are distributions
    iterations = 30
    error = (exact - appr.ista_appr(op, sources, alpha, 0.0, iterations)).abs().sum(1)
    torch.testing.assert_close(error, torch.full_like(error, (1 - alpha) ** iterations), rtol=1e-9, atol=1e-13)


@pytest.mark.parametrize("graph", graphs()[:3], ids=lambda g: f"n{g.num_nodes}")
def test_ista_with_l1_regularisation_is_the_proximal_iteration_and_reaches_its_fixed_point(graph: Graph) -> None:
    alpha, rho = 0.25, 0.02
    walk = dense_walk(graph)
    degree = graph.degree.to(torch.float64)
    theta = rho * alpha * degree
    teleport = alpha * torch.eye(graph.num_nodes, dtype=torch.float64)
    p = torch.zeros(graph.num_nodes, graph.num_nodes, dtype=torch.float64)
    op = appr.walk_operator(graph, torch.float64)
    sources = torch.arange(graph.num_nodes)
    for iterations in range(1, 7):
        p = ((1 - alpha) * p @ walk + teleport - theta).clamp(min=0)
        torch.testing.assert_close(appr.ista_appr(op, sources, alpha, rho, iterations), p, rtol=0, atol=1e-12)
    # at convergence p = S_θ((1−α)pP + αe_s): the optimality condition of the ℓ1-regularised problem
    fixed = appr.ista_appr(op, sources, alpha, rho, 60)  # contraction (1 − α)^60 < 1e-7
    torch.testing.assert_close(fixed, ((1 - alpha) * fixed @ walk + teleport - theta).clamp(min=0), rtol=0, atol=1e-7)
    assert (fixed <= appr.ista_appr(op, sources, alpha, 0.0, 60) + 1e-12).all()  # regularisation only shrinks


def test_sparse_and_dense_walk_steps_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    graph = random_graph(random.Random(3), 40, 0.08)
    op = appr.walk_operator(graph, torch.float64)
    sources = torch.tensor([0, 5, 17, 39])
    results = []
    for density in (0.0, 1.1):  # always dense / always sparse
        monkeypatch.setattr(appr, "_SPARSE_DENSITY", density)
        results.append(appr.ista_appr(op, sources, 0.3, 0.01, 6))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-12)


def test_clipping_bounds_every_score_and_excludes_the_source() -> None:
    graph = random_graph(random.Random(4), 15, 0.3)
    sources = torch.tensor([3, 0, 14])
    p = appr.ista_appr(appr.walk_operator(graph), sources, 0.25, 0.0, 4)
    u = appr.clip_scores(p.clone(), sources, 0.05)
    assert u[torch.arange(3), sources].eq(-math.inf).all()
    rest = u[torch.isfinite(u)]
    assert rest.max() <= 0.05 and rest.min() >= 0
    with pytest.raises(ValueError, match="C must be > 0"):
        appr.clip_scores(p, sources, 0.0)


def test_column_clipping_bounds_each_nodes_total_weight() -> None:
    indices = torch.tensor([[1, 2], [1, 3], [1, 2], [0, 3]])
    weights = torch.full((4, 2), 0.5)
    clipped = appr.clip_columns(indices, weights, 5, tau=1.0)
    mass = torch.zeros(5).index_add_(0, indices.reshape(-1), clipped.reshape(-1))
    assert torch.all(mass <= 1.0 + 1e-6)
    assert mass[1] == pytest.approx(1.0)  # node 1 had 1.5, scaled down to τ
    assert clipped[3, 0] == 0.5 and mass[3] == pytest.approx(1.0)  # at most τ already: unchanged


def test_without_noise_both_mechanisms_release_the_exact_top_k() -> None:
    graph = random_graph(random.Random(5), 30, 0.2)
    sources = torch.arange(30)
    p = appr.ista_appr(appr.walk_operator(graph), sources, 0.25, 0.0, 5)
    p[sources, sources] = -1.0
    expected = torch.topk(p.clamp(max=0.05), 3, dim=1).values
    for mechanism in ("gaussian", "exponential"):
        top = appr.private_top_k(
            graph, sources, alpha=0.25, rho=0.0, iterations=5, clip=0.05, k=3, mechanism=mechanism, noise=0.0, source=None,
        )
        chosen = p.clamp(max=0.05).gather(1, top.indices)
        torch.testing.assert_close(chosen, expected)  # the same scores (ties may swap indices)
        assert not (top.indices == sources[:, None]).any()


def test_batching_does_not_change_the_release() -> None:
    graph = random_graph(random.Random(6), 50, 0.1)
    sources = torch.arange(50)
    kwargs = dict(alpha=0.3, rho=0.0, iterations=4, clip=0.1, k=4, mechanism="gaussian", noise=0.0, source=None)
    whole = appr.private_top_k(graph, sources, **kwargs, batch_elements=1 << 20)
    batched = appr.private_top_k(graph, sources, **kwargs, batch_elements=3 * 50)
    assert torch.equal(whole.values, batched.values)


def test_k_is_capped_at_the_number_of_candidates_and_noise_follows_the_generator() -> None:
    graph = build_graph(torch.tensor([[0, 1], [1, 2]]), 3)
    kwargs = dict(alpha=0.25, rho=0.0, iterations=3, clip=0.05, k=8, mechanism="gaussian", noise=1.0)
    first = appr.private_top_k(graph, torch.arange(3), **kwargs, source=NoiseSource(torch.Generator().manual_seed(1)))
    again = appr.private_top_k(graph, torch.arange(3), **kwargs, source=NoiseSource(torch.Generator().manual_seed(1)))
    assert first.indices.shape == (3, 2)
    assert torch.equal(first.indices, again.indices) and torch.equal(first.values, again.values)


def test_gaussian_noise_has_the_requested_scale() -> None:
    noise = NoiseSource(torch.Generator().manual_seed(0)).gaussian(torch.zeros(400, 500), 0.3)
    assert noise.mean().abs() < 0.003 and noise.std() == pytest.approx(0.3, rel=0.01)


def _chi_square(counts: torch.Tensor, probabilities: torch.Tensor) -> float:
    expected = probabilities * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_gumbel_top_1_is_the_exponential_mechanism() -> None:
    u = torch.tensor([0.0, 0.05, 0.1, 0.2, -math.inf])
    scale, draws = 0.08, 40_000
    chosen = appr.gumbel_top_k(u.repeat(draws, 1), 1, scale, NoiseSource(torch.Generator().manual_seed(2)))[:, 0]
    assert not (chosen == 4).any()  # −∞ (the source itself) is never chosen
    probabilities = torch.softmax(u[:4] / scale, 0)
    counts = torch.bincount(chosen, minlength=4)[:4].double()
    assert _chi_square(counts, probabilities.double()) < 16.3  # χ²(3) at p = 0.001


def test_gumbel_top_2_is_two_peeling_rounds() -> None:
    u = torch.tensor([0.0, 0.1, 0.2])
    scale, draws = 0.1, 40_000
    chosen = appr.gumbel_top_k(u.repeat(draws, 1), 2, scale, NoiseSource(torch.Generator().manual_seed(3)))
    weights = torch.exp(u / scale).double()
    pairs = [(a, b) for a in range(3) for b in range(3) if a != b]
    # Pr[(a, b)] = w_a / Σw · w_b / (Σw − w_a): EM, then EM over the rest
    probabilities = torch.tensor([weights[a] / weights.sum() * weights[b] / (weights.sum() - weights[a]) for a, b in pairs])
    counts = torch.tensor([float(((chosen[:, 0] == a) & (chosen[:, 1] == b)).sum()) for a, b in pairs], dtype=torch.float64)
    assert _chi_square(counts, probabilities) < 20.5  # χ²(5) at p = 0.001


def test_sensitivity_formulas() -> None:
    change = appr.appr_change(0.25, 0.0, 100)
    assert change.l1 == pytest.approx(12.0) and change.linf == pytest.approx(6.0)
    assert appr.appr_change(0.25, 0.001, 100).l1 == pytest.approx(12.2)  # + 2ρ|S|
    assert appr.appr_change(0.25, 0.001, 100).linf == appr.appr_change(0.25, 0.001, 100).l1
    assert appr.appr_change(0.25, 0.0, 100, edges_changed=3).l1 == pytest.approx(36.0)
    s = appr.edge_level_sensitivity(0.25, 0.0, 0.05, 100)
    assert s.gaussian == pytest.approx(math.sqrt(0.05 * 12)) and s.exponential == pytest.approx(math.sqrt(0.05 * 6))
    # when C exceeds A_∞ the cap is A_∞
    assert appr.edge_level_sensitivity(0.9, 0.0, 1.0, 10).exponential == pytest.approx(2 * 0.1 / 0.9)
    node = appr.node_level_sensitivity(0.25, 0.0, 0.05, 4)
    assert node.exponential == pytest.approx(0.1) and math.isinf(node.gaussian)
    bounded = appr.node_level_sensitivity(0.25, 0.0, 0.05, 10_000, edges_changed=10)
    assert bounded.exponential == pytest.approx(math.sqrt(0.05 * 60))
    assert bounded.exponential < math.sqrt(10_000) * 0.05  # the structural bound wins for many sources
    with pytest.raises(ValueError):
        appr.appr_change(1.0, 0.0, 1)


def test_bad_arguments_are_refused() -> None:
    graph = build_graph(torch.tensor([[0, 1]]), 2)
    op = appr.walk_operator(graph)
    with pytest.raises(ValueError, match="alpha"):
        appr.ista_appr(op, torch.arange(2), 0.0, 0.0, 3)
    with pytest.raises(ValueError, match="iterations"):
        appr.ista_appr(op, torch.arange(2), 0.5, 0.0, 0)
    with pytest.raises(ValueError, match="mechanism"):
        appr.private_top_k(graph, torch.arange(2), alpha=0.5, rho=0, iterations=2, clip=0.1, k=1, mechanism="laplace",  # type: ignore[arg-type]
                           noise=0.0, source=None)
