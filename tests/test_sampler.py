"""Graph store and neighbour sampler."""

import random

import pytest
import torch
from conftest import random_graph
from hypothesis import given, settings
from hypothesis import strategies as st

from vesper.party_a.graph_store import add_edge, build_graph
from vesper.party_a.sampler import (
    NeighbourSampler,
    edgeless_subgraph,
    sample_neighbours,
)


def test_csr_is_symmetric_simple_and_sorted() -> None:
    edges = torch.tensor([[0, 1], [1, 0], [1, 2], [2, 2], [3, 1], [0, 1]])
    graph = build_graph(edges, 5)
    assert graph.num_edges == 3
    assert graph.neighbours(1).tolist() == [0, 2, 3]
    assert graph.neighbours(2).tolist() == [1]  # self-loop dropped
    assert graph.neighbours(4).tolist() == []
    assert graph.degree.tolist() == [1, 3, 1, 1, 0]


def test_edges_outside_the_graph_are_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        build_graph(torch.tensor([[0, 5]]), 3)


def _sets(graph, nodes, fanout, seed):
    segment, neighbours = sample_neighbours(graph, nodes, fanout, seed)
    return [set(neighbours[segment == i].tolist()) for i in range(nodes.numel())]


@given(n=st.integers(2, 30), p=st.floats(0.05, 0.9), fanout=st.integers(0, 6), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=80, deadline=None)
def test_samples_are_real_neighbours_up_to_the_fanout(n, p, fanout, seed) -> None:
    graph = random_graph(random.Random(seed), n, p)
    nodes = torch.arange(n)
    for v, chosen in enumerate(_sets(graph, nodes, fanout, (seed, seed ^ 1))):
        everything = set(graph.neighbours(v).tolist())
        assert chosen <= everything
        assert len(chosen) == (len(everything) if fanout == 0 else min(fanout, len(everything)))


def test_sampling_is_uniform() -> None:
    # a node with 12 neighbours, fanout 4: each neighbour is kept with probability 1/3
    graph = build_graph(torch.tensor([[0, i] for i in range(1, 13)]), 13)
    counts = torch.zeros(13)
    draws = 6000
    generator = torch.Generator().manual_seed(0)
    for _ in range(draws):
        seed = tuple(torch.randint(0, 2**32, (2,), generator=generator).tolist())
        _, neighbours = sample_neighbours(graph, torch.tensor([0]), 4, seed)
        counts[neighbours] += 1
    frequency = counts[1:] / draws
    # binomial std at p=1/3 over 6000 draws is 0.006; 5 std
    assert torch.all((frequency - 1 / 3).abs() < 0.03), frequency


@given(n=st.integers(3, 25), p=st.floats(0.1, 0.9), fanout=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=80, deadline=None)
def test_adding_an_edge_swaps_at_most_one_sampled_neighbour(n, p, fanout, seed) -> None:
    """The coupling the sensitivity derivations rely on (docs/privacy.md, section 3.1)."""
    rng = random.Random(seed)
    graph = random_graph(rng, n, p)
    missing = [(u, v) for u in range(n) for v in range(u + 1, n) if v not in set(graph.neighbours(u).tolist())]
    if not missing:
        return
    u, v = rng.choice(missing)
    bigger = add_edge(graph, u, v)
    nodes = torch.arange(n)
    key = (seed, seed ^ 7)
    for node, (before, after) in enumerate(zip(_sets(graph, nodes, fanout, key), _sets(bigger, nodes, fanout, key))):
        if node not in (u, v):
            assert before == after
            continue
        other = v if node == u else u
        assert after - before <= {other}
        assert len(before - after) <= 1 and len(after - before) <= 1
        if len(before - after) == 1:
            assert after - before == {other}  # a swap always brings the new neighbour in


def test_blocks_put_destinations_first_and_deduplicate() -> None:
    graph = random_graph(random.Random(3), 40, 0.15)
    sampler = NeighbourSampler(graph, fanout=3, layers=2)
    roots = torch.tensor([5, 1, 17])
    subgraph = sampler.sample(roots, sampler.layer_seeds(torch.Generator().manual_seed(0)))
    top, bottom = subgraph.blocks[1], subgraph.blocks[0]
    assert top.dst_nodes.tolist() == roots.tolist()
    assert torch.equal(bottom.dst_nodes, top.src_nodes)
    for block in subgraph.blocks:
        assert block.src_nodes.unique().numel() == block.src_nodes.numel()
        for dst, src in zip(block.edge_dst.tolist(), block.edge_src.tolist()):
            d, s = int(block.src_nodes[dst]), int(block.src_nodes[src])
            assert s in graph.neighbours(d).tolist()
        per_dst = torch.bincount(block.edge_dst, minlength=block.dst_count)
        assert torch.equal(per_dst, graph.degree[block.dst_nodes].clamp(max=3))


def test_sampler_needs_one_seed_per_layer() -> None:
    sampler = NeighbourSampler(random_graph(random.Random(0), 5, 0.5), fanout=2, layers=2)
    with pytest.raises(ValueError, match="need 2 layer seeds"):
        sampler.sample(torch.tensor([0]), [(1, 2)])


def test_edgeless_subgraph_reads_no_edges() -> None:
    subgraph = edgeless_subgraph(torch.tensor([4, 2]), layers=3)
    assert len(subgraph.blocks) == 3
    assert all(block.edge_dst.numel() == 0 and block.src_nodes.tolist() == [4, 2] for block in subgraph.blocks)
