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

Cost: the key must be computed for every neighbour of every frontier node (the D
smallest of a hash cannot be found without all of it), so a layer costs O(Σ degree);
that hash runs in int32, and only a few candidates per node are sorted
(``sample_neighbours``). The result is bit-identical to one stable sort of all keys.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import torch

from vesper.party_a.graph_store import Graph

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # < 2**27, so products of 32-bit values stay inside int64
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
# A heavy node keeps its D smallest keys; a threshold passing D + 4√D + 8 of its keys on
# average holds all D of them except with probability < 1e-5 (Poisson tail, D = 1..25),
# and a node left with fewer than D candidates is ranked over all its slots, so the
# threshold changes the work, never the result.
_SLACK_SIGMAS = 4.0
_SLACK_EXTRA = 8.0
# below this many neighbour slots, one sort of every key costs less than the candidate filter
_FILTER_FROM_SLOTS = 4096


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


def keyed_uniform(key: tuple[int, int], a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """U(a, b) in [0, 1), float64 with 53 random bits: two keyed 32-bit hashes (:func:`pair_keys`)
    of the pair (a, b); broadcasts like ``a ^ b``. A coin that depends on the key and the pair
    alone, whatever else is drawn (docs/privacy.md, section 2.3)."""
    high = pair_keys(key, a, b)
    low = pair_keys((key[1], key[0]), a, b)
    return ((high << 21) | (low >> 11)).to(torch.float64) * 2.0**-53


def _int32_bits(value: int) -> int:
    """The int32 with the same 32 bits as the unsigned ``value``."""
    return value - (1 << 32) if value >= (1 << 31) else value


def _to_int32_bits(x: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2**32) -> int32 with the same 32 bits."""
    return torch.where(x >= (1 << 31), x - (1 << 32), x).to(torch.int32)


def _mix32_int32_(x: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """``_mix32`` in place on int32 tensors holding 32-bit patterns.

    int32 products wrap modulo 2**32 like the masked int64 ones, and a logical shift
    right by 16 is the arithmetic shift masked to 16 bits, so the bits are the same.
    int32 because int64 multiplication does not vectorise on AVX2 (several times slower
    here: docs/performance-notes.md); in place because every temporary of this size costs fresh pages.
    """
    for multiply in (True, True, False):
        torch.bitwise_right_shift(x, 16, out=scratch)
        scratch.bitwise_and_(0xFFFF)
        x.bitwise_xor_(scratch)
        if multiply:
            x.mul_(_MIX)
    return x


def _flipped_keys(
    seed: tuple[int, int], nodes: torch.Tensor, segment: torch.Tensor, neighbour: torch.Tensor, num_nodes: int
) -> torch.Tensor:
    """``pair_keys(seed, nodes[segment], neighbour)`` as int32 with the sign bit flipped,
    so that signed int32 order is the keys' unsigned order."""
    if num_nodes > _INT32_MAX:  # ids beyond int32: the reference hash in int64
        return _to_int32_bits(pair_keys(seed, nodes[segment], neighbour)).bitwise_xor_(_INT32_MIN)
    # the first mixing round depends on the node alone: once per node, not per slot
    x = _to_int32_bits(_mix32(_fold32(nodes) ^ seed[0])).index_select(0, segment)
    x.bitwise_xor_(neighbour.to(torch.int32))  # _fold32(u) == u for u < 2**31
    scratch = torch.empty_like(x)
    _mix32_int32_(x, scratch)
    x.bitwise_xor_(_int32_bits(seed[1]))
    _mix32_int32_(x, scratch)
    return x.bitwise_xor_(_INT32_MIN)


def _candidate_limits(degree: torch.Tensor, fanout: int) -> torch.Tensor:
    """Per node, the largest sign-flipped key that stays a candidate (int32).

    A node of degree ≤ fanout keeps every slot. Otherwise a share (D + 4√D + 8)/degree
    of the uniform 32-bit keys gets through. The limit only saves work: a node with at
    least D candidates has its D smallest keys among them, and one with fewer is ranked
    over all its slots.
    """
    expected = fanout + _SLACK_SIGMAS * math.sqrt(fanout) + _SLACK_EXTRA
    share = (expected / degree.clamp(min=1).to(torch.float64)).clamp(max=1.0)
    limit = (share * float(1 << 32)).floor().to(torch.int64) - 1 + _INT32_MIN  # unsigned -> flipped
    limit = torch.where(degree > fanout, limit.clamp(max=_INT32_MAX), torch.full_like(limit, _INT32_MAX))
    return limit.to(torch.int32)


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
    """For segments (start, count): the segment index and absolute position of every slot,
    in the dtype of ``counts``."""
    segment = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device, dtype=counts.dtype), counts)
    shift = starts - (torch.cumsum(counts, 0, dtype=counts.dtype) - counts)  # slot position minus its index
    position = shift.index_select(0, segment)
    position += torch.arange(segment.numel(), device=counts.device, dtype=counts.dtype)
    return segment, position


def _slot_dtype(graph: Graph) -> torch.dtype:
    """int32 slot indices when every slot position and node id fits: half the memory traffic."""
    return torch.int32 if max(graph.indices.numel(), graph.num_nodes) <= _INT32_MAX else torch.int64


def sample_neighbours(
    graph: Graph, nodes: torch.Tensor, fanout: int, seed: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled neighbours of distinct ``nodes``: (index into ``nodes``, neighbour id) per message.

    ``fanout`` 0 keeps every neighbour. Messages come grouped by node in the order of
    ``nodes``; within a heavy node in ascending key order (ties in CSR order), within a
    light one (degree ≤ fanout) in CSR order: the order of one stable sort of all slots
    by (node, key), light nodes' keys taken as 0. That sort is what small inputs get;
    larger ones sort only the candidates that pass ``_candidate_limits`` (about 3D per
    node), with the same result. Long index tensors go through ``index_select``:
    advanced indexing (``x[i]``) is several times slower on CPU.
    """
    start = graph.indptr[nodes]
    degree = graph.indptr[nodes + 1] - start
    slot = _slot_dtype(graph)
    segment, position = _segment_ranges(start.to(slot), degree.to(slot))
    neighbour = graph.indices.index_select(0, position)
    if fanout == 0 or segment.numel() == 0 or int(degree.max()) <= fanout:
        return segment.to(torch.int64), neighbour
    light = degree <= fanout
    if segment.numel() < _FILTER_FROM_SLOTS:
        segment = segment.to(torch.int64)
        key = pair_keys(seed, nodes.index_select(0, segment), neighbour).masked_fill_(light.index_select(0, segment), 0)
        return _first_by_key(segment, neighbour, key, fanout, nodes.numel())
    flipped = _flipped_keys(seed, nodes, segment, neighbour, graph.num_nodes)
    candidate = flipped <= _candidate_limits(degree, fanout).index_select(0, segment)
    chosen = candidate.nonzero().squeeze(1)  # ascending: CSR order within each node
    short = ~light & (torch.bincount(segment.index_select(0, chosen), minlength=nodes.numel()) < fanout)
    if bool(short.any()):  # rare (see _candidate_limits): rank these over all their slots
        chosen = (candidate | short.index_select(0, segment)).nonzero().squeeze(1)
    segment = segment.index_select(0, chosen).to(torch.int64)
    key = flipped.index_select(0, chosen).to(torch.int64) - _INT32_MIN  # the unsigned key again
    key.masked_fill_(light.index_select(0, segment), 0)
    return _first_by_key(segment, neighbour.index_select(0, chosen), key, fanout, nodes.numel())


def _first_by_key(
    segment: torch.Tensor, neighbour: torch.Tensor, key: torch.Tensor, fanout: int, count: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per segment, the ``fanout`` slots of smallest key, by one stable sort on (segment, key);
    the slots come in CSR order, so equal keys stay in CSR order."""
    order = torch.sort(segment * (1 << 32) + key, stable=True).indices
    segment, neighbour = segment.index_select(0, order), neighbour.index_select(0, order)
    # slots stay grouped by segment (segment is the high part of the sort key)
    counts = torch.bincount(segment, minlength=count)
    first = (torch.cumsum(counts, 0) - counts).index_select(0, segment)
    keep = torch.arange(segment.numel(), device=segment.device) - first < fanout
    return segment[keep], neighbour[keep]


_UNSEEN = torch.iinfo(torch.int64).max


def make_block(
    dst_nodes: torch.Tensor, edge_dst: torch.Tensor, neighbours: torch.Tensor, first_seen: torch.Tensor | None = None
) -> Block:
    """Block whose sources are dst_nodes followed by new neighbours in first-seen order.

    ``first_seen``: an int64 scratch of one entry per graph node, all ``_UNSEEN``, which
    is left that way; without it one is allocated. A dense map instead of ``unique``
    (a sort) because this runs on every layer of every step.
    """
    everything = torch.cat([dst_nodes, neighbours])
    if first_seen is None:
        size = int(everything.max()) + 1 if everything.numel() else 0
        first_seen = torch.full((size,), _UNSEEN, dtype=torch.int64, device=everything.device)
    position = torch.arange(everything.numel(), device=everything.device)
    try:
        first_seen.scatter_reduce_(0, everything, position, "amin")
        first_position = first_seen.index_select(0, everything)
    finally:  # clean for the next call whatever happened: a stale entry would corrupt it silently
        first_seen.index_fill_(0, everything, _UNSEEN)
    is_first = first_position == position
    local = (torch.cumsum(is_first, 0) - 1).index_select(0, first_position)
    return Block(
        dst_count=dst_nodes.numel(),
        src_nodes=everything[is_first],
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
        # make_block's scratch, reused across steps; the lock keeps concurrent samples apart
        self._first_seen = torch.full((graph.num_nodes,), _UNSEEN, dtype=torch.int64, device=graph.device)
        self._scratch_lock = threading.Lock()

    def layer_seeds(self, generator: torch.Generator) -> list[tuple[int, int]]:
        draws = torch.randint(0, 1 << 32, (self.layers, 2), generator=generator, dtype=torch.int64)
        return [(int(a), int(b)) for a, b in draws.tolist()]

    def sample(self, roots: torch.Tensor, seeds: list[tuple[int, int]]) -> SampledSubgraph:
        """Blocks for ``roots`` (distinct ids); ``seeds[l]`` keys layer l+1's sampling."""
        if len(seeds) != self.layers:
            raise ValueError(f"need {self.layers} layer seeds, got {len(seeds)}")
        frontier = roots.to(self.graph.device)
        blocks: list[Block] = []
        with self._scratch_lock:
            for layer in reversed(range(self.layers)):
                edge_dst, neighbours = sample_neighbours(self.graph, frontier, self.fanout, seeds[layer])
                block = make_block(frontier, edge_dst, neighbours, self._first_seen)
                blocks.append(block)
                frontier = block.src_nodes
        blocks.reverse()
        return SampledSubgraph(roots=roots, blocks=blocks)


def edgeless_subgraph(roots: torch.Tensor, layers: int) -> SampledSubgraph:
    """Blocks without messages, for the MLP extractor: it never reads the graph."""
    empty = torch.empty(0, dtype=torch.int64, device=roots.device)
    block = Block(dst_count=roots.numel(), src_nodes=roots, edge_dst=empty, edge_src=empty)
    return SampledSubgraph(roots=roots, blocks=[block] * layers)
