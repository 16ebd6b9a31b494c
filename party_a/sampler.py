"""Uniform neighbour sampling with fanout D per layer, vectorised in torch.

Once per run, A orders every neighbour list by a secret key ``k(v, u) = hash(ξ, v, u)``
(:class:`KeyedOrder`; ξ is the run's order key, drawn from A's secret sampling generator).
Per step and layer, every distinct node v of the frontier keeps all its neighbours when
it has at most D, and otherwise the D neighbours with the smallest *rotated* key
``r(v, u) = (k(v, u) − a(v)) mod 2^32``, where ``a(v) = hash(seed_layer, v)`` is fresh per
step and layer: the D neighbours whose keys follow a(v) around the circle. That is one
binary search and D reads per node, not a key per neighbour.

Because the rotated key depends only on the pair (and v's offset), adding an edge
(u*, v*) to the graph changes v*'s sample by at most one element, u* in and one
neighbour out, and the same holds at u*; no other node's sample changes. The
sensitivity derivations in docs/privacy.md rely on exactly this coupling (Lemma 2), for
every ξ and every step seed, so it holds jointly across all the steps of a run; the
empirical sensitivity test runs this sampler on neighbouring graphs with the same keys.
Over ξ, the rotated keys of one step are i.i.d. uniform, so each step's sample is a
uniform D-subset; within one run a neighbour's chance is the arc of keys before it, which
averages to D/d over runs (docs/privacy.md, section 3.1).

A sampled step is a list of blocks (message-flow graphs): block l carries messages
from layer l-1 to layer l; its destination nodes are the first entries of its source
nodes, so every node's own previous representation is at hand. Nodes are
deduplicated per layer: each node is sampled once and (later) noised once per layer.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from vesper.party_a.graph_store import Graph

_MASK32 = 0xFFFFFFFF
_MIX = 0x45D9F3B  # < 2**27, so products of 32-bit values stay inside int64
_INT32_MIN = -(1 << 31)
_INT32_MAX = (1 << 31) - 1
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


def pair_key_grid(seed: tuple[int, int], nodes: torch.Tensor, units: torch.Tensor) -> torch.Tensor:
    """``pair_keys(seed, nodes[:, None], units[None, :])`` as int32 with the same 32 bits
    [len(nodes), len(units)], by the in-place int32 mixer (several times faster than the int64
    reference on a grid); ``units`` must lie in [0, 2**31)."""
    first = _to_int32_bits(_mix32(_fold32(nodes.to(torch.int64)) ^ seed[0]))  # depends on the node alone
    x = first.unsqueeze(1).bitwise_xor(units.to(torch.int32).unsqueeze(0))  # _fold32(u) == u for u < 2**31
    scratch = torch.empty_like(x)
    _mix32_int32_(x, scratch)
    x.bitwise_xor_(_int32_bits(seed[1]))
    return _mix32_int32_(x, scratch)


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


def _slot_dtype_of(order: KeyedOrder) -> torch.dtype:
    return torch.int32 if max(order.neighbours.numel(), order.num_nodes) <= _INT32_MAX else torch.int64


def draw_order_key(generator: torch.Generator, fanout: int) -> tuple[int, int] | None:
    """The run's secret order key ξ, drawn once from A's secret sampling generator when the
    sampler has a fanout (fanout 0 reads every neighbour and draws nothing)."""
    if not fanout:
        return None
    a, b = torch.randint(0, 1 << 32, (2,), generator=generator, dtype=torch.int64).tolist()
    return int(a), int(b)


def window_starts(seed: tuple[int, int], nodes: torch.Tensor) -> torch.Tensor:
    """a(v): where on the circle of keys node v's sample starts this step and layer, in [0, 2**32)."""
    return pair_keys(seed, nodes, nodes)


# Slots sorted at once while building a KeyedOrder: 16M int64 keys are 128 MB, and the sort
# needs a few times that.
ORDER_CHUNK_SLOTS = 1 << 24


def _row_ranges(indptr: torch.Tensor, chunk_slots: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of rows holding at most ``chunk_slots`` slots each (or one row)."""
    n = int(indptr.numel()) - 1
    ends = indptr[1:]
    ranges: list[tuple[int, int]] = []
    lo = 0
    while lo < n:
        hi = int(torch.searchsorted(ends, int(indptr[lo]) + chunk_slots, right=True))
        hi = min(max(hi, lo + 1), n)
        ranges.append((lo, hi))
        lo = hi
    return ranges


@dataclass(frozen=True)
class KeyedOrder:
    """A graph's neighbour lists, each in ascending order of the secret key
    k(v, u) = pair_keys(ξ, v, u) (ties in CSR order): built once per run, O(|E| log |E|)."""

    indptr: torch.Tensor  # the graph's
    neighbours: torch.Tensor  # row v: v's neighbours by ascending k(v, ·)
    row_keys: torch.Tensor  # int64 (v << 32) | k(v, u), ascending over all slots
    num_nodes: int

    @classmethod
    def of(cls, graph: Graph, order_key: tuple[int, int], chunk_slots: int = ORDER_CHUNK_SLOTS) -> KeyedOrder:
        """Sorted by ranges of rows of at most ``chunk_slots`` slots (a row with more gets a range
        of its own), each written into place: the keys sort by row first and rows are contiguous
        in the CSR, so each range's stable sort is the global sort's restriction to it, bit for
        bit, and the memory beside the result is one range's, not 2 |E| int64 several times over
        (a 100M-edge graph: 1.6 GB per temporary)."""
        if chunk_slots < 1:
            raise ValueError(f"chunk_slots must be >= 1, got {chunk_slots}")
        indptr, indices, device = graph.indptr, graph.indices, graph.device
        row_keys = torch.empty(indices.numel(), dtype=torch.int64, device=device)
        neighbours = torch.empty_like(indices)
        for lo, hi in _row_ranges(indptr, chunk_slots):
            start, end = int(indptr[lo]), int(indptr[hi])
            if start == end:
                continue
            nodes = torch.arange(lo, hi, device=device)
            segment = torch.repeat_interleave(torch.arange(hi - lo, device=device), indptr[lo + 1 : hi + 1] - indptr[lo:hi])
            keys = _flipped_keys(order_key, nodes, segment, indices[start:end], graph.num_nodes).to(torch.int64)
            keys -= _INT32_MIN
            segment += lo  # the slots' rows
            keys.bitwise_or_(segment.bitwise_left_shift_(32))
            del segment
            sorted_keys, order = torch.sort(keys, stable=True)
            del keys
            row_keys[start:end] = sorted_keys
            neighbours[start:end] = indices[start:end].index_select(0, order)
        return cls(indptr, neighbours, row_keys, graph.num_nodes)

    def restricted(self, keep: torch.Tensor) -> KeyedOrder:
        """The order of the subgraph whose slots are ``keep`` (a mask over this order's slots):
        the same keys, so no new sort (an edge sample, party_a.edge_sampling)."""
        row_keys = self.row_keys[keep]
        counts = torch.bincount(row_keys >> 32, minlength=self.num_nodes)
        indptr = torch.zeros(self.num_nodes + 1, dtype=torch.int64, device=row_keys.device)
        indptr[1:] = torch.cumsum(counts, 0)
        return KeyedOrder(indptr, self.neighbours[keep], row_keys, self.num_nodes)

    @property
    def slot_rows(self) -> torch.Tensor:
        return self.row_keys >> 32

    @property
    def degree(self) -> torch.Tensor:
        return self.indptr[1:] - self.indptr[:-1]


def sample_neighbours(
    order: KeyedOrder, nodes: torch.Tensor, fanout: int, seed: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled neighbours of distinct ``nodes``: (index into ``nodes``, neighbour id) per message.

    Node v keeps its min(D, degree) neighbours of smallest rotated key (k(v, u) − a(v)) mod
    2**32, in that order: found by one binary search for a(v) in v's keys, then read around
    v's list from there. Messages come grouped by node in the order of ``nodes``.
    """
    start = order.indptr.index_select(0, nodes)
    degree = order.indptr.index_select(0, nodes + 1) - start
    first = torch.searchsorted(order.row_keys, (nodes << 32) | window_starts(seed, nodes))
    if not fanout:  # every neighbour, from a(v) around
        slot = _slot_dtype_of(order)
        segment, step = _segment_ranges(torch.zeros_like(degree, dtype=slot), degree.to(slot))
        segment = segment.to(torch.int64)
        position = start.index_select(0, segment) + torch.remainder(
            (first - start).index_select(0, segment) + step, degree.index_select(0, segment)
        )
        return segment, order.neighbours.index_select(0, position)
    # node i's j-th message, for j < min(D, degree): the slot j after ``first`` (the first key at or
    # after a(v); v's end when a(v) is past them all), wrapped once around v's list: a grid of D per node
    steps = torch.arange(fanout, device=nodes.device)
    position = first.unsqueeze(1) + steps
    end = (start + degree).unsqueeze(1)
    position -= degree.unsqueeze(1) * (position >= end)
    taken = (steps < degree.unsqueeze(1)).view(-1).nonzero().squeeze(1)
    segment = torch.div(taken, fanout, rounding_mode="floor")
    return segment, order.neighbours.index_select(0, position.view(-1).index_select(0, taken))


def every_neighbour(graph: Graph, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fanout 0: every neighbour of distinct ``nodes``, in CSR order (no key, no order needed)."""
    start = graph.indptr.index_select(0, nodes)
    degree = graph.indptr.index_select(0, nodes + 1) - start
    slot = _slot_dtype(graph)
    segment, position = _segment_ranges(start.to(slot), degree.to(slot))
    return segment.to(torch.int64), graph.indices.index_select(0, position)


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
    """L-layer sampler with fanout D; its randomness comes from A's secret generator: the
    run's order key ξ (``order_key``, needed for a fanout) and each step's layer seeds."""

    def __init__(
        self, graph: Graph, fanout: int, layers: int, order_key: tuple[int, int] | None = None,
        order: KeyedOrder | None = None,
    ) -> None:
        if fanout < 0 or layers < 1:
            raise ValueError("fanout must be >= 0 and layers >= 1")
        if fanout and order_key is None and order is None:
            raise ValueError("a sampler with a fanout needs the run's secret order key (order_key)")
        self.graph = graph
        self.fanout = fanout
        self.layers = layers
        self.order_key = order_key
        self._order = order  # built on first use: one sort of every neighbour list
        # make_block's scratch, reused across steps; the lock keeps concurrent samples apart
        self._first_seen = torch.full((graph.num_nodes,), _UNSEEN, dtype=torch.int64, device=graph.device)
        self._scratch_lock = threading.Lock()

    @property
    def order(self) -> KeyedOrder:
        """The neighbour lists in the order of the run's secret key (built once, on first use)."""
        if self._order is None:
            assert self.order_key is not None
            self._order = KeyedOrder.of(self.graph, self.order_key)
        return self._order

    def restricted(self, keep: torch.Tensor, graph: Graph) -> NeighbourSampler:
        """This sampler on the subgraph ``graph`` whose slots are ``keep`` (a mask over
        ``order``'s slots): the same keys, no new sort."""
        return NeighbourSampler(graph, self.fanout, self.layers, self.order_key, self.order.restricted(keep))

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
            order = self.order if self.fanout else None
            for layer in reversed(range(self.layers)):
                if order is None:
                    edge_dst, neighbours = every_neighbour(self.graph, frontier)
                else:
                    edge_dst, neighbours = sample_neighbours(order, frontier, self.fanout, seeds[layer])
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
