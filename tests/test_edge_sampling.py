"""The secret Poisson edge sample: one coin per undirected edge, rate q, a subgraph."""

import random

import torch
from conftest import random_graph

from vesper.party_a.edge_sampling import EdgeSubsampler
from vesper.party_a.graph_store import Graph, add_edge, build_graph


def _edges(graph: Graph) -> set[tuple[int, int]]:
    src = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.degree)
    return {(int(a), int(b)) for a, b in zip(src, graph.indices)}


def test_each_undirected_edge_is_kept_with_probability_q_in_both_directions() -> None:
    graph = random_graph(random.Random(1), 300, 0.02)
    full = _edges(graph)
    sampler = EdgeSubsampler(graph, 0.3)
    generator = torch.Generator().manual_seed(0)
    kept = 0
    for _ in range(40):
        sample = sampler.sample(generator)
        edges = _edges(sample)
        assert edges <= full  # a subgraph of A's graph
        assert all((b, a) in edges for a, b in edges)  # both directions share one coin
        assert torch.equal(sample.indptr[1:] - sample.indptr[:-1], sample.degree)
        kept += len(edges) // 2
    rate = kept / (40 * graph.num_edges)
    # 40 draws of ~900 edges: the standard error of the rate is about 0.0024
    assert abs(rate - 0.3) < 0.015, rate


def test_coins_are_fresh_for_every_release() -> None:
    graph = build_graph(torch.tensor([[i, i + 1] for i in range(200)]), 201)
    sampler = EdgeSubsampler(graph, 0.5)
    generator = torch.Generator().manual_seed(3)
    assert _edges(sampler.sample(generator)) != _edges(sampler.sample(generator))


def test_adding_an_edge_leaves_every_other_coin_as_it_was() -> None:
    """Edge {u, v}'s coin is keyed by the release's key and the pair: the coupling of
    neighbouring graphs holds wherever the extra edge sits (docs/privacy.md, section 2.3)."""
    graph = random_graph(random.Random(4), 120, 0.05)
    present = _edges(graph)
    extra = next((u, v) for u in range(120) for v in range(u + 1, 120) if (u, v) not in present)
    bigger = add_edge(graph, *extra)
    for seed in range(5):
        small = _edges(EdgeSubsampler(graph, 0.5).sample(torch.Generator().manual_seed(seed)))
        big = _edges(EdgeSubsampler(bigger, 0.5).sample(torch.Generator().manual_seed(seed)))
        assert big - {extra, extra[::-1]} == small
