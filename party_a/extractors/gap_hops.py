"""GAP's hop by blocks of rows: where each hop x_k = A x̃_{k-1} + N(0, σ² I) is computed.

A hop is a sparse product over all N nodes (party_a.extractors.gap, eq. GAP-1). Row v of
A x̃_{k-1} reads only row v of the CSR (v's neighbours) and the whole x̃_{k-1}, so the rows
split into contiguous blocks that can be computed apart and concatenated: :func:`hop_rows`
computes one block, with its rows' noise. In one process (:class:`LocalHops`, W = 1) GAP
computes the whole hop itself; with party A's workers (``party_a.workers``) each of the W
ranks computes one block (``party_a.workers.hops``), and rank 0 concatenates them.

A block's noise is keyed per (hop's noise key, hop, node) (``party_a.noise.keyed_normal``),
so each row is noised exactly once, by the rank that owns it, with the value one process
would draw for it under the same key (docs/privacy.md, section 2.6).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Protocol

import torch

from vesper.party_a.graph_store import Graph
from vesper.party_a.noise import NoiseKey, NoiseSource


class HopEngine(Protocol):
    """Computes GAP's noisy hops: in rank 0's process, or split over party A's workers."""

    def hop(self, x_prev: torch.Tensor, hop: int, std: float, key: NoiseKey | None) -> torch.Tensor:
        """x_hop = A x̃_{hop-1} + N(0, std² I) for all N rows; ``key``: the hop's noise key (None: streamed)."""

    def close(self) -> None:
        """Release what the engine holds (worker processes); called once the hops are done."""


def row_bounds(num_nodes: int, world: int) -> list[tuple[int, int]]:
    """[start, end) of each of ``world`` contiguous blocks of rows, the first ones the largest
    (as ``torch.tensor_split``), covering 0..num_nodes-1 once."""
    if world < 1:
        raise ValueError(f"rows split into at least one block, got {world}")
    size, extra = divmod(num_nodes, world)
    bounds, start = [], 0
    for rank in range(world):
        end = start + size + (1 if rank < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def row_block(graph: Graph, start: int, end: int) -> torch.Tensor:
    """Rows [start, end) of A as a sparse CSR matrix [end - start, N] of ones, read from ``graph``'s
    CSR (memory-mapped at a worker: only this block's slice of ``indices`` is touched)."""
    indptr = graph.indptr[start: end + 1]
    first, last = int(indptr[0]), int(indptr[-1])
    values = torch.ones(last - first, dtype=torch.float32, device=graph.device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        return torch.sparse_csr_tensor(indptr - first, graph.indices[first:last], values, (end - start, graph.num_nodes))


def hop_rows(
    graph: Graph, x_prev: torch.Tensor, start: int, end: int, noise: NoiseSource, std: float,
    key: NoiseKey | None, hop: int,
) -> torch.Tensor:
    """Rows [start, end) of x_hop = A x̃_{hop-1} + N(0, std² I): the block's sparse product, then its
    rows' Gaussian noise keyed by (``key``, ``hop``, node), through A's one noise source. ``x_prev``
    must have rows of norm ≤ 1 (GAP's sensitivity √2, docs/extractors/gap.md, eq. S)."""
    block = row_block(graph, start, end) @ x_prev
    if std > 0 and key is None:
        raise ValueError(
            "a block of GAP's hop needs the hop's noise key (keyed noise): streamed noise would depend on "
            "how the rows are split; build the extractor with keyed_noise=True (party_a.workers > 1 does)"
        )
    rows = torch.arange(start, end, device=block.device)
    return noise.gaussian(block, std, rows=rows, key=key, layer=hop)


class LocalHops:
    """Every hop in this process (W = 1): GAP's own ``noisy_hop`` over all N rows."""

    def __init__(self, noisy_hop: Callable[[torch.Tensor, int, NoiseKey | None], torch.Tensor]) -> None:
        self.noisy_hop = noisy_hop

    def hop(self, x_prev: torch.Tensor, hop: int, std: float, key: NoiseKey | None) -> torch.Tensor:
        return self.noisy_hop(x_prev, hop, key)

    def close(self) -> None:
        return None
