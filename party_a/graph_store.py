"""Party A's graph: symmetric CSR in torch tensors, self-loops and duplicates removed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Graph:
    """Undirected simple graph. Row v of the CSR lists v's neighbours in ascending order."""

    indptr: torch.Tensor  # int64 [N + 1]
    indices: torch.Tensor  # int64 [2 |E|]
    num_nodes: int

    @property
    def num_edges(self) -> int:
        """Undirected edges |E| (each stored twice in the CSR)."""
        return int(self.indices.numel()) // 2

    @property
    def degree(self) -> torch.Tensor:
        return self.indptr[1:] - self.indptr[:-1]

    @property
    def slot_rows(self) -> torch.Tensor:
        """The row (source node) of every CSR slot, aligned with ``indices``."""
        return torch.repeat_interleave(torch.arange(self.num_nodes, device=self.device), self.degree)

    @property
    def device(self) -> torch.device:
        return self.indices.device

    def to(self, device: torch.device | str) -> Graph:
        return Graph(self.indptr.to(device), self.indices.to(device), self.num_nodes)

    def neighbours(self, node: int) -> torch.Tensor:
        return self.indices[int(self.indptr[node]) : int(self.indptr[node + 1])]


def build_graph(edges: np.ndarray | torch.Tensor, num_nodes: int) -> Graph:
    """Symmetrise ``edges`` ([M, 2] node pairs), drop self-loops and repeats, build CSR."""
    pairs = torch.as_tensor(edges, dtype=torch.int64).reshape(-1, 2)
    if pairs.numel() and (int(pairs.min()) < 0 or int(pairs.max()) >= num_nodes):
        raise ValueError(f"an edge names a node outside 0..{num_nodes - 1}")
    src = torch.cat([pairs[:, 0], pairs[:, 1]])
    dst = torch.cat([pairs[:, 1], pairs[:, 0]])
    keep = src != dst
    # one int64 key per directed pair; unique() sorts by (src, dst)
    keys = torch.unique(src[keep] * num_nodes + dst[keep])
    src, dst = keys // num_nodes, keys % num_nodes
    counts = torch.bincount(src, minlength=num_nodes)
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(counts, 0)
    return Graph(indptr=indptr, indices=dst.contiguous(), num_nodes=num_nodes)


def add_edge(graph: Graph, u: int, v: int) -> Graph:
    """The neighbouring graph with the undirected edge (u, v) added (tests and audits)."""
    cpu = graph.to("cpu")
    edges = torch.stack([cpu.slot_rows, cpu.indices], 1)
    return build_graph(torch.cat([edges, torch.tensor([[u, v]])]), graph.num_nodes).to(graph.device)


def induced_subgraph(graph: Graph, nodes: torch.Tensor) -> Graph:
    """G[nodes]: the edges with both endpoints in ``nodes``, node ids unchanged."""
    cpu = graph.to("cpu")
    keep = torch.zeros(graph.num_nodes, dtype=torch.bool)
    keep[nodes.cpu()] = True
    rows = cpu.slot_rows
    inside = keep[rows] & keep[cpu.indices]
    return build_graph(torch.stack([rows[inside], cpu.indices[inside]], 1), graph.num_nodes).to(graph.device)
