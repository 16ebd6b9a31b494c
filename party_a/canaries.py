"""Canary edges for the one-run audit (docs/audit-canaries.md), party A's side.

Steinke, Nasr and Jagielski (2023) [SNJ23, Alg. 1], with edges as the examples: A draws m
candidate pairs of unlinked nodes x₁, …, x_m from a public seed, flips a secret fair coin
S_i ∈ {−1, +1} for each, and inserts the pairs with S_i = +1 into its graph before the run
reads it. The run is then charged exactly as any run on that graph: a canary is an edge like
any other. After the run, the canaries are scored (B's own similarity score,
auditor.edge_inference.pair_scores, or the white-box statistics of
party_a.canary_statistics), guessed, and the right guesses bound ε from below
(auditor.one_run_bound).

The candidates are **worst-case canaries** (docs/audit-canaries.md, section 1): training
roots of B's split (released in every epoch, not once), of the smallest degree in A's
graph (a GCN canary's weight is 1/√((d_u+1)(d_v+1))), no two of them adjacent (so one
canary cannot move another endpoint's release). They can only be chosen once B has named
its split, so a run draws the coins at start and the pairs after set-up.

The coins are A's secret until the audit: they come from a generator of their own, derived
from A's secret base like the noise and sampling generators, so B cannot reproduce them and
a run with canaries draws the same noise as one without.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vesper.common.npz_files import read_npz
from vesper.common.secret_randomness import secret_base
from vesper.party_a.graph_store import Graph, build_graph

# Distinguishes the coins' generator from A's other secret generators of the same base.
_CANARY_LABEL = 0x43414E415259  # "CANARY"


@dataclass(frozen=True)
class CanaryDraw:
    """The m candidates (public), which of them A inserted (A's secret), and the public seed."""

    pairs: np.ndarray  # (m, 2) int64, distinct nodes, no node in two pairs, no two endpoints adjacent in A's graph
    included: np.ndarray  # (m,) bool: S_i = +1
    candidate_seed: int

    @property
    def m(self) -> int:
        return int(self.pairs.shape[0])

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, pairs=self.pairs, included=self.included, candidate_seed=np.int64(self.candidate_seed))

    @classmethod
    def load(cls, path: Path) -> CanaryDraw:
        data = read_npz(path)
        return cls(
            pairs=data["pairs"].astype(np.int64), included=data["included"].astype(bool),
            candidate_seed=int(data["candidate_seed"]),
        )


def canary_generator(secret_seed: int | None, run_seed: int) -> torch.Generator:
    """A's secret generator of the coins S (secret_randomness.secret_base, own label)."""
    return torch.Generator().manual_seed(secret_base(secret_seed, run_seed) ^ _CANARY_LABEL)


def draw_coins(m: int, secret: torch.Generator) -> np.ndarray:
    """[SNJ23, Alg. 1, step 3]: S_i ~ Bernoulli(½) for i = 1..m, True for S_i = +1 (insert)."""
    return torch.randint(0, 2, (m,), generator=secret, dtype=torch.int64).bool().numpy()


def low_degree_order(graph: Graph, roots: np.ndarray, candidate_seed: int) -> np.ndarray:
    """``roots`` by increasing degree in ``graph``, ties in the order of a public permutation."""
    degree = graph.degree.cpu().numpy()[roots]
    tie_break = np.random.default_rng(candidate_seed).permutation(roots.size)
    return roots[np.lexsort((tie_break, degree))]


def independent_prefix(graph: Graph, ordered: np.ndarray, count: int) -> np.ndarray:
    """Greedily, in the given order, up to ``count`` nodes no two of which are adjacent.

    Why: an endpoint adjacent to another canary's endpoint would see that canary move its
    neighbour's GCN coefficient, so its release would depend on two coins. Greedy is
    sequential by nature; it runs once per run over at most the training roots.
    """
    cpu = graph.to("cpu")
    indptr, indices = cpu.indptr.numpy(), cpu.indices.numpy()
    blocked = np.zeros(graph.num_nodes, dtype=bool)
    chosen: list[int] = []
    for node in ordered.tolist():
        if len(chosen) == count:
            break
        if blocked[node]:
            continue
        chosen.append(node)
        blocked[indices[indptr[node] : indptr[node + 1]]] = True
    return np.asarray(chosen, dtype=np.int64)


def candidate_pairs(graph: Graph, roots: np.ndarray, m: int, candidate_seed: int, fanout: int = 0) -> np.ndarray:
    """Up to m disjoint pairs of B's training ``roots``, lowest degree in A's ``graph`` first.

    Endpoints form an independent set of ``graph`` (so no pair is an edge, and no canary
    touches another's endpoints); consecutive endpoints of the low-degree order are paired,
    so both nodes of a pair have about the same degree. With ``fanout`` D > 0 only nodes of
    degree ≤ D − 1 qualify: with its canary such a node still keeps every neighbour, so the
    release does not depend on A's secret neighbour sampling. Fewer than m pairs when the
    qualifying roots run out (the draw's m says how many).
    """
    roots = np.unique(np.asarray(roots, dtype=np.int64))
    if fanout > 0:
        roots = roots[graph.degree.cpu().numpy()[roots] + 1 <= fanout]
    endpoints = independent_prefix(graph, low_degree_order(graph, roots, candidate_seed), 2 * m)
    return endpoints[: 2 * (endpoints.size // 2)].reshape(-1, 2)


def draw_canaries(
    graph: Graph, coins: np.ndarray, candidate_seed: int, roots: np.ndarray, fanout: int = 0
) -> CanaryDraw:
    """[SNJ23, Alg. 1, steps 1-3]: the public candidates among ``roots`` and A's secret coins
    (the first of ``coins`` when the qualifying roots allow fewer than len(coins) pairs)."""
    pairs = candidate_pairs(graph, roots, coins.size, candidate_seed, fanout)
    if not pairs.shape[0]:
        raise ValueError(
            "audit.canaries: no two non-adjacent training roots qualify as canary endpoints "
            f"(degree ≤ fanout − 1 = {fanout - 1})" if fanout else "audit.canaries: fewer than two training roots"
        )
    return CanaryDraw(pairs=pairs, included=coins[: pairs.shape[0]].copy(), candidate_seed=candidate_seed)


def plant(graph: Graph, draw: CanaryDraw) -> Graph:
    """A's graph with the included canaries added as undirected edges (a new Graph; the
    given one is left as it is)."""
    return _with_pairs(graph, draw.pairs[draw.included])


def with_all_candidates(graph: Graph, draw: CanaryDraw) -> Graph:
    """``graph`` plus every candidate pair, whatever its coin (the 'inserted' hypothesis of
    all canaries at once: the endpoints are independent, so each sees only its own)."""
    return _with_pairs(graph, draw.pairs)


def without_candidates(graph: Graph, draw: CanaryDraw) -> Graph:
    """``graph`` minus every candidate pair: A's graph without canaries, whatever the coins
    (no candidate is an edge of A's own graph)."""
    cpu = graph.to("cpu")
    n = graph.num_nodes
    keys = np.concatenate([draw.pairs[:, 0] * n + draw.pairs[:, 1], draw.pairs[:, 1] * n + draw.pairs[:, 0]])
    keep = ~np.isin((cpu.slot_rows * n + cpu.indices).numpy(), keys)
    return build_graph(torch.stack([cpu.slot_rows, cpu.indices], 1)[torch.from_numpy(keep)], n).to(graph.device)


def _with_pairs(graph: Graph, pairs: np.ndarray) -> Graph:
    cpu = graph.to("cpu")
    existing = torch.stack([cpu.slot_rows, cpu.indices], 1)
    return build_graph(torch.cat([existing, torch.from_numpy(pairs).reshape(-1, 2)]), graph.num_nodes).to(graph.device)
