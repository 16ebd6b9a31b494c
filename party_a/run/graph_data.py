"""What party A loads once per dataset and shares between its runs: its graph and node features."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vesper.common.csr_cache import load_csr_part
from vesper.common.dataset_files import load_graph_part
from vesper.common.stores import shared_size
from vesper.party_a.graph_store import Graph, build_graph


@dataclass(frozen=True)
class GraphData:
    """What party A loads once per dataset: its graph and its node features."""

    graph: Graph
    features: torch.Tensor
    # an aligned dataset's K (docs/alignment.md): party B may name nodes 0..K-1 only; None = every node
    shared: int | None = None

    @property
    def shared_nodes(self) -> int:
        """How many nodes party B may name: the shared index of an aligned dataset, else the whole graph."""
        return self.graph.num_nodes if self.shared is None else self.shared

    @classmethod
    def load(cls, path: Path, device: torch.device, *, memory_map: bool = True) -> GraphData:
        """The CSR and features of ``path``, built once per file into a cache (beside it, or in the
        user's cache directory) and memory-mapped (common.csr_cache.load_csr_part): on CPU the
        tensors are views of the mapped files,
        read from disk as the sampler touches them; on CUDA they are copied to the device once,
        here. ``memory_map=False`` builds the graph in memory from the file's edges, as before
        the cache (the same Graph, bit for bit: tests/test_perf_scale.py)."""
        if not memory_map:
            part = load_graph_part(path)
            graph = build_graph(part.edges, part.num_nodes).to(device)
            return cls(graph, torch.from_numpy(part.features).to(device), shared_size(path))
        csr = load_csr_part(path)
        graph = Graph(torch.from_numpy(csr.indptr), torch.from_numpy(csr.indices), csr.num_nodes).to(device)
        return cls(graph, torch.from_numpy(csr.features).to(device), shared_size(path))
