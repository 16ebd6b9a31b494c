"""Empirical sensitivity: pre-noise releases on neighbouring graphs never differ by more
than the sensitivity the accountant charges (privacy contract, "Every extractor must", 2).

Neighbouring graphs G and G + (u, v) go through the production sampler with the same
secret seed and the production aggregation; inputs are non-negative with norm ≤ 1,
as every PMP layer's inputs are. Bounds and derivations: docs/privacy.md, section 3.
"""

import random

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from vesper.common.config import ExtractorConfig
from vesper.party_a.extractors.pmp import PmpExtractor, gcn_aggregate, gin_aggregate
from vesper.party_a.extractors.sensitivity import (
    gcn_layer_sensitivity,
    gin_layer_sensitivity,
    layer_sensitivity,
    participation_bound,
    step_sensitivity,
)
from vesper.party_a.graph_store import Graph, add_edge, build_graph
from vesper.party_a.sampler import NeighbourSampler, make_block, sample_neighbours

TOLERANCE = 1e-5


def _extractor(name: str, fanout: int, d_min: int, graph: Graph, layers: int = 1) -> PmpExtractor:
    config = ExtractorConfig(name=name, layers=layers, fanout=fanout, d_min=d_min, dim=4, encoder_hidden=8)
    capped = graph.degree.clamp(max=fanout) if fanout else graph.degree
    return PmpExtractor(config, in_features=3, capped_degree=capped).eval()


def aggregate_all(name: str, graph: Graph, h: torch.Tensor, fanout: int, d_min: int, seed) -> torch.Tensor:
    """The pre-noise release a_w of every node w, as PmpExtractor.aggregate computes it."""
    nodes = torch.arange(graph.num_nodes)
    edge_dst, neighbours = sample_neighbours(graph, nodes, fanout, seed)
    block = make_block(nodes, edge_dst, neighbours)
    if name == "pmp-gin":
        return gin_aggregate(block, h[block.src_nodes])
    capped = graph.degree.clamp(max=fanout) if fanout else graph.degree
    return gcn_aggregate(block, h[block.src_nodes], capped, d_min)


def release_distance(name: str, graph: Graph, u: int, v: int, h: torch.Tensor, fanout: int, d_min: int, seed) -> float:
    """‖{a_w(G + uv)} − {a_w(G)}‖ over all nodes w, same sampling seed."""
    before = aggregate_all(name, graph, h, fanout, d_min, seed)
    after = aggregate_all(name, add_edge(graph, u, v), h, fanout, d_min, seed)
    return float((after - before).norm())


@pytest.mark.parametrize("name", ["pmp-gin", "pmp-gcn"])
def test_the_extractor_releases_exactly_these_aggregates(name: str) -> None:
    graph = _graph(8, [(0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (0, 6)])
    h = inputs("random", 8, torch.Generator().manual_seed(0))
    nodes = torch.arange(8)
    block = make_block(nodes, *sample_neighbours(graph, nodes, 2, (1, 2)))
    expected = aggregate_all(name, graph, h, 2, 2, (1, 2))
    assert torch.equal(_extractor(name, 2, 2, graph).aggregate(block, h[block.src_nodes]), expected)


def bound(name: str, fanout: int, d_min: int) -> float:
    return layer_sensitivity(name, fanout, d_min)


def inputs(kind: str, n: int, generator: torch.Generator) -> torch.Tensor:
    """Layer inputs: non-negative, norm ≤ 1, in the shapes that maximise each term."""
    if kind == "aligned":  # all equal: sums add up fully
        return torch.full((n, 4), 0.5)
    if kind == "orthogonal":  # one-hot: swaps cost √2
        return torch.eye(n)
    if kind == "zeros-and-ones":
        h = torch.zeros(n, 4)
        h[torch.rand(n, generator=generator) > 0.5, 0] = 1.0
        return h
    h = torch.rand(n, 4, generator=generator)
    return h / h.norm(dim=1, keepdim=True).clamp_min(1e-12) * torch.rand(n, 1, generator=generator)


@st.composite
def neighbouring_pairs(draw):
    n = draw(st.integers(2, 24))
    p = draw(st.floats(0.0, 0.8))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = random.Random(seed)
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    present = set(edges)
    missing = [(i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in present]
    assume(missing)
    u, v = rng.choice(missing)
    graph = build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), n)
    fanout = draw(st.sampled_from([0, 1, 2, 3, 5, 8]))
    d_min = draw(st.integers(0, fanout if fanout else 6))
    kind = draw(st.sampled_from(["aligned", "orthogonal", "zeros-and-ones", "random"]))
    h = inputs(kind, n, torch.Generator().manual_seed(seed))
    return graph, u, v, h, fanout, d_min, (seed & 0xFFFFFFFF, (seed >> 7) & 0xFFFFFFFF)


@pytest.mark.parametrize("name", ["pmp-gin", "pmp-gcn"])
@given(pair=neighbouring_pairs())
@settings(max_examples=250, deadline=None)
def test_random_neighbouring_graphs_stay_within_the_bound(name: str, pair) -> None:
    graph, u, v, h, fanout, d_min, seed = pair
    distance = release_distance(name, graph, u, v, h, fanout, d_min, seed)
    assert distance <= bound(name, fanout, d_min) + TOLERANCE


def _graph(n: int, edges: list[tuple[int, int]]) -> Graph:
    return build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), n)


def _star(centre: int, leaves: range) -> list[tuple[int, int]]:
    return [(centre, leaf) for leaf in leaves]


ADVERSARIAL = {
    # name: (graph, u, v)
    "both isolated": (_graph(2, []), 0, 1),
    "hub and leaf (hub degree > D, swap)": (_graph(30, _star(0, range(1, 25))), 0, 29),
    "two hubs (both swap)": (_graph(50, _star(0, range(2, 24)) + _star(1, range(24, 48))), 0, 1),
    "degree exactly D at both ends": (_graph(12, _star(0, range(2, 7)) + _star(1, range(7, 12))), 0, 1),
    "degree D-1 at both ends": (_graph(12, _star(0, range(2, 6)) + _star(1, range(7, 11))), 0, 1),
    "D_min boundary star (3 leaves + u)": (_graph(6, _star(0, range(1, 4)) + [(4, 5)]), 0, 4),
    "shared neighbours below D": (_graph(6, [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]), 0, 1),
}


@pytest.mark.parametrize("case", sorted(ADVERSARIAL))
@pytest.mark.parametrize("kind", ["aligned", "orthogonal"])
@pytest.mark.parametrize("name, fanout, d_min", [
    ("pmp-gin", 5, 0), ("pmp-gin", 0, 0),
    ("pmp-gcn", 5, 0), ("pmp-gcn", 5, 1), ("pmp-gcn", 5, 2), ("pmp-gcn", 5, 4), ("pmp-gcn", 5, 5),
    ("pmp-gcn", 0, 1), ("pmp-gcn", 0, 4),
])
def test_adversarial_pairs_stay_within_the_bound(case: str, kind: str, name: str, fanout: int, d_min: int) -> None:
    graph, u, v = ADVERSARIAL[case]
    h = inputs(kind, graph.num_nodes, torch.Generator().manual_seed(0))
    for seed in [(1, 2), (3, 4), (5, 6), (7, 8)]:
        distance = release_distance(name, graph, u, v, h, fanout, d_min, seed)
        assert distance <= bound(name, fanout, d_min) + TOLERANCE, (case, seed)


def test_bounds_are_attained_where_the_derivation_is_tight() -> None:
    """The charged sensitivity is not loose where docs/privacy.md says it is exact."""
    # GIN with sampling: both endpoints swap a neighbour, one-hot inputs -> exactly 2
    graph, u, v = ADVERSARIAL["two hubs (both swap)"]
    h = inputs("orthogonal", graph.num_nodes, torch.Generator())
    worst = max(release_distance("pmp-gin", graph, u, v, h, 5, 0, (s, s + 1)) for s in range(200))
    assert worst == pytest.approx(gin_layer_sensitivity(5), abs=1e-5)
    # GIN without sampling: Proposition 1's √2
    assert release_distance("pmp-gin", *ADVERSARIAL["both isolated"], torch.full((2, 4), 0.5), 0, 0, (1, 2)) == pytest.approx(
        gin_layer_sensitivity(0), abs=1e-6
    )
    # GCN with D_min <= 1: two isolated endpoints, aligned inputs -> exactly 1/√2
    for d_min in (0, 1):
        distance = release_distance("pmp-gcn", *ADVERSARIAL["both isolated"], torch.full((2, 4), 0.5), 5, d_min, (1, 2))
        assert distance == pytest.approx(gcn_layer_sensitivity(5, d_min), abs=1e-6)


def test_truncation_raises_the_honest_sensitivity() -> None:
    """At the D_min boundary an aggregate jumps from 0 to a full GCN sum (docs/privacy.md, 3.3)."""
    values = [gcn_layer_sensitivity(10, d_min) for d_min in (1, 2, 3, 5, 10)]
    assert values == sorted(values) and values[-1] > 3 * values[0]
    graph, u, v = ADVERSARIAL["D_min boundary star (3 leaves + u)"]
    crossing = release_distance("pmp-gcn", graph, u, v, torch.full((6, 4), 0.5), 10, 4, (1, 2))
    assert crossing > gcn_layer_sensitivity(10, 1)  # the boundary alone exceeds the untruncated bound


def test_step_sensitivity_composes_layers() -> None:
    assert step_sensitivity("pmp-gin", 3, 5, 0) == pytest.approx(3**0.5 * 2)
    assert step_sensitivity("mlp", 2, 5, 0) == 0


@pytest.mark.parametrize("name, fanout", [("pmp-gin", 3), ("pmp-gin", 0), ("pmp-gcn", 3), ("pmp-gcn", 1)])
@given(seed=st.integers(0, 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_one_edge_reaches_at_most_n_e_roots(name: str, fanout: int, seed: int) -> None:
    """N_e (docs/privacy.md, section 4): roots whose released embedding depends on one edge."""
    rng = random.Random(seed)
    n = rng.randint(3, 20)
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < rng.random() * 0.6]
    present = set(edges)
    missing = [(i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in present]
    assume(missing)
    u, v = rng.choice(missing)
    features = torch.rand(n, 3, generator=torch.Generator().manual_seed(seed))
    releases = []
    for graph in (_graph(n, edges), add_edge(_graph(n, edges), u, v)):
        torch.manual_seed(0)
        model = _extractor(name, fanout, 1, graph)
        subgraph = NeighbourSampler(graph, fanout, 1).sample(torch.arange(n), [(seed, seed ^ 5)])
        releases.append(model(subgraph, features, 0.0, None))
    changed = ((releases[1] - releases[0]).abs().amax(dim=(1, 2)) > 1e-7).sum().item()
    limit = participation_bound(name, 1, fanout)
    assert limit is None or changed <= limit


def test_participation_bounds() -> None:
    assert participation_bound("mlp", 3, 10) == 0
    assert participation_bound("pmp-gin", 1, 10) == 2
    assert participation_bound("pmp-gcn", 1, 10) == 20
    assert participation_bound("pmp-gcn", 1, 0) is None  # unbounded degree, unbounded reach
    assert participation_bound("pmp-gin", 2, 10) is None  # L >= 2 reaches neighbours of neighbours
