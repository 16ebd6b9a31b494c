"""Neighbouring graph pairs for the test_sensitivity*.py modules: random and adversarial pairs
(G', e), layer inputs in the shapes that maximise each term of the bounds, the hypothesis
strategy over whole scenarios, and the extractor a scenario runs."""

from __future__ import annotations

import random

import torch
from hypothesis import strategies as st
from sensitivity_check import Scenario, make_extractor, read_graph

from vesper.party_a.extractors.pmp import PmpExtractor
from vesper.party_a.graph_store import Graph, add_edge, build_graph

DIM = 6  # width of the layer inputs unless a scenario brings its own


def _graph(n: int, edges: list[tuple[int, int]]) -> Graph:
    return build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), n)


def random_pair(rng: random.Random, n: int, p: float) -> tuple[Graph, tuple[int, int]]:
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    present = set(edges)
    missing = [(i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in present]
    if not missing:  # complete graph: drop one edge and add it back
        missing = [edges.pop(rng.randrange(len(edges)))]
    return _graph(n, edges), rng.choice(missing)


def neighbourhood_pair(
    rng: random.Random, degree_u: int, degree_v: int, shared: int, extra: float
) -> tuple[Graph, tuple[int, int]]:
    """u* = 0 and v* = 1 with the given degrees, ``shared`` common neighbours, plus random
    edges among the others at rate ``extra`` (so neighbours have varied degrees: hubs,
    leaves, nodes at D or at the D_min boundary)."""
    shared = min(shared, degree_u, degree_v)
    common = list(range(2, 2 + shared))
    own_u = list(range(2 + shared, 2 + degree_u))
    own_v = list(range(2 + degree_u, 2 + degree_u + degree_v - shared))
    n = 2 + degree_u + degree_v - shared + rng.randint(0, 2)
    edges = {(0, w) for w in common + own_u} | {(1, w) for w in common + own_v}
    others = range(2, n)
    edges |= {(a, b) for a in others for b in others if a < b and rng.random() < extra}
    return _graph(n, sorted(edges)), (0, 1)


def inputs(kind: str, n: int, rng: random.Random, edge: tuple[int, int]) -> torch.Tensor:
    """Layer inputs, non-negative with unit norm, in the shapes that maximise each term."""
    h = torch.zeros(n, DIM)
    if kind == "aligned":  # sums add up fully
        h[:, 0] = 1.0
    elif kind == "endpoints-aligned":  # u*, v* along one axis, everyone else along another
        h[:, 1] = 1.0
        h[list(edge), 1] = 0.0
        h[list(edge), 0] = 1.0
    elif kind == "groups":  # random clusters of identical vectors, orthogonal across clusters
        for node in range(n):
            h[node, rng.randrange(DIM)] = 1.0
    else:
        h = torch.rand(n, DIM, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
        h = h / h.norm(dim=1, keepdim=True)
    return h


@st.composite
def scenarios(draw, names: tuple[str, ...] = ("mlp", "pmp-gin", "pmp-gcn"), projected: bool | None = None) -> Scenario:
    name = draw(st.sampled_from(names))
    layers = draw(st.sampled_from([1, 2]))
    use_projection = draw(st.booleans()) if projected is None else projected
    degree_bound = draw(st.sampled_from([1, 2, 3, 4])) if use_projection else 0
    if degree_bound:
        fanout = draw(st.sampled_from([0, 0, degree_bound, degree_bound + 2]))
    else:
        fanout = draw(st.sampled_from([0, 1, 2, 3, 5]))
    scale = degree_bound or fanout or 4
    d_min = draw(st.integers(0, min(scale, 5))) if name == "pmp-gcn" else 0
    seed = draw(st.integers(0, 2**31 - 1))
    rng = random.Random(seed)
    if draw(st.booleans()):
        graph, edge = random_pair(rng, draw(st.integers(2, 14)), draw(st.floats(0.0, 0.7)))
    else:
        degrees = [0, max(d_min - 1, 0), d_min, scale - 1, scale, scale + 1, 3 * scale]
        graph, edge = neighbourhood_pair(
            rng,
            draw(st.sampled_from(degrees)),
            draw(st.sampled_from(degrees)),
            draw(st.integers(0, 3)),
            draw(st.sampled_from([0.0, 0.15, 0.4])),
        )
    kind = draw(st.sampled_from(["aligned", "endpoints-aligned", "groups", "random"]))
    batch_size = draw(st.sampled_from([1, 2, 3, 64]))
    return Scenario(
        name=name, graph=graph, edge=edge, inputs=inputs(kind, graph.num_nodes, rng, edge), layers=layers,
        fanout=fanout, d_min=d_min, degree_bound=degree_bound, batch_size=batch_size, seed=seed,
    )


def extractor_for(scenario: Scenario, cls: type[PmpExtractor] = PmpExtractor) -> PmpExtractor:
    dim = scenario.inputs.shape[1]
    return make_extractor(scenario.name, scenario.layers, scenario.d_min, scenario.fanout, dim, cls, seed=scenario.seed % 1000)

def _star(centre: int, leaves: range) -> list[tuple[int, int]]:
    return [(centre, leaf) for leaf in leaves]


ADVERSARIAL = {
    # name: (graph G', edge)
    "both isolated": (_graph(2, []), (0, 1)),
    "hub and leaf": (_graph(16, _star(0, range(1, 15))), (0, 15)),
    "two hubs": (_graph(24, _star(0, range(2, 13)) + _star(1, range(13, 24))), (0, 1)),
    "degree exactly 3 at both ends": (_graph(8, _star(0, range(2, 5)) + _star(1, range(5, 8))), (0, 1)),
    "degree 2 at both ends": (_graph(8, _star(0, range(2, 4)) + _star(1, range(5, 7))), (0, 1)),
    "D_min boundary star": (_graph(6, _star(0, range(1, 4)) + [(4, 5)]), (0, 4)),
    "shared neighbours": (_graph(6, [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]), (0, 1)),
    # u*, v* of degree 3 sharing w = 2, which also has degree 3: u' = v' = w for some seeds
    "shared displaced neighbour": (_graph(8, [(0, 2), (0, 3), (0, 4), (1, 2), (1, 5), (1, 6), (2, 7)]), (0, 1)),
    # u*, v*, u' = 2, v' = 3 each with D = 3 distinct neighbours: N_e is reached when
    # (0, 2) and (1, 3) are displaced
    "full neighbourhoods at D = 3": (
        _graph(12, [(0, 2), (0, 4), (0, 5), (1, 3), (1, 6), (1, 7), (2, 8), (2, 9), (3, 10), (3, 11)]),
        (0, 1),
    ),
    # the displaced neighbours 2 and 5 sit at degree 2, 3: D_min crossings on removal
    "displaced at the D_min boundary": (
        _graph(10, [(0, 2), (0, 3), (0, 4), (1, 5), (1, 6), (1, 7), (2, 8), (5, 8), (5, 9)]),
        (0, 1),
    ),
}


def _shared_displaced_scenario(name: str, layers: int, d_min: int = 0) -> Scenario:
    """Configuration T2 on D = 3: both endpoints displace their edge to w = 2.

    u* = 0 and v* = 1 have neighbours {2, 3, 4} and {2, 5, 6}; w = 2 has {0, 1, 7}.
    The projection seed is searched so that adding (0, 1) drops (0, 2) and (1, 2).
    """
    graph, edge = ADVERSARIAL["shared displaced neighbour"]
    h = torch.zeros(graph.num_nodes, DIM)
    h[:, 2] = 1.0
    h[[0, 1], 0] = 1.0  # h_u* = h_v*, orthogonal to h_w: Δa_w = −2 h_u*
    h[[0, 1], 2] = 0.0
    h[2, 1], h[2, 2] = 1.0, 0.0
    for seed in range(500):
        scenario = Scenario(name, graph, edge, h, layers=layers, d_min=d_min, degree_bound=3, batch_size=1, seed=seed)
        before, after = (read_graph(scenario, g) for g in (graph, add_edge(graph, *edge)))
        if before.neighbours(2).tolist() == [0, 1, 7] and after.neighbours(2).tolist() == [7] and 1 in after.neighbours(0).tolist():
            return scenario
    raise AssertionError("no projection seed realises u' = v'")
