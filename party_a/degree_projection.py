"""The stable degree-D projection of party A's graph (privacy contract, "Degree bound").

Every undirected edge e = {u, v} gets a secret priority p(e) = hash(seed, min(u, v), max(u, v))
(``sampler.pair_keys`` on the ordered pair); every node keeps its D incident edges of
smallest priority, ties broken by the neighbour id; an edge survives iff both endpoints
keep it. The result P(G) has maximum degree ≤ D, and it is *stable*: adding one edge
(u*, v*) to G changes at most three edges of P(G) — the edge itself, and at most one
displaced edge (u*, u') and (v*, v') per endpoint — touching at most four nodes
(docs/privacy.md, section 3.5, Lemma 4). The sensitivities and participation bounds
for extractors that read P(G) whole are derived from exactly that lemma.

The projection is computed once per run with one secret seed and then read by every
step; it is vectorised over the CSR (two sorts of at most 2|E| int64 keys), so it is cheap
even for millions of edges on a CPU (docs/performance-notes.md).
"""

from __future__ import annotations

import torch

from vesper.party_a.graph_store import Graph
from vesper.party_a.sampler import pair_keys

_KEY_BITS = 32  # pair_keys returns values in [0, 2**32)


def _slot_endpoints(graph: Graph) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, neighbour) of every CSR slot; each undirected edge owns two slots."""
    return graph.slot_rows, graph.indices


def edge_priorities(seed: tuple[int, int], rows: torch.Tensor, neighbours: torch.Tensor) -> torch.Tensor:
    """p(e) = hash(seed, min(u, v), max(u, v)): both slots of an edge get the same priority."""
    return pair_keys(seed, torch.minimum(rows, neighbours), torch.maximum(rows, neighbours))


def kept_by_row(graph: Graph, rows: torch.Tensor, neighbours: torch.Tensor, max_degree: int, seed: tuple[int, int]) -> torch.Tensor:
    """Per slot: is the edge among its row's D incident edges of smallest priority?

    Rows of degree ≤ D keep everything, so only the slots of heavier rows are hashed
    and ranked. One stable sort by (row, priority): CSR rows list neighbours in
    ascending order, so equal priorities stay ordered by the neighbour id — a total
    order on each node's incident edges that depends on the edge alone, which is what
    docs/privacy.md's Lemma 4 needs.
    """
    degree = graph.degree
    heavy_rows = torch.where(degree > max_degree, degree, torch.zeros_like(degree))
    heavy = heavy_rows[rows] > 0
    kept = torch.ones_like(rows, dtype=torch.bool)
    rows_h = rows[heavy]
    priority = edge_priorities(seed, rows_h, neighbours[heavy])
    order = torch.sort(rows_h * (1 << _KEY_BITS) + priority, stable=True).indices
    # heavy slots stay grouped by row; each row starts where the heavier rows before it end
    row_start = torch.cumsum(heavy_rows, 0) - heavy_rows
    rank_sorted = torch.arange(rows_h.numel(), device=rows.device) - row_start[rows_h[order]]
    kept_h = torch.empty(rows_h.numel(), dtype=torch.bool, device=rows.device)
    kept_h[order] = rank_sorted < max_degree
    kept[heavy] = kept_h
    return kept


def reverse_slots(neighbours: torch.Tensor) -> torch.Tensor:
    """Index of slot (v, u) for every slot (u, v).

    The CSR is symmetric and sorted by (row, neighbour). A stable sort by neighbour
    lists the slots in (neighbour, row) order, and the j-th of those is (v_j, u_j) when
    the j-th CSR slot is (u_j, v_j): both are the j-th smallest pair of the same set.
    """
    return torch.sort(neighbours, stable=True).indices


def surviving_subgraph(graph: Graph, rows: torch.Tensor, neighbours: torch.Tensor, keep: torch.Tensor) -> Graph:
    """The CSR of the kept slots; filtering preserves the (row, neighbour) order."""
    counts = torch.bincount(rows[keep], minlength=graph.num_nodes)
    indptr = torch.zeros(graph.num_nodes + 1, dtype=torch.int64, device=graph.device)
    indptr[1:] = torch.cumsum(counts, 0)
    return Graph(indptr=indptr, indices=neighbours[keep].contiguous(), num_nodes=graph.num_nodes)


def project_degree(graph: Graph, max_degree: int, seed: tuple[int, int]) -> Graph:
    """P(G): the stable degree-D projection, D = ``max_degree`` (docs/privacy.md, eq. Q1).

    Deterministic given ``seed`` (two integers in [0, 2**32), A's secret); on the
    graph's device; every node of the result has degree ≤ D; an edge whose endpoints
    both have degree ≤ D always survives.
    """
    if max_degree < 1:
        raise ValueError(f"the degree bound D must be >= 1, got {max_degree} (0 means: do not project)")
    if len(seed) != 2 or not all(0 <= int(part) < (1 << _KEY_BITS) for part in seed):
        raise ValueError("the projection seed must be two integers in [0, 2**32)")
    if graph.num_nodes >= (1 << 31):
        raise ValueError("the projection packs node ids into 31 bits")
    if graph.indices.numel() == 0 or int(graph.degree.max()) <= max_degree:
        return graph  # nothing to drop: P(G) = G
    rows, neighbours = _slot_endpoints(graph)
    kept = kept_by_row(graph, rows, neighbours, max_degree, (int(seed[0]), int(seed[1])))
    # an edge survives iff both endpoints keep it: AND the flags of its two slots
    survives = kept & kept[reverse_slots(neighbours)]
    return surviving_subgraph(graph, rows, neighbours, survives)
