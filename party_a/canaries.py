"""Canary edges for the one-run audit (docs/audit-canaries.md), party A's side.

Steinke, Nasr and Jagielski (2023), Algorithm 1, with edges as the examples: A draws m
candidate pairs of unlinked nodes x₁, …, x_m from a public seed, flips a secret fair coin
S_i ∈ {−1, +1} for each, and inserts the pairs with S_i = +1 into its graph before the run
reads it. The run is then charged exactly as any run on that graph: a canary is an edge like
any other. After the run, B scores every candidate from what it received
(party_b.edge_inference.pair_scores), guesses, and the right guesses bound ε from below
(common.privacy.one_run_audit).

The coins are A's secret until the audit: they come from a generator of their own, derived
from A's secret base like the noise and sampling generators, so B cannot reproduce them and
a run with canaries draws the same noise as one without.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vesper.common.privacy.one_run_audit import OneRunAudit, canary_audit
from vesper.common.secret_randomness import secret_base
from vesper.party_a.graph_store import Graph, build_graph
from vesper.party_b.edge_inference import pair_scores
from vesper.party_b.release_record import ReceivedReleases

PAIR_SCORER = "B's view: party_b.edge_inference.pair_scores"

# Distinguishes the coins' generator from A's other secret generators of the same base.
_CANARY_LABEL = 0x43414E415259  # "CANARY"


@dataclass(frozen=True)
class CanaryDraw:
    """The m candidates (public), which of them A inserted (A's secret), and the public seed."""

    pairs: np.ndarray  # (m, 2) int64, distinct nodes, no node in two pairs, no pair an edge of A's graph
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
        with np.load(path, allow_pickle=False) as data:
            return cls(
                pairs=data["pairs"].astype(np.int64), included=data["included"].astype(bool),
                candidate_seed=int(data["candidate_seed"]),
            )


def canary_generator(secret_seed: int | None, run_seed: int) -> torch.Generator:
    """A's secret generator of the coins S (secret_randomness.secret_base, own label)."""
    return torch.Generator().manual_seed(secret_base(secret_seed, run_seed) ^ _CANARY_LABEL)


def candidate_pairs(graph: Graph, m: int, candidate_seed: int) -> np.ndarray:
    """m disjoint pairs of distinct, unlinked nodes, from the public ``candidate_seed``.

    Consecutive nodes of one random permutation are paired, so no node is in two pairs
    (one canary's score cannot move another's); pairs that are already edges are dropped.
    Nodes are uniform: A cannot yet know which nodes B will receive most often.
    """
    n = graph.num_nodes
    order = np.random.default_rng(candidate_seed).permutation(n)
    pairs = order[: 2 * (n // 2)].reshape(-1, 2)
    cpu = graph.to("cpu")
    edge_keys = (cpu.slot_rows * n + cpu.indices).numpy()  # both directions are in the CSR
    linked = np.isin(pairs[:, 0] * n + pairs[:, 1], edge_keys)
    pairs = pairs[~linked]
    if pairs.shape[0] < m:
        raise ValueError(
            f"audit.canaries={m}: the graph has {n} nodes, room for only {pairs.shape[0]} disjoint pairs of "
            "unlinked nodes; ask for fewer canaries"
        )
    return pairs[:m].astype(np.int64)


def draw_canaries(graph: Graph, m: int, candidate_seed: int, secret: torch.Generator) -> CanaryDraw:
    """Algorithm 1, steps 1-3: the public candidates and A's secret coins S_i ~ Bernoulli(½)."""
    pairs = candidate_pairs(graph, m, candidate_seed)
    included = torch.randint(0, 2, (m,), generator=secret, dtype=torch.int64).bool().numpy()
    return CanaryDraw(pairs=pairs, included=included, candidate_seed=candidate_seed)


def plant(graph: Graph, draw: CanaryDraw) -> Graph:
    """A's graph with the included canaries added as undirected edges (a new Graph; the
    given one is left as it is)."""
    cpu = graph.to("cpu")
    existing = torch.stack([cpu.slot_rows, cpu.indices], 1)
    planted = torch.from_numpy(draw.pairs[draw.included])
    return build_graph(torch.cat([existing, planted]), graph.num_nodes).to(graph.device)


def audit_canaries(draw: CanaryDraw, received: ReceivedReleases, delta: float, confidence: float) -> OneRunAudit:
    """B's guesses about the canaries from what it received, and the ε lower bound they give."""
    if received.num_nodes <= int(draw.pairs.max(initial=-1)):
        raise ValueError(f"the canaries name node {int(draw.pairs.max())}, but party B received ids of {received.num_nodes}")
    return canary_audit(pair_scores(received, draw.pairs), draw.included, delta, confidence, PAIR_SCORER)
