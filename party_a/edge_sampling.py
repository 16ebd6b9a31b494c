"""Per release, a secret Poisson sample of party A's edges (the visible-batch credit).

Every undirected edge is kept independently with probability q, with coins drawn afresh
for each release from A's secret randomness, which B never sees. If the edge (u*, v*)
that separates two neighbouring graphs is not drawn, the sampled graphs are identically
distributed; if it is, they differ by that one edge and the extractor's sensitivity
applies. That is Poisson subsampling with add/remove neighbours, so each counted release
is charged PoissonSampledDpEvent(q, GaussianDpEvent(z)) (docs/privacy.md, section 5.2,
eq. L2).

Edge {u, v}'s coin in one release is a keyed hash of the release's key and the pair
(``sampler.keyed_uniform``), so it is the same in both neighbouring graphs, and both CSR
slots of the edge share it, whatever other edges the graph holds (docs/privacy.md, 2.3).
"""

from __future__ import annotations

import torch

from vesper.party_a.graph_store import Graph
from vesper.party_a.sampler import keyed_uniform


class EdgeSubsampler:
    def __init__(self, graph: Graph, rate: float) -> None:
        if not 0.0 < rate < 1.0:
            raise ValueError(f"the edge sample rate must be in (0, 1), got {rate}")
        self.graph = graph
        self.rate = rate
        src = graph.slot_rows
        self.low = torch.minimum(src, graph.indices)
        self.high = torch.maximum(src, graph.indices)
        self.row_of_slot = src

    def sample(self, generator: torch.Generator) -> Graph:
        """The graph of one release: each undirected edge kept with probability q (one key drawn)."""
        return self.subgraph(self.coins(generator))

    def coins(self, generator: torch.Generator) -> torch.Tensor:
        """One release's coins: which slots of the graph are kept (one key drawn)."""
        key = torch.randint(0, 1 << 32, (2,), generator=generator, dtype=torch.int64).tolist()
        return keyed_uniform((int(key[0]), int(key[1])), self.low, self.high) < self.rate

    def subgraph(self, keep: torch.Tensor) -> Graph:
        """The graph of the kept slots (each row in the order the graph's row had)."""
        counts = torch.bincount(self.row_of_slot[keep], minlength=self.graph.num_nodes)
        indptr = torch.zeros(self.graph.num_nodes + 1, dtype=torch.int64, device=self.graph.device)
        indptr[1:] = torch.cumsum(counts, 0)
        return Graph(indptr=indptr, indices=self.graph.indices[keep], num_nodes=self.graph.num_nodes)
