"""Edge inference from the released embeddings, from party B's position (docs/audit-attacks.md).

B scores a node pair by how alike A's releases of its two nodes are: message passing
mixes each node's neighbours into its embedding, so linked nodes look alike unless the
noise hides it. The same score (``pair_scores``) serves the edge-inference AUC and B's
guesses in the one-run canary audit.

The measurement (``edge_inference``) needs A's true edges, which only an auditor holds:
positives are true edges whose two nodes B received, negatives as many uniformly drawn
non-adjacent pairs of received nodes, and the AUC says how well the score ranks the
first above the second. On a homophilous graph linked nodes also have alike *features*,
so even releases that read no edge (the ``mlp`` extractor) score above 0.5: that run,
not 0.5, is the floor of what the edges themselves leak (docs/audit-attacks.md, section 3).
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel

from vesper.auditor.received_releases import ReceivedReleases
from vesper.party_b.metrics import roc_auc

NEGATIVE_DRAW_ROUNDS = 64  # rejection-sampling rounds before giving up on finding enough non-edges


class EdgeInferenceResult(BaseModel):
    """Edge inference on one run's record."""

    auc: float  # ROC-AUC of true edges (1) against non-adjacent pairs (0); 0.5 = chance
    positives: int  # true edges scored (both nodes received; at most max_pairs)
    negatives: int  # non-adjacent pairs scored
    note: str


def pair_scores(received: ReceivedReleases, pairs: np.ndarray) -> np.ndarray:
    """Cosine similarity of the two nodes' mean releases ē_u, ē_v, after centring on the mean
    over all received nodes (so a direction every node shares does not count); NaN where
    B never received one of the two nodes.

    ē_v averages every release of v B received (training and evaluation); a training node's
    mean therefore carries epochs times less noise variance than a node released once.
    """
    mean, seen = received.mean_release()
    flat = mean.reshape(mean.shape[0], -1)
    flat = flat - flat[seen].mean(axis=0, keepdims=True)
    norms = np.linalg.norm(flat, axis=1)
    u, v = pairs[:, 0], pairs[:, 1]
    denominator = norms[u] * norms[v]
    scores = np.einsum("ij,ij->i", flat[u], flat[v]) / np.where(denominator > 0, denominator, 1.0)
    return np.where(seen[u] & seen[v], scores, np.nan)


def canonical_edges(edges: np.ndarray, num_nodes: int) -> np.ndarray:
    """Undirected edge list: u < v, no self-loops, no duplicates (A's file may hold both directions)."""
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise ValueError(f"an edge names a node outside 0..{num_nodes - 1}")
    lo, hi = edges.min(axis=1), edges.max(axis=1)
    keep = lo != hi
    return np.unique(np.stack([lo[keep], hi[keep]], axis=1), axis=0)


def pair_keys(pairs: np.ndarray, num_nodes: int) -> np.ndarray:
    """One integer per undirected pair, min·N + max, for set membership."""
    return np.minimum(pairs[:, 0], pairs[:, 1]) * num_nodes + np.maximum(pairs[:, 0], pairs[:, 1])


def received_positives(edges: np.ndarray, received_mask: np.ndarray) -> np.ndarray:
    """True edges whose two nodes B received at least once."""
    return edges[received_mask[edges[:, 0]] & received_mask[edges[:, 1]]]


def draw_negatives(
    candidates: np.ndarray, edge_keys: np.ndarray, count: int, num_nodes: int, rng: np.random.Generator
) -> np.ndarray:
    """``count`` distinct pairs of distinct ``candidates`` nodes drawn uniformly among the
    non-adjacent ones (rejection sampling: draw, drop self-pairs, edges and repeats)."""
    chosen = np.zeros((0, 2), dtype=np.int64)
    chosen_keys = np.zeros(0, dtype=np.int64)
    for _ in range(NEGATIVE_DRAW_ROUNDS):
        need = count - chosen.shape[0]
        if need <= 0:
            break
        draw = candidates[rng.integers(0, candidates.size, size=(2 * need + 16, 2))]
        draw = draw[draw[:, 0] != draw[:, 1]]
        keys = pair_keys(draw, num_nodes)
        fresh = ~np.isin(keys, edge_keys) & ~np.isin(keys, chosen_keys)
        draw, keys = draw[fresh], keys[fresh]
        first = np.sort(np.unique(keys, return_index=True)[1])  # each pair once, in the order drawn
        chosen = np.concatenate([chosen, draw[first][:need]])
        chosen_keys = np.concatenate([chosen_keys, keys[first][:need]])
    if chosen.shape[0] < count:
        raise ValueError(f"found only {chosen.shape[0]} of {count} non-adjacent pairs among the received nodes")
    return chosen


def edge_inference(
    received: ReceivedReleases, edges: np.ndarray, seed: int, max_pairs: int = 20000
) -> EdgeInferenceResult:
    """AUC of ``pair_scores`` on A's true edges (both nodes received; a random ``max_pairs``
    of them when there are more) against as many uniformly drawn non-adjacent received pairs."""
    rng = np.random.default_rng(seed)
    num_nodes = received.num_nodes
    graph = canonical_edges(edges, num_nodes)
    _, seen = received.mean_release()
    positives = received_positives(graph, seen)
    if positives.shape[0] == 0:
        raise ValueError("no edge of A's graph has both nodes among those B received")
    if positives.shape[0] > max_pairs:
        positives = positives[rng.choice(positives.shape[0], size=max_pairs, replace=False)]
    negatives = draw_negatives(np.flatnonzero(seen), pair_keys(graph, num_nodes), positives.shape[0], num_nodes, rng)
    scores = pair_scores(received, np.concatenate([positives, negatives]))
    truth = np.concatenate([np.ones(positives.shape[0], bool), np.zeros(negatives.shape[0], bool)])
    excluded = graph.shape[0] - received_positives(graph, seen).shape[0]
    return EdgeInferenceResult(
        auc=roc_auc(scores, truth),
        positives=int(positives.shape[0]),
        negatives=int(negatives.shape[0]),
        note=(
            f"score = cosine of centred mean releases; {int(seen.sum())} of {num_nodes} nodes received; "
            f"{excluded} of {graph.shape[0]} edges left out (a node B never received)"
        ),
    )
