"""Uniform neighbour sampling with fanout D per layer, vectorised in torch.

For each layer, from the roots outwards, every distinct node of the frontier keeps
all its neighbours when it has at most D, and otherwise the D neighbours with the
smallest secret key ``k(v, u) = hash(seed_layer, v, u)`` (ties broken by u). Top-D
under i.i.d. keys is a uniform D-subset. Because the key depends only on the pair,
adding an edge (u*, v*) to the graph changes v*'s sample by at most one element,
u* in and one neighbour out, and the same holds at u*. The sensitivity derivations in
docs/privacy.md rely on exactly this coupling, and the empirical sensitivity test runs
this sampler on neighbouring graphs with the same seed.

A sampled step is a list of blocks (message-flow graphs): block l carries messages
from layer l-1 to layer l; its destination nodes are the first entries of its source
nodes, so every node's own previous representation is at hand. Nodes are
deduplicated per layer: each node is sampled once and (later) noised once per layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vesper.party_a.graph_store import Graph

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # < 2**27, so products of 32-bit values stay inside int64


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer on int64 tensors holding values in [0, 2**32)."""
    x = (((x >> 16) ^ x) * _MIX) & _MASK32
    x = (((x >> 16) ^ x) * _MIX) & _MASK32
    return (x >> 16) ^ x


def _fold32(x: torch.Tensor) -> torch.Tensor:
    return (x ^ (x >> 32)) & _MASK32


def pair_keys(seed: tuple[int, int], v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Secret priority of neighbour u at node v, in [0, 2**32)."""
    h = _mix32(_fold32(v) ^ seed[0])
    h = _mix32(h ^ _fold32(u))
    return _mix32(h ^ seed[1])


@dataclass(frozen=True)
class Block:
    dst_count: int
    src_nodes: torch.Tensor  # global ids; the first dst_count are the destination nodes
    edge_dst: torch.Tensor  # local destination index per message
    edge_src: torch.Tensor  # local source index per message

    @property
    def dst_nodes(self) -> torch.Tensor:
        return self.src_nodes[: self.dst_count]


@dataclass(frozen=True)
class SampledSubgraph:
    roots: torch.Tensor
    blocks: list[Block]  # blocks[0] reads the input layer; blocks[-1] ends at the roots

    @property
    def input_nodes(self) -> torch.Tensor:
        return self.blocks[0].src_nodes


def _segment_ranges(starts: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For segments (start, count): the segment index and absolute position of every slot."""
    segment = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    offsets = torch.cumsum(counts, 0) - counts
    position = torch.arange(segment.numel(), device=counts.device) - offsets[segment] + starts[segment]
    return segment, position


def sample_neighbours(
    graph: Graph, nodes: torch.Tensor, fanout: int, seed: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled neighbours of distinct ``nodes``: (index into ``nodes``, neighbour id) per message.

    ``fanout`` 0 keeps every neighbour.
    """
    degree = graph.indptr[nodes + 1] - graph.indptr[nodes]
    segment, position = _segment_ranges(graph.indptr[nodes], degree)
    neighbour = graph.indices[position]
    if fanout == 0 or segment.numel() == 0 or int(degree.max()) <= fanout:
        return segment, neighbour
    keys = pair_keys(seed, nodes[segment], neighbour)
    keys = torch.where(degree[segment] > fanout, keys, torch.zeros_like(keys))
    order = torch.sort(segment * (1 << 32) + keys, stable=True).indices
    segment, neighbour = segment[order], neighbour[order]
    # slots stay grouped by segment (segment is the high part of the sort key)
    rank = torch.arange(segment.numel(), device=segment.device) - (torch.cumsum(degree, 0) - degree)[segment]
    keep = rank < fanout
    return segment[keep], neighbour[keep]


def make_block(dst_nodes: torch.Tensor, edge_dst: torch.Tensor, neighbours: torch.Tensor) -> Block:
    """Block whose sources are dst_nodes followed by new neighbours in first-seen order."""
    everything = torch.cat([dst_nodes, neighbours])
    unique, inverse = torch.unique(everything, return_inverse=True)
    first_seen = torch.full((unique.numel(),), everything.numel(), dtype=torch.int64, device=everything.device)
    first_seen.scatter_reduce_(0, inverse, torch.arange(everything.numel(), device=everything.device), "amin")
    order = torch.argsort(first_seen)
    local_of_unique = torch.empty_like(order)
    local_of_unique[order] = torch.arange(order.numel(), device=order.device)
    local = local_of_unique[inverse]
    return Block(
        dst_count=dst_nodes.numel(),
        src_nodes=unique[order],
        edge_dst=edge_dst,
        edge_src=local[dst_nodes.numel() :],
    )


class NeighbourSampler:
    """L-layer sampler with fanout D; its randomness comes from A's secret generator."""

    def __init__(self, graph: Graph, fanout: int, layers: int) -> None:
        if fanout < 0 or layers < 1:
            raise ValueError("fanout must be >= 0 and layers >= 1")
        self.graph = graph
        self.fanout = fanout
        self.layers = layers

    def layer_seeds(self, generator: torch.Generator) -> list[tuple[int, int]]:
        draws = torch.randint(0, 1 << 32, (self.layers, 2), generator=generator, dtype=torch.int64)
        return [(int(a), int(b)) for a, b in draws.tolist()]

    def sample(self, roots: torch.Tensor, seeds: list[tuple[int, int]]) -> SampledSubgraph:
        """Blocks for ``roots`` (distinct ids); ``seeds[l]`` keys layer l+1's sampling."""
        if len(seeds) != self.layers:
            raise ValueError(f"need {self.layers} layer seeds, got {len(seeds)}")
        frontier = roots.to(self.graph.device)
        blocks: list[Block] = []
        for layer in reversed(range(self.layers)):
            edge_dst, neighbours = sample_neighbours(self.graph, frontier, self.fanout, seeds[layer])
            block = make_block(frontier, edge_dst, neighbours)
            blocks.append(block)
            frontier = block.src_nodes
        blocks.reverse()
        return SampledSubgraph(roots=roots, blocks=blocks)


def edgeless_subgraph(roots: torch.Tensor, layers: int) -> SampledSubgraph:
    """Blocks without messages, for the MLP extractor: it never reads the graph."""
    empty = torch.empty(0, dtype=torch.int64, device=roots.device)
    block = Block(dst_count=roots.numel(), src_nodes=roots, edge_dst=empty, edge_src=empty)
    return SampledSubgraph(roots=roots, blocks=[block] * layers)
