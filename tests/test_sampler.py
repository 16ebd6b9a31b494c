"""Graph store and neighbour sampler."""

import random

import pytest
import torch
from conftest import random_graph
from hypothesis import given, settings
from hypothesis import strategies as st

from vesper.party_a.graph_store import add_edge, build_graph
from vesper.party_a.sampler import (
    KeyedOrder,
    NeighbourSampler,
    edgeless_subgraph,
    pair_keys,
    sample_neighbours,
    window_starts,
)

ORDER_KEY = (0x1234, 0x5678)  # a run's secret order key, fixed for the tests that need one


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


def _sets(graph, nodes, fanout, seed, order_key=ORDER_KEY):
    segment, neighbours = sample_neighbours(KeyedOrder.of(graph, order_key), nodes, fanout, seed)
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
    """Over the run's order key and the step's seed, a node's sample is a uniform D-subset.

    Each draw samples 100 copies of one star (a node with 12 neighbours, fanout 4) in one call:
    their keys k(v, u) and offsets a(v) are other inputs of the hash, so 60 (order key, seed)
    pairs give 6,000 samples of a star, counted by each neighbour's place in its star."""
    stars, leaves, fanout = 100, 12, 4
    size = leaves + 1
    edges = [[s * size, s * size + i] for s in range(stars) for i in range(1, size)]
    graph = build_graph(torch.tensor(edges), stars * size)
    roots = torch.arange(stars) * size
    counts = torch.zeros(size)
    pairs = torch.zeros(size, size)
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        order_key, seed = (tuple(torch.randint(0, 2**32, (2,), generator=generator).tolist()) for _ in range(2))
        segment, neighbours = sample_neighbours(KeyedOrder.of(graph, order_key), roots, fanout, seed)
        assert torch.equal(segment, torch.arange(stars).repeat_interleave(fanout))
        place = neighbours.view(stars, fanout) - roots.unsqueeze(1)  # 1..12 within each star
        counts += torch.bincount(place.reshape(-1), minlength=size)
        both = (place.unsqueeze(2) * size + place.unsqueeze(1)).reshape(-1)  # (i, j) for i, j in one sample
        pairs += torch.bincount(both, minlength=size * size).view(size, size)
    draws = 60 * stars
    frequency = counts[1:] / draws
    # each neighbour is kept with probability 1/3; binomial std over 6000 draws is 0.006: 5 std
    assert torch.all((frequency - 1 / 3).abs() < 0.03), frequency
    # and pairs: uniform D-subsets keep two given neighbours with probability (4/12)(3/11) = 1/11;
    # neighbours adjacent on the key circle are not favoured over others (std 0.0037; 5 std)
    off_diagonal = pairs[1:, 1:][~torch.eye(leaves, dtype=torch.bool)] / draws
    assert torch.all((off_diagonal - 1 / 11).abs() < 0.019), off_diagonal


def test_within_one_run_a_neighbour_is_kept_as_often_as_the_arc_of_keys_before_it() -> None:
    """docs/privacy.md, section 3.1: with the run's order key fixed, a step's sample is the D
    neighbours whose keys follow a(v) on the circle, so neighbour u is kept when a(v) falls in
    the arc from the D-th key before k(v, u) to k(v, u): a chance of (that arc) / 2^32."""
    graph = build_graph(torch.tensor([[0, i] for i in range(1, 9)]), 9)
    fanout, draws = 3, 8000
    keys = pair_keys(ORDER_KEY, torch.zeros(8, dtype=torch.int64), torch.arange(1, 9))
    ranked = torch.sort(keys).values
    expected = {}
    for u, key in zip(range(1, 9), keys.tolist()):
        rank = int((ranked == key).nonzero()[0])
        before = int(ranked[(rank - fanout) % 8])
        expected[u] = ((key - before) % (1 << 32)) / (1 << 32)
    assert abs(sum(expected.values()) - fanout) < 1e-9
    order = KeyedOrder.of(graph, ORDER_KEY)
    counts = torch.zeros(9)
    generator = torch.Generator().manual_seed(1)
    for _ in range(draws):
        seed = tuple(torch.randint(0, 2**32, (2,), generator=generator).tolist())
        _, neighbours = sample_neighbours(order, torch.tensor([0]), fanout, seed)
        counts[neighbours] += 1
    for u, chance in expected.items():
        std = (chance * (1 - chance) / draws) ** 0.5
        assert abs(counts[u] / draws - chance) < 5 * std + 1e-3, (u, chance, counts[u] / draws)


def test_a_sample_is_the_d_smallest_rotated_keys() -> None:
    """The definition the proofs use, against a brute-force ranking of every neighbour."""
    rng = random.Random(11)
    graph = random_graph(rng, 40, 0.4)
    order = KeyedOrder.of(graph, ORDER_KEY)
    nodes = torch.randperm(40, generator=torch.Generator().manual_seed(3))
    for fanout in (0, 1, 4, 9):
        seed = (rng.getrandbits(32), rng.getrandbits(32))
        segment, got = sample_neighbours(order, nodes, fanout, seed)
        for i, v in enumerate(nodes.tolist()):
            mine = graph.neighbours(v)
            rotated = (pair_keys(ORDER_KEY, torch.full_like(mine, v), mine) - window_starts(seed, torch.tensor([v]))) % (1 << 32)
            take = mine.numel() if fanout == 0 else min(fanout, mine.numel())
            assert got[segment == i].tolist() == mine[torch.sort(rotated, stable=True).indices[:take]].tolist()


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
    sampler = NeighbourSampler(graph, fanout=3, layers=2, order_key=ORDER_KEY)
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
    sampler = NeighbourSampler(random_graph(random.Random(0), 5, 0.5), fanout=2, layers=2, order_key=ORDER_KEY)
    with pytest.raises(ValueError, match="need 2 layer seeds"):
        sampler.sample(torch.tensor([0]), [(1, 2)])


def test_edgeless_subgraph_reads_no_edges() -> None:
    subgraph = edgeless_subgraph(torch.tensor([4, 2]), layers=3)
    assert len(subgraph.blocks) == 3
    assert all(block.edge_dst.numel() == 0 and block.src_nodes.tolist() == [4, 2] for block in subgraph.blocks)


def test_a_sampler_with_a_fanout_needs_the_runs_secret_order_key() -> None:
    graph = random_graph(random.Random(0), 5, 0.5)
    with pytest.raises(ValueError, match="secret order key"):
        NeighbourSampler(graph, fanout=2, layers=1)
    NeighbourSampler(graph, fanout=0, layers=1).sample(torch.tensor([0]), [(0, 0)])  # fanout 0 reads all: no key


@given(n=st.integers(2, 30), p=st.floats(0.05, 0.9), seed=st.integers(0, 2**32 - 1))
@settings(max_examples=40, deadline=None)
def test_a_restricted_order_is_the_order_of_the_subgraph_without_a_new_sort(n, p, seed) -> None:
    """An edge sample reads the sampler's order restricted to its edges: the same rows as
    ordering the sampled graph afresh, because a key depends on the pair alone."""
    rng = random.Random(seed)
    graph = random_graph(rng, n, p)
    order = KeyedOrder.of(graph, ORDER_KEY)
    low = torch.minimum(order.slot_rows, order.neighbours)
    high = torch.maximum(order.slot_rows, order.neighbours)
    keep = (pair_keys((seed, 3), low, high) & 1) == 1  # both slots of an edge agree
    restricted = order.restricted(keep)
    rows, cols = order.slot_rows[keep], order.neighbours[keep]
    sub = build_graph(torch.stack([rows, cols], 1), n)
    fresh = KeyedOrder.of(sub, ORDER_KEY)
    assert torch.equal(restricted.indptr, fresh.indptr)
    assert torch.equal(restricted.neighbours, fresh.neighbours)
    assert torch.equal(restricted.row_keys, fresh.row_keys)


def _one_sort_order(graph, order_key):
    """The order as one sort of every slot (KeyedOrder.of before it sorted by ranges of rows)."""
    from vesper.party_a.sampler import _INT32_MIN, _flipped_keys

    rows = graph.slot_rows
    nodes = torch.arange(graph.num_nodes)
    keys = _flipped_keys(order_key, nodes, rows, graph.indices, graph.num_nodes).to(torch.int64) - _INT32_MIN
    row_keys, order = torch.sort((rows << 32) | keys, stable=True)
    return graph.indices.index_select(0, order), row_keys


@pytest.mark.parametrize("chunk_slots", [1, 2, 7, 50, 1 << 24])
def test_the_order_sorted_by_ranges_of_rows_is_the_one_sort_bit_for_bit(chunk_slots) -> None:
    """Ranges of a few slots (a hub's row alone in its range, isolated rows between) give the
    same neighbours and keys as sorting every slot at once."""
    rng = random.Random(chunk_slots)
    edges = [(0, v) for v in range(1, 30)]  # a hub of degree 29: wider than most ranges
    edges += [(rng.randrange(40), rng.randrange(40)) for _ in range(120)]  # nodes 40..59 isolated
    graph = build_graph(torch.tensor(edges), 60)
    neighbours, row_keys = _one_sort_order(graph, ORDER_KEY)
    order = KeyedOrder.of(graph, ORDER_KEY, chunk_slots=chunk_slots)
    assert torch.equal(order.neighbours, neighbours)
    assert torch.equal(order.row_keys, row_keys)
    assert torch.equal(order.indptr, graph.indptr)


def test_an_order_of_a_graph_without_edges_is_empty() -> None:
    order = KeyedOrder.of(build_graph(torch.empty((0, 2), dtype=torch.int64), 4), ORDER_KEY, chunk_slots=3)
    assert order.neighbours.numel() == 0 and order.row_keys.numel() == 0


def test_a_chunk_of_no_slots_is_refused() -> None:
    with pytest.raises(ValueError, match="chunk_slots"):
        KeyedOrder.of(build_graph(torch.tensor([[0, 1]]), 2), ORDER_KEY, chunk_slots=0)


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("fanout", [0, 2, 5])
def test_every_block_s_destinations_lead_its_sources_so_the_roots_lead_the_inputs(layers: int, fanout: int) -> None:
    """What a PMP release relies on to read its roots' rows off its input rows (pmp.release_inputs)."""
    graph = random_graph(random.Random(layers * 10 + fanout), 80, 0.08)
    sampler = NeighbourSampler(graph, fanout, layers, (7, 8) if fanout else None)
    roots = torch.randperm(80, generator=torch.Generator().manual_seed(fanout))[:17]
    subgraph = sampler.sample(roots, sampler.layer_seeds(torch.Generator().manual_seed(layers)))
    for block in subgraph.blocks:
        assert torch.equal(block.src_nodes[: block.dst_count], block.dst_nodes)
    for outer, inner in zip(subgraph.blocks, subgraph.blocks[1:]):
        assert torch.equal(outer.dst_nodes, inner.src_nodes)
    assert torch.equal(subgraph.input_nodes[: roots.numel()], roots)
