"""GAP's one-shot hops as a partitioned sparse product over party A's W ranks.

Per hop (a :class:`HopCommand` from rank 0): rank 0 broadcasts x̃_{k-1} (N × d); rank r computes
its contiguous block of rows of A x̃_{k-1} from the memory-mapped CSR and adds those rows' noise,
keyed by the hop's key (``party_a.extractors.gap_hops.hop_rows``); rank 0 gathers the blocks into
x_k. Only rank 0 holds x_k, and it charges the hop before anything reads it (the next hop's
broadcast included), exactly as with one process. The key is drawn on rank 0 from A's secret
noise generator, so each row's noise is the value one process draws for it under that key
(docs/privacy.md, section 2.6).

The collectives carry CPU float32 tensors (gloo); blocks are padded to the first (largest) one's
size, as ``dist.gather`` needs equal shapes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from vesper.party_a.extractors.gap_hops import hop_rows, row_bounds
from vesper.party_a.graph_store import Graph
from vesper.party_a.noise import NoiseKey, NoiseSource
from vesper.party_a.workers.protocol import HopCommand

if TYPE_CHECKING:
    from vesper.party_a.workers.group import WorkerGroup


def partitioned_hop(
    command: HopCommand, x_prev: torch.Tensor | None, graph: Graph, noise: NoiseSource, rank: int, world: int,
) -> torch.Tensor | None:
    """Every rank's part of one hop: x̃_{k-1} from rank 0 (``x_prev`` there, None elsewhere), this
    rank's block with its noise, the blocks gathered at rank 0: x_k there (CPU), None elsewhere."""
    shape = (command.rows, command.width)
    shared = x_prev.detach().to("cpu", torch.float32).contiguous() if x_prev is not None else torch.empty(shape)
    if tuple(shared.shape) != shape:
        raise ValueError(f"hop {command.hop}: x̃ is {tuple(shared.shape)}, the command says {shape}")
    dist.broadcast(shared, src=0)
    bounds = row_bounds(command.rows, world)
    start, end = bounds[rank]
    own = hop_rows(graph, shared.to(graph.device), start, end, noise, command.std, command.key, command.hop)
    padded = torch.zeros((bounds[0][1] - bounds[0][0], command.width), dtype=torch.float32)
    padded[: end - start] = own.to("cpu", torch.float32)
    if rank != 0:
        dist.gather(padded, None, dst=0)
        return None
    blocks = [torch.empty_like(padded) for _ in range(world)]
    dist.gather(padded, blocks, dst=0)
    return torch.cat([block[: stop - first] for block, (first, stop) in zip(blocks, bounds, strict=True)])


def hop_command(x_prev: torch.Tensor, hop: int, std: float, key: NoiseKey | None) -> HopCommand:
    """Rank 0's command for hop ``hop`` of ``x_prev`` (N × d): keyed noise, or none at all."""
    if std > 0 and key is None:
        raise ValueError(
            "GAP's hops split over workers need keyed noise (each row's noise keyed by the hop's key and its "
            "node, docs/privacy.md 2.6); this run streams it: set party_a.workers = 1; nothing was charged for this hop"
        )
    rows, width = x_prev.shape
    return HopCommand(hop=hop, std=float(std), key=key, rows=int(rows), width=int(width))


class PartitionedHops:
    """GAP's hop engine (``party_a.extractors.gap_hops.HopEngine``) over a worker group: rank 0's
    side. The group is the run's, started for the hops; :meth:`close` stops its workers."""

    def __init__(self, group: WorkerGroup, graph: Graph, noise: NoiseSource) -> None:
        self.group, self.graph, self.noise = group, graph, noise

    def hop(self, x_prev: torch.Tensor, hop: int, std: float, key: NoiseKey | None) -> torch.Tensor:
        command = hop_command(x_prev, hop, std, key)
        return self.group.hop(command, x_prev, self.graph, self.noise).to(x_prev.device, x_prev.dtype)

    def close(self) -> None:
        self.group.close()
