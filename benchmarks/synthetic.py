"""Synthetic graphs from a contextual stochastic block model with a settable degree profile.

Real datasets are few and fixed in size. Tests need graphs whose properties are known
in advance, and scale runs need graphs with up to about a million nodes and ten million
edges. A contextual stochastic block model (CSBM) gives both. Each node has a class.
Its features are a noisy copy of its class's mean. Its edges prefer nodes of the same
class, by an amount set by ``homophily``. Each of these settings matches one thing a
GNN uses: features alone, structure alone, or both.

The model, in order of generation (one ``np.random.default_rng(spec.seed)`` for all of
it, so the same spec always gives the same arrays, bit for bit):

1. **Labels.** Drawn i.i.d. from ``class_balance`` (uniform by default).
2. **Features.** ``x_v = mu[y_v] + N(0, I_F)`` in float32. When ``num_classes <=
   num_features``, the class means are orthonormal random directions scaled by
   ``feature_signal``, so every two class means are exactly ``feature_signal * sqrt(2)``
   apart. With more classes than features they cannot all be orthogonal: each mean is
   then a random direction of norm ``feature_signal``, so two means are
   ``feature_signal * sqrt(2)`` apart only on average. In both cases the separation
   grows linearly with ``feature_signal``, and 0 gives features with no signal.
3. **Degree profile.** Every node has a propensity weight. A node's expected degree is
   roughly proportional to its weight. Exactly ``round(isolated_fraction * N)`` nodes,
   picked uniformly, get weight 0. These *isolated* nodes never touch an edge. The
   other, *active* nodes get lognormal weights. ``"dense"`` (like a co-purchase graph)
   uses sigma 0.5, a mild spread, and by default no isolated nodes and mean degree 40.
   ``"sparse"`` (like a transaction graph, where many users have no transaction in the
   period) uses sigma 1.0 and by default half the nodes isolated and mean degree 2.2.
   In that case most active nodes have a handful of edges and a few are hubs.
   ``mean_degree`` is ``2M/N`` over *all* nodes, so with half the nodes isolated the
   active ones have about twice that.
4. **Edges.** ``M = round(mean_degree * N / 2)`` undirected simple edges. Of these,
   ``round(homophily * M)`` join two nodes of the same class and the rest join nodes
   of different classes. Fixing the two counts (rather than flipping a coin per edge)
   makes the measured edge homophily equal the request up to rounding. It also stops
   duplicate removal from biasing it: same-class pairs are fewer, so they collide more
   often. Each edge draws an endpoint ``u`` by propensity. A same-class edge then draws
   ``v`` by propensity among the active nodes of ``u``'s class. A cross-class edge
   first draws a class other than ``u``'s, with probability proportional to that
   class's total weight, and then draws ``v`` inside it. Self-loops are redrawn a few
   times and then dropped. Pairs are put in ``u < v`` form and de-duplicated. Rounds of
   over-sampling fill in what was dropped.

   Before any propensity draws, every active node is used as ``u`` once, in random
   order. Without these *coverage* edges, about 16% of the active nodes of a default
   sparse graph would have no edge by chance. ``isolated_fraction`` would then be only
   a lower bound on the fraction of degree-0 nodes, not its value. Coverage edges come
   first in draw order, so they are kept when the counts are cut to size. Every active
   node then has degree >= 1 whenever ``M`` is at least the number of active nodes
   (always true for the profile defaults). The one exception is a node that is the
   only active node of its class and is sent to the same-class pool, where its draws
   can only be self-loops. The lognormal tail still decides which nodes are hubs.
5. **Split.** One stratified 50/25/25 train/val/test split, from the project's own
   :func:`vesper.common.splits.stratified_split`. Its seed is drawn from the same
   generator. It is stored as masks of shape ``[1, N]``, the layout of the Tolokers
   file.

Everything is vectorised with numpy. The only Python loops are over classes and over
the (few) over-sampling rounds, never over nodes or edges. Edges are int64 and
features float32, so a 1M-node, 10M-edge graph takes a few hundred MB.
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from vesper.common.splits import stratified_split

Profile = Literal["dense", "sparse"]

PROFILE_MEAN_DEGREE: dict[str, float] = {"dense": 40.0, "sparse": 2.2}
PROFILE_ISOLATED_FRACTION: dict[str, float] = {"dense": 0.0, "sparse": 0.5}
PROFILE_WEIGHT_SIGMA: dict[str, float] = {"dense": 0.5, "sparse": 1.0}

# Edge keys are u * N + v in int64, so N * N must not overflow.
MAX_NODES = 2**31 - 1
# A same-class self-loop is redrawn this many times before the draw is dropped. Only a
# class with one active node (or one overwhelming hub) needs more than one retry.
_SELF_LOOP_RETRIES = 8
# Over-sampling rounds before giving up on a near-complete graph. Sparse targets are
# met in two or three rounds.
_MAX_ROUNDS = 32
_OVERSAMPLE = 1.2
_BALANCE_TOLERANCE = 1e-6


@dataclass(frozen=True)
class SyntheticSpec:
    """All settings of one synthetic graph. It is checked on construction, so an
    impossible spec fails where it is written, not deep inside a run."""

    num_nodes: int = 2000
    num_classes: int = 2
    num_features: int = 16
    profile: Profile = "sparse"
    mean_degree: float | None = None  # None -> profile default (dense 40.0, sparse 2.2)
    homophily: float = 0.8  # fraction of edges that join two nodes of the same class
    feature_signal: float = 1.0  # class-mean separation, in units of the unit feature noise
    class_balance: tuple[float, ...] | None = None  # None -> uniform
    isolated_fraction: float | None = None  # None -> profile default (dense 0.0, sparse 0.5)
    seed: int = 0

    def __post_init__(self) -> None:
        _check_int("num_nodes", self.num_nodes, 2, MAX_NODES)
        _check_int("num_classes", self.num_classes, 2, None)
        _check_int("num_features", self.num_features, 1, None)
        _check_int("seed", self.seed, 0, None)
        if self.profile not in PROFILE_MEAN_DEGREE:
            raise ValueError(f"profile must be 'dense' or 'sparse', got {self.profile!r}")
        if self.mean_degree is not None:
            _check_real("mean_degree", self.mean_degree, 0.0, None)
        _check_real("homophily", self.homophily, 0.0, 1.0)
        _check_real("feature_signal", self.feature_signal, 0.0, None)
        if self.isolated_fraction is not None:
            _check_real("isolated_fraction", self.isolated_fraction, 0.0, 1.0)
            if self.isolated_fraction >= 1.0:
                raise ValueError(f"isolated_fraction must be below 1, got {self.isolated_fraction}")
        if self.class_balance is not None:
            # A list would make the frozen spec unhashable; store a tuple of floats.
            try:
                balance = tuple(float(p) for p in self.class_balance)
            except (TypeError, ValueError):
                raise ValueError(
                    f"class_balance must be a sequence of numbers, got {self.class_balance!r}"
                ) from None
            object.__setattr__(self, "class_balance", balance)
            if len(balance) != self.num_classes:
                raise ValueError(
                    f"class_balance has {len(balance)} entries but num_classes is {self.num_classes}"
                )
            if not all(math.isfinite(p) and p > 0.0 for p in balance):
                raise ValueError(f"class_balance entries must be positive and finite, got {balance}")
            if abs(math.fsum(balance) - 1.0) > _BALANCE_TOLERANCE:
                raise ValueError(f"class_balance must sum to 1, got {balance} (sum {math.fsum(balance)})")
        # Infeasibility that does not depend on the random draws is reported here.
        active = self.num_active_nodes
        if self.target_edges > 0 and active < 2:
            raise ValueError(
                f"isolated_fraction={self.resolved_isolated_fraction} leaves {active} active node(s) "
                f"of {self.num_nodes}; {self.target_edges} edges need at least 2"
            )
        capacity = active * (active - 1) // 2
        if self.target_edges > capacity:
            raise ValueError(
                f"mean_degree={self.resolved_mean_degree} asks for {self.target_edges} edges, but "
                f"{active} active nodes (num_nodes={self.num_nodes}, isolated_fraction="
                f"{self.resolved_isolated_fraction}) hold at most {capacity}"
            )

    @property
    def resolved_mean_degree(self) -> float:
        return PROFILE_MEAN_DEGREE[self.profile] if self.mean_degree is None else float(self.mean_degree)

    @property
    def resolved_isolated_fraction(self) -> float:
        if self.isolated_fraction is None:
            return PROFILE_ISOLATED_FRACTION[self.profile]
        return float(self.isolated_fraction)

    @property
    def resolved_class_balance(self) -> tuple[float, ...]:
        if self.class_balance is None:
            return (1.0 / self.num_classes,) * self.num_classes
        return self.class_balance

    @property
    def num_isolated_nodes(self) -> int:
        return int(round(self.resolved_isolated_fraction * self.num_nodes))

    @property
    def num_active_nodes(self) -> int:
        return self.num_nodes - self.num_isolated_nodes

    @property
    def target_edges(self) -> int:
        """M, the number of undirected edges asked for; 2M/N is the mean degree."""
        return int(round(self.resolved_mean_degree * self.num_nodes / 2))


def _check_int(name: str, value: object, low: int, high: int | None) -> None:
    # bool is an int subclass; True as a node count is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bound}, got {value}")


def _check_real(name: str, value: object, low: float, high: float | None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be finite and {bound}, got {value}")


@dataclass(frozen=True)
class SyntheticGraph:
    """A generated graph in the arrays of the ``heterophily`` file layout."""

    node_features: NDArray[np.float32]  # [N, F]
    node_labels: NDArray[np.int64]  # [N]
    edges: NDArray[np.int64]  # [M, 2]: each undirected edge once, u < v, no self-loops
    train_masks: NDArray[np.bool_]  # [1, N]
    val_masks: NDArray[np.bool_]  # [1, N]
    test_masks: NDArray[np.bool_]  # [1, N]

    @property
    def num_nodes(self) -> int:
        return int(self.node_labels.shape[0])

    @property
    def num_edges(self) -> int:
        return int(self.edges.shape[0])


def generate(spec: SyntheticSpec) -> SyntheticGraph:
    """Draw one graph from the model in the module docstring.

    The draws always happen in the same order from one generator seeded with
    ``spec.seed``, so a spec always gives the same arrays.
    """
    rng = np.random.default_rng(spec.seed)
    n, c = spec.num_nodes, spec.num_classes

    balance = np.asarray(spec.resolved_class_balance, dtype=np.float64)
    labels = rng.choice(c, size=n, p=balance / balance.sum()).astype(np.int64)
    features = _features(rng, labels, c, spec.num_features, spec.feature_signal)
    weights = _propensities(rng, n, spec.num_isolated_nodes, PROFILE_WEIGHT_SIGMA[spec.profile])
    edges = _edges(rng, labels, weights, c, spec.target_edges, spec.homophily)

    split = stratified_split(labels, seed=int(rng.integers(2**63 - 1)))
    masks = []
    for ids in (split.train, split.val, split.test):
        mask = np.zeros((1, n), dtype=np.bool_)
        mask[0, ids] = True
        masks.append(mask)
    return SyntheticGraph(features, labels, edges, masks[0], masks[1], masks[2])


def save_npz(graph: SyntheticGraph, path: Path) -> None:
    """Write the ``heterophily`` layout that :mod:`vesper.common.dataset_files` reads.

    The file is written to a temporary name and then renamed. A run that dies while
    writing a multi-hundred-MB graph then leaves no truncated ``.npz`` that a party
    would take for a dataset. The arrays are stored uncompressed so that ``np.load``
    can read each party's arrays without decompressing the others'.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        # A file object (not a name) stops np.savez from appending ".npz" to the name.
        with open(tmp, "wb") as handle:
            np.savez(
                handle,
                node_features=graph.node_features,
                node_labels=graph.node_labels,
                edges=graph.edges,
                train_masks=graph.train_masks,
                val_masks=graph.val_masks,
                test_masks=graph.test_masks,
            )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- features


def _class_means(rng: np.random.Generator, c: int, f: int, signal: float) -> NDArray[np.float32]:
    gauss = rng.standard_normal((f, c))
    if c <= f:
        # QR of a Gaussian matrix: orthonormal, uniformly oriented directions. So the
        # distance between two class means is exactly signal * sqrt(2).
        q, r = np.linalg.qr(gauss)
        # QR signs are LAPACK's choice; fixing them makes the directions depend on the
        # draws only.
        directions = (q * np.where(np.diag(r) < 0, -1.0, 1.0)).T
    else:
        norms = np.linalg.norm(gauss, axis=0, keepdims=True)
        directions = (gauss / np.maximum(norms, np.finfo(np.float64).tiny)).T
    return (signal * directions).astype(np.float32)


def _features(
    rng: np.random.Generator, labels: NDArray[np.int64], c: int, f: int, signal: float
) -> NDArray[np.float32]:
    means = _class_means(rng, c, f, signal)
    # Float32 noise, and the means added in place, so that no [N, F] float64 array is
    # ever made.
    features = rng.standard_normal((labels.shape[0], f), dtype=np.float32)
    features += means[labels]
    return features


def _propensities(rng: np.random.Generator, n: int, n_isolated: int, sigma: float) -> NDArray[np.float64]:
    weights = rng.lognormal(mean=0.0, sigma=sigma, size=n)
    if n_isolated:
        weights[rng.choice(n, size=n_isolated, replace=False)] = 0.0
    return weights


# ------------------------------------------------------------------------------- edges


class _Sampler:
    """Draws nodes by propensity, either overall or inside one class.

    The active nodes are sorted by class, so that each class is one contiguous segment
    of a single cumulative-weight array. A draw inside class ``k`` is then a uniform
    number in that class's segment, located with ``np.searchsorted``. Isolated nodes
    are left out of the array, so no floating-point rounding can ever draw one.
    """

    def __init__(self, labels: NDArray[np.int64], weights: NDArray[np.float64], c: int) -> None:
        active = np.flatnonzero(weights > 0)
        order = np.argsort(labels[active], kind="stable")
        self.nodes: NDArray[np.int64] = active[order].astype(np.int64)  # position -> node id
        self.cum = np.cumsum(weights[self.nodes])
        counts = np.bincount(labels[self.nodes], minlength=c)
        self.counts: NDArray[np.int64] = counts.astype(np.int64)
        self.hi = np.cumsum(counts)  # one past the last position of each class
        self.lo = self.hi - counts
        self.pos_class: NDArray[np.int64] = np.repeat(np.arange(c, dtype=np.int64), counts)
        # Segment bounds are read back from ``cum`` itself, so that they agree with
        # the array that searchsorted looks at.
        cum0 = np.concatenate([[0.0], self.cum])
        self.seg_start = cum0[self.lo]
        self.seg_weight = cum0[self.hi] - self.seg_start
        self.total = float(self.cum[-1]) if self.cum.size else 0.0

    def overall(self, rng: np.random.Generator, size: int) -> NDArray[np.int64]:
        """Positions drawn by propensity over all active nodes."""
        pos = np.searchsorted(self.cum, rng.random(size) * self.total, side="right")
        return np.minimum(pos, self.cum.size - 1)

    def in_class(self, rng: np.random.Generator, classes: NDArray[np.int64]) -> NDArray[np.int64]:
        """One position per entry of ``classes``, by propensity inside that class.

        Every class asked for must have an active node.
        """
        r = self.seg_start[classes] + rng.random(classes.shape[0]) * self.seg_weight[classes]
        pos = np.searchsorted(self.cum, r, side="right")
        return np.clip(pos, self.lo[classes], self.hi[classes] - 1)

    def other_class(self, rng: np.random.Generator, classes: NDArray[np.int64]) -> NDArray[np.int64]:
        """For each entry, a class other than it, drawn in proportion to total weight."""
        out = np.empty_like(classes)
        uniform = rng.random(classes.shape[0])
        for k in range(self.seg_weight.shape[0]):  # a loop over classes, not nodes
            rows = np.flatnonzero(classes == k)
            if rows.size == 0:
                continue
            w = self.seg_weight.copy()
            w[k] = 0.0
            cum = np.cumsum(w)
            pick = np.searchsorted(cum, uniform[rows] * cum[-1], side="right")
            # Zero-weight classes are empty bins, so searchsorted skips them. Only a
            # draw rounded up to the very top can land past the last real class.
            out[rows] = np.minimum(pick, np.flatnonzero(w > 0)[-1])
        return out


def _edges(
    rng: np.random.Generator,
    labels: NDArray[np.int64],
    weights: NDArray[np.float64],
    c: int,
    target: int,
    homophily: float,
) -> NDArray[np.int64]:
    n = labels.shape[0]
    if target == 0:
        return np.empty((0, 2), dtype=np.int64)
    sampler = _Sampler(labels, weights, c)
    target_same = int(round(homophily * target))
    target_cross = target - target_same

    # These capacities depend on the drawn labels, so they cannot be checked in the spec.
    counts = sampler.counts
    cap_same = int(np.sum(counts * (counts - 1) // 2))
    a = int(counts.sum())
    cap_cross = (a * a - int(np.sum(counts * counts))) // 2
    if target_same > cap_same or target_cross > cap_cross:
        raise ValueError(
            f"homophily={homophily} with {target} edges asks for {target_same} same-class and "
            f"{target_cross} cross-class edges, but the active nodes per class "
            f"{counts.tolist()} hold at most {cap_same} and {cap_cross}"
        )

    # Coverage: every active node is the first endpoint of one edge, in random order.
    # A share of about ``homophily`` of them goes to the same-class pool. The share is
    # clipped so that, when target >= a, neither pool gets more coverage edges than its
    # target. Otherwise the cut would drop some, and their nodes could end with no edge.
    coverage = rng.permutation(a)
    n_same = min(max(round(homophily * a), a - target_cross, 0), target_same)
    same = _fill_pool(rng, sampler, n, target_same, coverage[:n_same], same_class=True)
    cross = _fill_pool(rng, sampler, n, target_cross, coverage[n_same:], same_class=False)

    keys = np.concatenate([same, cross])
    keys.sort()
    if keys.size < target:
        warnings.warn(
            f"generated {keys.size} of {target} edges: the graph is too close to complete for "
            f"rejection sampling to fill it in {_MAX_ROUNDS} rounds",
            RuntimeWarning,
            stacklevel=3,
        )
    edges = np.empty((keys.size, 2), dtype=np.int64)
    np.divmod(keys, n, out=(edges[:, 0], edges[:, 1]))
    return edges


def _fill_pool(
    rng: np.random.Generator,
    sampler: _Sampler,
    n: int,
    target: int,
    first: NDArray[np.int64],
    same_class: bool,
) -> NDArray[np.int64]:
    """Sorted keys ``u * n + v`` (u < v) of ``target`` distinct edges of one kind.

    Each round keeps new pairs in the order they were drawn and takes the first ones
    it needs. The cut to exactly ``target`` is then a uniform random subset (draws are
    i.i.d.), not the pairs with the smallest ids. The coverage pairs in ``first`` are
    drawn first, so they survive the cut.
    """
    keys = np.empty(0, dtype=np.int64)
    if target == 0:
        return keys
    rate = 1.0  # fraction of the last round's draws that were new edges
    cap = max(2 * target, 1 << 16)  # bounds the memory of one round
    for round_ in range(_MAX_ROUNDS):
        missing = target - keys.size
        if missing <= 0:
            break
        want = min(cap, math.ceil(missing * _OVERSAMPLE / rate) + 16)
        if round_ == 0 and first.size:
            u = np.concatenate([first, sampler.overall(rng, max(0, want - first.size))])
        else:
            u = sampler.overall(rng, want)
        u_class = sampler.pos_class[u]
        if same_class:
            v = sampler.in_class(rng, u_class)
            for _ in range(_SELF_LOOP_RETRIES):
                loops = np.flatnonzero(u == v)
                if loops.size == 0:
                    break
                v[loops] = sampler.in_class(rng, u_class[loops])
        else:
            v = sampler.in_class(rng, sampler.other_class(rng, u_class))
        u_node, v_node = sampler.nodes[u], sampler.nodes[v]
        del u, v, u_class
        keep = u_node != v_node
        lo = np.minimum(u_node, v_node)[keep]
        hi = np.maximum(u_node, v_node)[keep]
        del u_node, v_node, keep
        cand = lo * n + hi
        del lo, hi
        if keys.size:
            at = np.minimum(np.searchsorted(keys, cand), keys.size - 1)
            cand = cand[keys[at] != cand]
        # The first occurrence of each new pair, in draw order.
        _, first_at = np.unique(cand, return_index=True)
        first_at.sort()
        fresh = cand[first_at[:missing]]
        rate = max(fresh.size, 1) / want
        keys = np.concatenate([keys, fresh])
        keys.sort()
    return keys
