"""What a curious party A can infer about B's training labels from the gradients B returns.

In every training step B sends back g_i = ∂Loss/∂e_i for each root i, the gradient of its
cross-entropy through its decoder with respect to A's embedding e_i ([VESPER, Alg. 3], [VESPER, eq. 38]).
With logits z = f(e_i), p = softmax(z) and the label y_i,

    (G1)  g_i = (1/B) · J_f(e_i)ᵀ (p_i − onehot(y_i)),

and for two classes p − onehot(y) = (p_1 − y)·(−1, 1)ᵀ, so

    (G2)  g_i = (1/B) · (p_{i,1} − y_i) · ∇_e (z_1 − z_0)(e_i):

a positive's gradient points along −∇(z_1 − z_0), a negative's along +∇(z_1 − z_0), and its
norm is |p_{i,1} − y_i| times the norm of that gradient. Li et al. (ICLR 2022, "Label leakage
and protection in two-party split learning") turn this into two attacks that need no label:

* the **norm attack** (``norm_scores``): ‖g_i‖. A decoder that has learnt the class prior
  predicts the minority class with low confidence, so minority-class gradients are larger;
* the **direction attack** (``direction_scores``): the two classes lie on opposite rays,
  so the projection of g_i/‖g_i‖ on the top principal axis separates them; A orients the
  axis by a rule that needs no label (``minority_orientation``).

For k > 2 classes (G1) points roughly along −∇z_{y_i}: gradients cluster by label, and
``cluster_labels`` runs k-means on the unit gradients.

Only ``evaluate_attack`` looks at labels: it is the *measurement* of the attacks (ROC-AUC,
matched cluster accuracy), which only someone holding both sides (a benchmark, never A) can
make. ``auc_ceiling`` and ``accuracy_ceiling`` are what label DP at ε allows any attack
to reach; docs/label-leakage.md derives them.
"""

from __future__ import annotations

import itertools
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel
from scipy.cluster.vq import kmeans2
from scipy.optimize import linear_sum_assignment, linprog

from vesper.common.npz_files import read_npz
from vesper.party_b.metrics import roc_auc

ArrayLike = np.ndarray | torch.Tensor

KMEANS_RESTARTS = 10
KMEANS_ITERATIONS = 50
CHANCE_PERMUTATIONS = 20
SUBSET_CONSTRAINT_CLASSES = 10  # above this, accuracy_ceiling relaxes (ε, δ)-DP to single outcomes


class RecordedGradientsError(ValueError):
    """A gradients.npz that is missing, unreadable or inconsistent."""


@dataclass(frozen=True)
class RecordedGradients:
    """What party A kept of B's gradients (``RunConfig.record_gradients``)."""

    node_ids: np.ndarray  # int64 [n]: every training root A received a gradient for
    gradients: np.ndarray  # float32 [n, d·L]: the last gradient of each node (last epoch)
    first_gradients: np.ndarray | None  # float32 [n, d·L]: first epoch, a NaN row where a node had none
    num_classes: int

    @property
    def nodes(self) -> int:
        return int(self.node_ids.size)

    @property
    def first_recorded(self) -> np.ndarray:
        """bool [n]: rows with a first-epoch gradient."""
        if self.first_gradients is None:
            return np.zeros(self.nodes, dtype=bool)
        return ~np.isnan(self.first_gradients).any(axis=1)


def _matrix(values: ArrayLike, name: str) -> np.ndarray:
    array = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if array.ndim != 2:
        raise ValueError(f"{name} must be a matrix [nodes, d·L], got shape {array.shape}")
    return array.astype(np.float64, copy=False)


def _vector(values: ArrayLike) -> np.ndarray:
    return values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)


# -- reading A's record -------------------------------------------------------------------------
def load_recorded(path: Path) -> RecordedGradients:
    """Read ``runs/<run_id>/gradients.npz`` from party A's workdir, checking its layout."""
    path = Path(path)
    if not path.is_file():
        raise RecordedGradientsError(
            f"no recorded gradients at {path}: party A writes them only for runs with record_gradients = true"
        )
    try:
        arrays = read_npz(path)
    except (OSError, ValueError) as exc:
        raise RecordedGradientsError(f"{path} is not a readable .npz file: {exc}") from None
    missing = [key for key in ("node_ids", "gradients", "num_classes") if key not in arrays]
    if missing:
        raise RecordedGradientsError(f"{path} lacks {', '.join(missing)} (has {', '.join(sorted(arrays)) or 'nothing'})")
    node_ids, gradients = arrays["node_ids"], arrays["gradients"]
    if node_ids.ndim != 1 or not np.issubdtype(node_ids.dtype, np.integer):
        raise RecordedGradientsError(f"{path}: node_ids must be a vector of integers, got {node_ids.dtype} {node_ids.shape}")
    if np.unique(node_ids).size != node_ids.size:
        raise RecordedGradientsError(f"{path}: node_ids repeat a node; each node must have one gradient row")
    if gradients.ndim != 2 or gradients.shape[0] != node_ids.size:
        raise RecordedGradientsError(
            f"{path}: gradients must be [{node_ids.size}, d·L] (one row per node id), got {gradients.shape}"
        )
    if not np.isfinite(gradients).all():
        raise RecordedGradientsError(f"{path}: gradients holds non-finite values")
    first = arrays.get("first_gradients")
    if first is not None:
        if first.shape != gradients.shape:
            raise RecordedGradientsError(f"{path}: first_gradients {first.shape} does not match gradients {gradients.shape}")
        finite = np.isfinite(first)
        # A marks a node without a first-epoch gradient by a row of NaN; anything else is damage
        if not (finite.all(axis=1) | np.isnan(first).all(axis=1)).all():
            raise RecordedGradientsError(f"{path}: first_gradients holds non-finite values outside whole missing (NaN) rows")
    classes = arrays["num_classes"]
    if classes.size != 1 or not np.issubdtype(classes.dtype, np.integer) or int(classes.reshape(-1)[0]) < 2:
        raise RecordedGradientsError(f"{path}: num_classes must be one integer ≥ 2, got {classes!r}")
    return RecordedGradients(
        node_ids.astype(np.int64), gradients.astype(np.float32),
        None if first is None else first.astype(np.float32), int(classes.reshape(-1)[0]),
    )


# -- the attacks: gradients in, scores out (no label anywhere) ----------------------------------
def norm_scores(gradients: ArrayLike) -> np.ndarray:
    """Norm attack: s_i = ‖g_i‖₂; by (G2) the class the decoder is less sure of scores higher."""
    return np.linalg.norm(_matrix(gradients, "gradients"), axis=1)


def unit_rows(gradients: ArrayLike) -> np.ndarray:
    """g_i / ‖g_i‖ row by row; a zero gradient stays zero (it says nothing about its label)."""
    matrix = _matrix(gradients, "gradients")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)


def principal_direction(units: np.ndarray) -> np.ndarray:
    """Top eigenvector v of the *uncentred* second moment Σ_i u_i u_iᵀ.

    By (G2) the classes lie on opposite rays through the origin, so the axis through the
    origin is the one that separates them; centring would subtract (n_− − n_+)/n of that
    very axis and shrink the between-class spread from 1 to 4π(1 − π). The sign of v is
    made deterministic (largest |component| positive); ``minority_orientation`` decides
    which way is positive.
    """
    n, width = units.shape
    matrix = torch.from_numpy(units)
    # torch's eigh, not numpy's: with torch loaded, OpenBLAS threads contend with torch's and even
    # a 32×32 problem is many times slower (docs/performance-notes.md)
    if n <= width:  # eigenvectors of the n×n Gram matrix mapped back: Uᵀw / ‖Uᵀw‖
        _, vectors = torch.linalg.eigh(matrix @ matrix.T)
        direction = (matrix.T @ vectors[:, -1]).numpy()
    else:
        _, vectors = torch.linalg.eigh(matrix.T @ matrix)
        direction = vectors[:, -1].numpy()
    norm = np.linalg.norm(direction)
    if norm == 0:
        return np.zeros(width)
    direction = direction / norm
    return direction if direction[np.argmax(np.abs(direction))] >= 0 else -direction


def minority_orientation(projections: np.ndarray) -> float:
    """+1 or −1: orient the axis so the *smaller* side gets the positive scores.

    The attacker's rule (Li et al.'s premise): the positive class is the minority, as in
    fraud, ban or conversion labels. Sides are counted by the sign of the projection; a
    tie goes to the side of smaller total |projection|. Both tests read only the
    projections and flip with them, so the scores do not depend on the sign of v (nor on
    a global sign of the gradients). On a balanced task the rule is a coin flip, and the
    measured AUC may then land below 0.5: that is reported as is.
    """
    above, below = int((projections > 0).sum()), int((projections < 0).sum())
    if above != below:
        return -1.0 if above > below else 1.0
    return -1.0 if projections.sum() > 0 else 1.0


def direction_scores(gradients: ArrayLike) -> np.ndarray:
    """Direction attack: s_i = ± ⟨g_i/‖g_i‖, v⟩, v = ``principal_direction``, sign by ``minority_orientation``."""
    units = unit_rows(gradients)
    projections = units @ principal_direction(units)
    return minority_orientation(projections) * projections


def cluster_labels(gradients: ArrayLike, num_classes: int, seed: int, restarts: int = KMEANS_RESTARTS) -> np.ndarray:
    """k-means with k = ``num_classes`` on the unit gradients; the restart of least inertia wins.

    Unit rows: by (G1) the direction carries the label and the norm mostly the decoder's
    confidence. Cluster ids are arbitrary; A cannot name them without some label.
    """
    units = unit_rows(gradients)
    if units.shape[0] < num_classes:
        raise ValueError(f"k-means with k={num_classes} needs at least {num_classes} gradients, got {units.shape[0]}")
    rng = np.random.default_rng(seed)
    best, best_inertia = None, math.inf
    for _ in range(restarts):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an emptied cluster keeps its centroid; its inertia decides
            centroids, assignment = kmeans2(units, num_classes, iter=KMEANS_ITERATIONS, minit="++", rng=rng)
        inertia = float(((units - centroids[assignment]) ** 2).sum())
        if inertia < best_inertia:
            best, best_inertia = assignment, inertia
    assert best is not None
    return best.astype(np.int64)


# -- the measurement: only here do labels enter ---------------------------------------------------
def matched_accuracy(clusters: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """Accuracy under the best one-to-one matching of clusters to classes (Hungarian method).

    The matching is chosen *with* the labels, so this is an upper bound on what an attacker
    who must name its clusters without labels achieves.
    """
    contingency = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(contingency, (clusters, labels), 1)
    rows, columns = linear_sum_assignment(contingency, maximize=True)
    return float(contingency[rows, columns].sum() / labels.size)


def matched_chance(clusters: np.ndarray, labels: np.ndarray, num_classes: int, seed: int,
                   permutations: int = CHANCE_PERMUTATIONS) -> float:
    """The matched accuracy of the same clusters against randomly permuted labels.

    The chance level of ``matched_accuracy`` itself: the matching's optimism, and the
    cluster and class sizes, lift it above the majority share on small samples.
    """
    rng = np.random.default_rng(seed)
    return float(np.mean([matched_accuracy(clusters, rng.permutation(labels), num_classes) for _ in range(permutations)]))


class LabelAttackReport(BaseModel):
    """How well the label-free attacks recover the labels of the nodes they were run on."""

    task: Literal["binary", "multiclass"]
    nodes: int
    num_classes: int
    norm_auc: float | None = None
    direction_auc: float | None = None
    cluster_accuracy: float | None = None
    chance: float
    matched_chance: float | None = None
    headline: float
    headline_attack: str


def evaluate_attack(
    node_ids: ArrayLike, gradients: ArrayLike, true_labels: ArrayLike, num_classes: int, seed: int = 0
) -> LabelAttackReport:
    """Run the attacks on ``gradients`` (row i = node ``node_ids[i]``) and score them against ``true_labels``.

    Binary: ROC-AUC of the norm and direction scores, chance 0.5; headline the better of
    the two (an attacker must pick one without labels, so this is an upper bound on it).
    Multi-class: ``matched_accuracy`` of ``cluster_labels``; chance = the majority class's
    share, and ``matched_chance`` the same clusters against permuted labels.
    """
    ids, labels = _vector(node_ids), _vector(true_labels).astype(np.int64)
    matrix = _matrix(gradients, "gradients")
    if not (ids.ndim == labels.ndim == 1 and ids.size == labels.size == matrix.shape[0]):
        raise ValueError(
            f"node_ids {ids.shape}, gradients {matrix.shape} and true_labels {labels.shape} must describe the same nodes"
        )
    if np.unique(ids).size != ids.size:
        raise ValueError("node_ids repeat a node")
    if not np.isfinite(matrix).all():
        raise ValueError("gradients hold non-finite values (a missing first-epoch row?); pass only recorded rows")
    if num_classes < 2 or labels.min(initial=0) < 0 or labels.max(initial=0) >= num_classes:
        raise ValueError(f"true_labels must lie in [0, {num_classes})")
    if num_classes == 2:
        if labels.min() == labels.max():
            raise ValueError("ROC-AUC needs both classes among the attacked nodes")
        norm, direction = roc_auc(norm_scores(matrix), labels), roc_auc(direction_scores(matrix), labels)
        best = "direction" if direction > norm else "norm"
        return LabelAttackReport(
            task="binary", nodes=int(ids.size), num_classes=2, norm_auc=norm, direction_auc=direction,
            chance=0.5, headline=max(norm, direction), headline_attack=best,
        )
    clusters = cluster_labels(matrix, num_classes, seed)
    accuracy = matched_accuracy(clusters, labels, num_classes)
    return LabelAttackReport(
        task="multiclass", nodes=int(ids.size), num_classes=num_classes, cluster_accuracy=accuracy,
        chance=float(np.bincount(labels, minlength=num_classes).max() / labels.size),
        matched_chance=matched_chance(clusters, labels, num_classes, seed),
        headline=accuracy, headline_attack="cluster",
    )


def auc_standard_error(auc: float, positives: int, negatives: int) -> float:
    """Upper bound on the standard error of an empirical ROC-AUC whose expectation is ``auc``.

    The Mann-Whitney statistic has variance at most A(1 − A)/min(n₊, n₋) whatever the score
    distributions (van Dantzig 1951; Birnbaum & Klose 1957). A bound, not an estimate: near
    A = 1 the usual approximations (Hanley-McNeil) fall to ~0 while a handful of flipped
    labels still move the AUC by 1/n₊ each.
    """
    if positives < 1 or negatives < 1:
        raise ValueError("an AUC needs at least one positive and one negative")
    return math.sqrt(max(auc * (1 - auc), 0.0) / min(positives, negatives))


def accuracy_standard_error(accuracy: float, nodes: int) -> float:
    """Binomial standard error of an accuracy over ``nodes`` labels."""
    if nodes < 1:
        raise ValueError("an accuracy needs at least one node")
    return math.sqrt(accuracy * (1 - accuracy) / nodes)


# -- what label DP at ε allows (docs/label-leakage.md, section 4) ----------------------------------
def auc_ceiling(epsilon: float, delta: float = 0.0) -> float:
    """Largest ROC-AUC of any test of y_i = 1 against y_i = 0 on an (ε, δ)-DP release (eq. C3).

    The ROC curve must stay under TPR ≤ e^ε·FPR + δ and TPR ≤ 1 − e^{−ε}(1 − δ − FPR)
    (eq. C1); the area under that boundary is C3, = e^ε/(1 + e^ε) at δ = 0.
    """
    if math.isinf(epsilon):
        return 1.0
    if epsilon < 0 or not 0 <= delta < 1:
        raise ValueError("auc_ceiling needs ε ≥ 0 and 0 ≤ δ < 1")
    e = math.exp(epsilon)
    kink = (1 - delta) / (1 + e)  # where the two lines of C1 meet
    rising = e * kink**2 / 2 + delta * kink
    flattening = (1 - delta - kink) - (1 - delta - kink) ** 2 / (2 * e)
    return min(1.0, rising + flattening + delta)


def accuracy_ceiling(epsilon: float, prior: ArrayLike, delta: float = 0.0) -> float:
    """Largest P(ŷ_i = y_i) of any estimator on an (ε, δ)-DP release of y_i ~ prior (eq. C5).

    A linear programme over the estimator's confusion matrix M[y, c] = P(ŷ = c | y): rows
    sum to 1, and P(ŷ ∈ S | y) ≤ e^ε P(ŷ ∈ S | y') + δ for every pair y ≠ y' and every set
    S of guesses (single guesses suffice when δ = 0; above ``SUBSET_CONSTRAINT_CLASSES``
    classes only single guesses are imposed, which can only raise the ceiling). Uniform
    prior and δ = 0: e^ε / (e^ε + k − 1) (eq. C4).
    """
    pi = _vector(prior).astype(np.float64)
    k = pi.size
    if k < 2 or (pi < 0).any() or not math.isclose(pi.sum(), 1.0, rel_tol=1e-9):
        raise ValueError("prior must be a probability vector over at least two classes")
    if math.isinf(epsilon):
        return 1.0
    sets: list[tuple[int, ...]] = [(c,) for c in range(k)]
    if delta > 0 and k <= SUBSET_CONSTRAINT_CLASSES:
        sets = [s for size in range(1, k) for s in itertools.combinations(range(k), size)]
    e = math.exp(epsilon)
    rows = []
    for y, other in itertools.permutations(range(k), 2):
        for subset in sets:
            row = np.zeros((k, k))
            row[y, list(subset)] = 1.0
            row[other, list(subset)] -= e
            rows.append(row.ravel())
    sums = np.kron(np.eye(k), np.ones(k))  # Σ_c M[y, c] = 1
    objective = -np.diag(pi).ravel()  # maximise Σ_y π_y M[y, y]
    result = linprog(objective, A_ub=np.array(rows), b_ub=np.full(len(rows), delta), A_eq=sums,
                     b_eq=np.ones(k), bounds=(0, 1), method="highs")
    if not result.success:
        raise RuntimeError(f"accuracy_ceiling: the linear programme failed: {result.message}")
    return min(1.0, float(-result.fun))
