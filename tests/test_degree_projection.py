"""The stable degree-D projection (privacy contract, "Degree bound"; docs/privacy.md, 3.5)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import random_graph
from hypothesis import given, settings
from hypothesis import strategies as st

from vesper.party_a.degree_projection import project_degree
from vesper.party_a.graph_store import Graph, add_edge, build_graph
from vesper.party_a.sampler import pair_keys


def edge_set(graph: Graph) -> set[tuple[int, int]]:
    rows = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.degree.cpu())
    return {(int(a), int(b)) for a, b in zip(rows.tolist(), graph.indices.cpu().tolist()) if a < b}


def reference_projection(graph: Graph, max_degree: int, seed: tuple[int, int]) -> set[tuple[int, int]]:
    """The definition, node by node: keep the D incident edges of smallest (priority, pair)."""
    edges = edge_set(graph)

    def priority(edge: tuple[int, int]) -> tuple[int, int, int]:
        key = int(pair_keys(seed, torch.tensor([edge[0]]), torch.tensor([edge[1]]))[0])
        return key, edge[0], edge[1]

    kept: dict[int, set[tuple[int, int]]] = {}
    for node in range(graph.num_nodes):
        incident = sorted((e for e in edges if node in e), key=priority)
        kept[node] = set(incident[:max_degree])
    return {e for e in edges if e in kept[e[0]] and e in kept[e[1]]}


graphs = st.builds(
    lambda n, p, seed: random_graph(random.Random(seed), n, p),
    n=st.integers(1, 24),
    p=st.floats(0.0, 0.9),
    seed=st.integers(0, 2**32 - 1),
)
seeds = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))


@given(graph=graphs, max_degree=st.integers(1, 6), seed=seeds)
@settings(max_examples=60, deadline=None)
def test_projection_is_the_definition(graph: Graph, max_degree: int, seed: tuple[int, int]) -> None:
    projected = project_degree(graph, max_degree, seed)
    assert edge_set(projected) == reference_projection(graph, max_degree, seed)


@given(graph=graphs, max_degree=st.integers(1, 6), seed=seeds)
@settings(max_examples=80, deadline=None)
def test_projection_is_a_degree_bounded_subgraph_in_canonical_csr(graph: Graph, max_degree: int, seed) -> None:
    projected = project_degree(graph, max_degree, seed)
    assert int(projected.degree.max()) <= max_degree if graph.num_nodes else True
    kept = edge_set(projected)
    assert kept <= edge_set(graph)
    # the CSR is exactly what build_graph makes of the kept edges: symmetric, sorted, simple
    rebuilt = build_graph(torch.tensor(sorted(kept), dtype=torch.int64).reshape(-1, 2), graph.num_nodes)
    assert torch.equal(projected.indptr, rebuilt.indptr) and torch.equal(projected.indices, rebuilt.indices)
    # an edge whose endpoints both have degree <= D always survives
    degree = graph.degree.tolist()
    assert {(a, b) for a, b in edge_set(graph) if degree[a] <= max_degree and degree[b] <= max_degree} <= kept


@given(graph=graphs, max_degree=st.integers(1, 4), seed=seeds)
@settings(max_examples=40, deadline=None)
def test_projection_is_deterministic_given_the_seed(graph: Graph, max_degree: int, seed) -> None:
    first, second = project_degree(graph, max_degree, seed), project_degree(graph, max_degree, seed)
    assert torch.equal(first.indptr, second.indptr) and torch.equal(first.indices, second.indices)


def test_the_seed_chooses_which_edges_of_a_hub_survive() -> None:
    star = build_graph(torch.tensor([[0, leaf] for leaf in range(1, 21)]), 21)
    kept = {frozenset(edge_set(project_degree(star, 3, (s, s + 1)))) for s in range(20)}
    assert len(kept) > 10  # the priorities are keyed by the seed, not by the node ids
    assert all(len(edges) == 3 for edges in kept)


def projection_change(before: Graph, after: Graph) -> tuple[set, set]:
    """(edges added, edges removed) from P(G') to P(G)."""
    old, new = edge_set(before), edge_set(after)
    return new - old, old - new


@given(graph=graphs, max_degree=st.integers(1, 5), seed=seeds, pick=st.integers(0, 10**6))
@settings(max_examples=150, deadline=None)
def test_adding_an_edge_changes_at_most_three_projected_edges(graph: Graph, max_degree: int, seed, pick: int) -> None:
    """Lemma 4 (docs/privacy.md, 3.5): e in or not, at most one displaced edge per endpoint."""
    present = edge_set(graph)
    missing = [(a, b) for a in range(graph.num_nodes) for b in range(a + 1, graph.num_nodes) if (a, b) not in present]
    if not missing:
        return
    u, v = missing[pick % len(missing)]
    before = project_degree(graph, max_degree, seed)
    after = project_degree(add_edge(graph, u, v), max_degree, seed)
    added, removed = projection_change(before, after)
    assert added <= {(u, v)}
    assert len(added) + len(removed) <= 3
    assert len({node for edge in added | removed for node in edge}) <= 4
    for endpoint in (u, v):  # each removed edge was displaced at u* or v*, at most one each
        assert sum(endpoint in edge for edge in removed) <= 1
    assert all(u in edge or v in edge for edge in removed)
    if not added:  # e kept by at most one endpoint: at most that endpoint displaced an edge
        assert len(removed) <= 1


def test_a_shared_displaced_neighbour_is_possible() -> None:
    """u' = v' (configuration T2): both endpoints drop their edge to the same w."""
    # u*=0 and v*=1 both have exactly D=3 neighbours, among them w=2
    graph = build_graph(torch.tensor([[0, 2], [0, 3], [0, 4], [1, 2], [1, 5], [1, 6]]), 7)
    found = []
    for s in range(200):
        added, removed = projection_change(project_degree(graph, 3, (s, 7)), project_degree(add_edge(graph, 0, 1), 3, (s, 7)))
        if added == {(0, 1)} and removed == {(0, 2), (1, 2)}:
            found.append(s)
    assert found


def test_arguments_are_checked() -> None:
    graph = build_graph(torch.tensor([[0, 1]]), 2)
    with pytest.raises(ValueError, match="D must be >= 1"):
        project_degree(graph, 0, (1, 2))
    with pytest.raises(ValueError, match="seed"):
        project_degree(graph, 2, (1, 2**32))


def test_nothing_to_drop_keeps_the_graph_and_its_device() -> None:
    graph = build_graph(torch.tensor([[0, 1], [1, 2]]), 4)
    assert project_degree(graph, 2, (1, 2)) is graph
    empty = build_graph(torch.empty(0, 2, dtype=torch.int64), 3)
    assert project_degree(empty, 1, (1, 2)).num_edges == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_projection_on_the_gpu_matches_the_cpu() -> None:
    graph = random_graph(random.Random(0), 200, 0.2)
    cpu = project_degree(graph, 5, (3, 4))
    gpu = project_degree(graph.to("cuda"), 5, (3, 4))
    assert gpu.device.type == "cuda"
    assert torch.equal(gpu.indices.cpu(), cpu.indices) and torch.equal(gpu.indptr.cpu(), cpu.indptr)
