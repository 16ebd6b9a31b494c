"""HeterPoisson's sampler (Xiang, Wang & Wang, "Preserving Node-level Privacy in Graph Neural
Networks" [HeterPoisson, Algs. 2 and 3]), vectorised over party A's CSR graph.

One call of :func:`heter_poisson` builds the paper's sub-graph container G for one step:

* **central nodes** ([HeterPoisson, Alg. 2, lines 3-6]): each train id is a root independently with
  probability q_b (:func:`poisson_root_batches`, the extractor's ``root_batches`` hook).
  B sees every batch's ids, so this earns no amplification and none is credited
  (docs/extractors/heterpoisson.md, section 3);
* **NeighborSampling** ([HeterPoisson, Alg. 3]): every neighbour j of every root is kept
  independently with probability min(1, M / D_ot^j), D_ot^j from A's *degree table* of the
  whole graph (:func:`keep_probabilities`). The table is public in this guarantee and the
  same in both neighbouring graphs, as in the paper's model [HeterPoisson, §3];
* **masking** ([HeterPoisson, Alg. 2, lines 14-23]): a kept neighbour that is itself a root of the
  batch is dropped (:func:`mask_central_nodes`). The paper zeroes its features; dropping it
  makes "root" and "peripheral" exclusive with no residual node, so a node appears in a
  step's sub-graphs either once as a root or only as peripherals.

Every tensor lives on the graph's device; the coins are drawn in one call per step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vesper.party_a.graph_store import Graph

# coins(root ids, neighbour ids) -> one Uniform(0, 1) per candidate edge, on the graph's device
Coins = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class SubgraphBatch:
    """The container G of [HeterPoisson, Alg. 2]: one star sub-graph G_i per central node i."""

    roots: torch.Tensor  # [B] int64, the central nodes, in the order B receives them
    owner: torch.Tensor  # [P] int64, position in ``roots`` of each kept peripheral's sub-graph
    peripherals: torch.Tensor  # [P] int64, node id of each kept peripheral

    def appearances(self, node: int) -> int:
        """How many sub-graphs of the step ``node`` is in: 1 as a root, else its peripheral count."""
        if bool((self.roots == node).any()):
            return 1
        return int((self.peripherals == node).sum())


def poisson_root_batches(
    train_ids: torch.Tensor, rate: float, batches: int, generator: torch.Generator
) -> list[torch.Tensor]:
    """[HeterPoisson, Alg. 2, lines 3-6], ``batches`` times: each train id is a central node w.p. q_b.

    One independent Poisson sample per batch (a root may recur across the batches of an
    epoch, or be absent from all of them; the accounting counts every release).
    """
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"the root sampling rate q_b must be in (0, 1], got {rate}")
    coins = torch.rand((batches, train_ids.numel()), generator=generator)
    return [train_ids[row < rate] for row in coins]


def candidate_neighbours(graph: Graph, roots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(owner, neighbour) of every edge (i, j) with i a root: the sets 𝒩ℬ(i) of [HeterPoisson, Alg. 2, line 8]."""
    starts = graph.indptr[roots]
    counts = graph.indptr[roots + 1] - starts
    owner = torch.repeat_interleave(torch.arange(roots.numel(), device=roots.device), counts)
    first = torch.cumsum(counts, 0) - counts  # where each root's run starts in the flat list
    offsets = torch.arange(owner.numel(), device=roots.device) - first[owner]
    return owner, graph.indices[starts[owner] + offsets]


def keep_probabilities(degrees: torch.Tensor, neighbours: torch.Tensor, multiplier: float) -> torch.Tensor:
    """min(1, M / D_ot^j) for each candidate j [HeterPoisson, Alg. 3, lines 5-6].

    ``degrees`` is the degree table of the whole graph. A candidate is someone's
    neighbour, so its degree is ≥ 1 (the clamp only guards a malformed table).
    """
    return torch.clamp(multiplier / degrees[neighbours].clamp(min=1).to(torch.float64), max=1.0)


def neighbour_sampling(keep: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """[HeterPoisson, Alg. 3]: candidate j kept iff its own coin p < min(1, M / D_ot^j), independently."""
    return uniforms.to(keep.dtype) < keep


def mask_central_nodes(roots: torch.Tensor, neighbours: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """[HeterPoisson, Alg. 2, lines 14-23]: False for a peripheral that is a central node of the batch.

    The paper zeroes such a node's features inside G_i; here it is dropped from G_i, so
    that it appears in the step once, as its own root.
    """
    central = torch.zeros(num_nodes, dtype=torch.bool, device=roots.device)
    central[roots] = True
    return ~central[neighbours]


def secret_coins(generator: torch.Generator) -> Coins:
    """Coins from A's secret CPU generator, moved to the graph's device in one copy per step."""

    def draw(owners: torch.Tensor, neighbours: torch.Tensor) -> torch.Tensor:
        return torch.rand(neighbours.numel(), generator=generator, dtype=torch.float64).to(neighbours.device)

    return draw


def heter_poisson(
    graph: Graph, degrees: torch.Tensor, roots: torch.Tensor, multiplier: float, coins: Coins
) -> SubgraphBatch:
    """[HeterPoisson, Alg. 2] after its root sampling: NeighborSampling for every root, then masking.

    ``roots`` are the step's central nodes (drawn by :func:`poisson_root_batches`, or an
    evaluation chunk); ``coins(root_ids, neighbour_ids)`` gives one Uniform(0, 1) per
    candidate edge (tests pass coins keyed by the pair to couple two neighbouring graphs).
    """
    owner, neighbours = candidate_neighbours(graph, roots)
    kept = neighbour_sampling(keep_probabilities(degrees, neighbours, multiplier), coins(roots[owner], neighbours))
    kept &= mask_central_nodes(roots, neighbours, graph.num_nodes)
    return SubgraphBatch(roots, owner[kept], neighbours[kept])


def neighbour_mean(features: torch.Tensor, batch: SubgraphBatch) -> torch.Tensor:
    """a_i = mean of the kept peripherals' features of G_i (0 when G_i has none), [B, F].

    A fixed, parameter-free function of the sub-graph: the encoder reads G_i only
    through (x_i, a_i), so a_i changes only when G_i's peripherals do.
    """
    sums = torch.zeros((batch.roots.numel(), features.shape[1]), dtype=features.dtype, device=features.device)
    sums.index_add_(0, batch.owner, features[batch.peripherals])
    counts = torch.bincount(batch.owner, minlength=batch.roots.numel()).to(features.dtype)
    return sums / counts.clamp(min=1.0)[:, None]


def default_rate(batch_size: int, train_roots: int) -> float:
    """q_b = batch_size / |train|: the expected batch is the configured batch size."""
    return min(1.0, batch_size / max(1, train_roots))


def batches_per_epoch(train_roots: int, batch_size: int) -> int:
    """ceil(|train| / batch_size): the trainer's planned steps per epoch."""
    return math.ceil(train_roots / batch_size)
