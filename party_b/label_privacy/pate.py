"""DP-GPL at party B ([DP-GPL, Alg. 2]; shared/seeds/dp-gpl.txt) with Confident-GNMax [PSM+18].

Party A's extractor is frozen and was trained without B's labels, so A's embeddings of
B's nodes carry no information about them. B then runs the five steps of [DP-GPL, Alg. 2]:

1. :func:`partition` — N disjoint groups of B's labelled training nodes, balanced and
   drawn without looking at the labels (line 6);
2. :func:`train_teachers` — teacher i is a prompt vector p_i added to the flattened
   embedding and a linear head (W_i, b_i), trained on group i only (line 9);
3. :meth:`TeacherEnsemble.votes` — each teacher's class for each of the Q query nodes
   (lines 14–15);
4. :func:`vote_histogram` and :func:`confident_gnmax` — the vote counts c_m (line 18), the
   noisy threshold test max_m c_m + N(0, σ1²) ≥ T (line 19, :func:`noisy_threshold`) and
   the noisy argmax argmax_m c_m + N(0, σ2²) (line 20, :func:`gnmax`);
5. the student is B's normal decoder, trained in the normal loop with A on the answered
   queries only (line 25; party B's session does this).

Accounting (docs/label-privacy.md, section 5): data-independent, one :func:`query_event`
per query whether it is answered or not: the threshold step is a Gaussian mechanism on
the max count with L2 sensitivity 1 (RDP α/(2σ1²)), the GNMax step a Gaussian mechanism
on the histogram with L2 sensitivity √2 (RDP α/σ2²; the DP-GPL paper uses 1, which is
wrong). No data-dependent (smooth-sensitivity) analysis is claimed. Without that analysis
the threshold step saves no budget, so plain GNMax (σ1 = None: no threshold step, every
query answered) is offered too; it measured as good or better on Cora and Tolokers.

Randomness: every function draws its random tensors on ``generator.device`` and moves them
to the data's device, so the same generator gives the same result wherever the data
lives, and CPU data with a CUDA generator (or the reverse) works.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import torch
import torch.nn.functional as F

from vesper.common.privacy.accounting import AccountantName, calibrate

# L2 sensitivities for "replace one label" (docs/label-privacy.md, eq. P2 and P3): one label
# is in exactly one group, so it can change one teacher, hence one vote per query.
MAX_COUNT_SENSITIVITY = 1.0  # max_m c_m moves by at most one vote
HISTOGRAM_SENSITIVITY = math.sqrt(2.0)  # one count −1, another +1
THRESHOLD_MARGIN = 0.2  # default T: see default_threshold
# Scoring the queries builds an [N, chunk, D] tensor; this keeps it near 64 MB of float32.
_SCORING_ELEMENTS = 16_000_000


# -- step 0: the query nodes ---------------------------------------------------------------


def select_queries(candidates: torch.Tensor, queries: int, generator: torch.Generator) -> torch.Tensor:
    """Q node ids drawn uniformly without replacement from ``candidates``, sorted.

    All candidates when there are at most Q. The draw must not look at any label: the
    ids go to A (B asks A for their embeddings) and are outside the accounting, so a
    label-dependent choice would leak labels for free.
    """
    if queries < 0:
        raise ValueError(f"the number of queries must be >= 0, got {queries}")
    if candidates.numel() <= queries:
        return torch.sort(candidates.flatten()).values
    order = torch.randperm(candidates.numel(), generator=generator, device=generator.device).to(candidates.device)
    return torch.sort(candidates.flatten()[order[:queries]]).values


# -- step 1: partition ----------------------------------------------------------------------


def partition(node_ids: torch.Tensor, teachers: int, generator: torch.Generator) -> torch.Tensor:
    """Teacher index in [0, N) of each node: a random permutation, then position mod N.

    Groups are disjoint and balanced (sizes ⌊n/N⌋ or ⌈n/N⌉), and the labels are not an
    input: under "replace one label" the partition is the same for both neighbouring
    datasets, so the changed label sits in exactly one group (docs/label-privacy.md, P1).
    """
    count = node_ids.numel()
    if teachers < 1:
        raise ValueError(f"the number of teachers must be >= 1, got {teachers}")
    if count < teachers:
        raise ValueError(
            f"cannot split {count} labelled training nodes among {teachers} teachers: fewer nodes than teachers"
        )
    order = torch.randperm(count, generator=generator, device=generator.device).to(node_ids.device)
    groups = torch.empty(count, dtype=torch.int64, device=node_ids.device)
    groups[order] = torch.arange(count, device=node_ids.device) % teachers
    return groups


# -- step 2: teachers -----------------------------------------------------------------------


def _flatten(embeddings: torch.Tensor) -> torch.Tensor:
    """[n, d, L] or [n, D] embeddings as [n, D] float32 features (D = d·L)."""
    if embeddings.ndim not in (2, 3):
        raise ValueError(f"embeddings must be [n, d, L] or [n, D], got shape {list(embeddings.shape)}")
    return embeddings.flatten(1).to(torch.float32)


@dataclass(frozen=True)
class TeacherEnsemble:
    """N teachers, stacked: teacher i scores x as (standardise(x) + p_i) W_i + b_i.

    ``mean`` and ``scale`` standardise the features; they are computed from the training
    embeddings alone (no labels), so they are the same for neighbouring label vectors.
    """

    prompts: torch.Tensor  # [N, D]  p_i
    weights: torch.Tensor  # [N, D, C]  W_i
    biases: torch.Tensor  # [N, C]  b_i
    mean: torch.Tensor  # [D]
    scale: torch.Tensor  # [D]

    @property
    def teachers(self) -> int:
        return int(self.prompts.shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.biases.shape[1])

    def standardise(self, embeddings: torch.Tensor) -> torch.Tensor:
        return (_flatten(embeddings).to(self.mean.device) - self.mean) / self.scale

    def logits(self, embeddings: torch.Tensor) -> torch.Tensor:
        """[Q, N, C]: every teacher's logits for every query [DP-GPL, Alg. 2, line 15]."""
        features = self.standardise(embeddings)
        chunk = max(1, _SCORING_ELEMENTS // max(1, self.teachers * features.shape[1]))
        parts = [_teacher_logits(features[start : start + chunk], self) for start in range(0, features.shape[0], chunk)]
        if not parts:
            return features.new_zeros((0, self.teachers, self.num_classes))
        return torch.cat(parts, dim=1).transpose(0, 1)

    @torch.no_grad()
    def votes(self, embeddings: torch.Tensor) -> torch.Tensor:
        """[Q, N] int64: y_i(x_j), teacher i's class for query j (Step 3, line 15)."""
        return self.logits(embeddings).argmax(dim=2)


def _teacher_logits(features: torch.Tensor, ensemble: TeacherEnsemble) -> torch.Tensor:
    """[N, Q, C]: the same batched product training uses, so scoring matches training exactly."""
    prompted = features.unsqueeze(0) + ensemble.prompts.unsqueeze(1)  # [N, Q, D]
    return torch.baddbmm(ensemble.biases.unsqueeze(1), prompted, ensemble.weights)


@dataclass(frozen=True)
class _GroupLayout:
    """Nodes regrouped as an [N, m] grid (m = the largest group) so all teachers train in one bmm."""

    order: torch.Tensor  # node positions sorted by group
    rows: torch.Tensor  # teacher of each sorted node
    cols: torch.Tensor  # its slot within the teacher's row
    sizes: torch.Tensor  # [N] group sizes
    width: int  # m


def _group_layout(groups: torch.Tensor, teachers: int) -> _GroupLayout:
    if groups.ndim != 1:
        raise ValueError(f"groups must be a vector of teacher indices, got shape {list(groups.shape)}")
    if groups.numel() and (int(groups.min()) < 0 or int(groups.max()) >= teachers):
        raise ValueError(f"teacher indices must lie in 0..{teachers - 1}")
    sizes = torch.bincount(groups, minlength=teachers)
    if bool((sizes == 0).any()):
        raise ValueError(f"teacher {int((sizes == 0).nonzero()[0])} has no training node; every group needs one")
    order = torch.sort(groups, stable=True).indices
    rows = groups[order]
    starts = torch.cumsum(sizes, 0) - sizes
    cols = torch.arange(groups.numel(), device=groups.device) - starts[rows]
    return _GroupLayout(order, rows, cols, sizes, int(sizes.max()))


def _standardisation(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-feature mean and std of the training embeddings (constant features keep scale 1)."""
    mean = features.mean(dim=0)
    std = features.std(dim=0, unbiased=False)
    return mean, torch.where(std > 1e-6, std, torch.ones_like(std))


def _loss_weights(targets: torch.Tensor, present: torch.Tensor, num_classes: int, class_balanced: bool) -> torch.Tensor:
    """[N, m] weight of each slot in its teacher's loss; padding slots get 0.

    Plain: 1/|group|, the mean over the group. Class-balanced: the mean over the classes
    present in the group of each class's mean loss. Row i reads group i's labels only.
    """
    if not class_balanced:
        return present / present.sum(dim=1, keepdim=True)
    counts = torch.zeros((targets.shape[0], num_classes), dtype=present.dtype, device=present.device)
    counts.scatter_add_(1, targets, present)
    classes_present = (counts > 0).sum(dim=1, keepdim=True).to(present.dtype)
    return present / counts.gather(1, targets).clamp(min=1.0) / classes_present


def train_teachers(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    groups: torch.Tensor,
    teachers: int,
    num_classes: int,
    *,
    epochs: int,
    lr: float,
    weight_decay: float,
    generator: torch.Generator,
    class_balanced: bool = False,
) -> TeacherEnsemble:
    """Step 2 (line 9): all N teachers at once, teacher i on the nodes with ``groups == i`` only.

    Teacher i minimises the mean cross-entropy over its own group of
    (x + p_i) W_i + b_i (a GPF-style prompt and a linear head over A's frozen embeddings),
    by full-batch Adam with L2 weight decay. With ``class_balanced`` each node's loss is
    weighted by 1 / (count of its class in the teacher's own group), so a small group of
    an imbalanced task does not vote the majority class everywhere; the weights of
    teacher i come from group i alone. The objective is the sum of the N losses and
    Adam is elementwise, so teacher i's parameters follow exactly the trajectory they would
    follow alone: changing one label changes one teacher (tested bit for bit).
    Deterministic given the generator (it draws the heads' initial weights).
    """
    if epochs < 0 or lr <= 0 or weight_decay < 0:
        raise ValueError(f"need epochs >= 0, lr > 0 and weight_decay >= 0; got {epochs}, {lr}, {weight_decay}")
    features = _flatten(embeddings)
    if labels.shape != (features.shape[0],) or groups.shape != labels.shape:
        raise ValueError(
            f"need one label and one group per embedding: {features.shape[0]} embeddings, "
            f"labels {list(labels.shape)}, groups {list(groups.shape)}"
        )
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}")
    device, dim = features.device, features.shape[1]
    mean, scale = _standardisation(features)
    layout = _group_layout(groups.to(device), teachers)
    grid = features.new_zeros((teachers, layout.width, dim))
    grid[layout.rows, layout.cols] = ((features - mean) / scale)[layout.order]
    targets = torch.zeros((teachers, layout.width), dtype=torch.int64, device=device)
    targets[layout.rows, layout.cols] = labels.to(device, torch.int64)[layout.order]
    present = torch.zeros((teachers, layout.width), dtype=features.dtype, device=device)
    present[layout.rows, layout.cols] = 1.0
    slot_weights = _loss_weights(targets, present, num_classes, class_balanced)
    initial = torch.randn((teachers, dim, num_classes), generator=generator, device=generator.device)
    prompts = torch.zeros((teachers, dim), device=device, requires_grad=True)
    # small random heads break the symmetry between classes; zero prompts start as no-ops
    weights = (initial.to(device) * (0.1 / math.sqrt(dim))).requires_grad_(True)
    biases = torch.zeros((teachers, num_classes), device=device, requires_grad=True)
    optimizer = torch.optim.Adam([prompts, weights, biases], lr=lr, weight_decay=weight_decay)
    for _ in range(epochs):
        logits = torch.baddbmm(biases.unsqueeze(1), grid + prompts.unsqueeze(1), weights)
        losses = F.cross_entropy(logits.reshape(-1, num_classes), targets.reshape(-1), reduction="none")
        # padding slots have weight 0 and contribute exactly nothing to any gradient
        per_teacher = (losses.reshape(teachers, -1) * slot_weights).sum(dim=1)
        optimizer.zero_grad(set_to_none=True)
        per_teacher.sum().backward()
        optimizer.step()
    return TeacherEnsemble(prompts.detach(), weights.detach(), biases.detach(), mean, scale)


# -- step 4: aggregation ---------------------------------------------------------------------


def vote_histogram(votes: torch.Tensor, num_classes: int) -> torch.Tensor:
    """[Q, C] int64 counts c_m(x_j) = Σ_i 1[y_i(x_j) = m] [DP-GPL, Alg. 2, line 18]."""
    if votes.ndim != 2:
        raise ValueError(f"votes must be [Q, N], got shape {list(votes.shape)}")
    counts = torch.zeros((votes.shape[0], num_classes), dtype=torch.int64, device=votes.device)
    return counts.scatter_add_(1, votes.to(torch.int64), torch.ones_like(votes, dtype=torch.int64))


def _check_sigma(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")


def noisy_threshold(
    histogram: torch.Tensor, threshold: float, sigma1: float, generator: torch.Generator
) -> torch.Tensor:
    """Line 19: answered_j = max_m c_m(x_j) + N(0, σ1²) ≥ T, fresh noise per query ([Q] bool)."""
    _check_sigma("sigma1", sigma1)
    counts = _counts(histogram)
    noise = torch.randn(counts.shape[0], generator=generator, device=generator.device, dtype=torch.float64)
    return counts.max(dim=1).values + sigma1 * noise.to(counts.device) >= threshold


def gnmax(histogram: torch.Tensor, sigma2: float, generator: torch.Generator) -> torch.Tensor:
    """Line 20: label_j = argmax_m c_m(x_j) + N(0, σ2²), fresh noise per query and class ([Q] int64)."""
    _check_sigma("sigma2", sigma2)
    counts = _counts(histogram)
    noise = torch.randn(counts.shape, generator=generator, device=generator.device, dtype=torch.float64)
    return (counts + sigma2 * noise.to(counts.device)).argmax(dim=1)


def _counts(histogram: torch.Tensor) -> torch.Tensor:
    if histogram.ndim != 2:
        raise ValueError(f"the histogram must be [Q, C], got shape {list(histogram.shape)}")
    return histogram.to(torch.float64)


def confident_gnmax(
    histogram: torch.Tensor, threshold: float, sigma1: float, sigma2: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 4, lines 19–21: (answered [Q] bool, labels [Q] int64, −1 where unanswered).

    :func:`noisy_threshold`, then :func:`gnmax` for every query, answered or not — which is
    also how each query is charged (:func:`query_event`); unanswered labels are dropped.
    """
    _check_sigma("sigma2", sigma2)
    answered = noisy_threshold(histogram, threshold, sigma1, generator)
    labels = gnmax(histogram, sigma2, generator)
    return answered, torch.where(answered, labels, torch.full_like(labels, -1))


# -- accounting ------------------------------------------------------------------------------


def query_event(sigma1: float | None, sigma2: float) -> dpa.DpEvent:
    """One query, answered or not: Gaussian(σ1 / 1) on the max count, Gaussian(σ2 / √2) on the histogram.

    RDP α/(2σ1²) + α/σ2² (docs/label-privacy.md, eq. P4). ``sigma1=None`` is plain GNMax
    (no threshold step, every query answered): Gaussian(σ2 / √2) alone.
    """
    _check_sigma("sigma2", sigma2)
    histogram_step = dpa.GaussianDpEvent(sigma2 / HISTOGRAM_SENSITIVITY)
    if sigma1 is None:
        return histogram_step
    _check_sigma("sigma1", sigma1)
    return dpa.ComposedDpEvent([dpa.GaussianDpEvent(sigma1 / MAX_COUNT_SENSITIVITY), histogram_step])


def plan_event(sigma1: float | None, sigma2: float, queries: int) -> dpa.DpEvent:
    """Q queries: :func:`query_event` self-composed Q times (eq. P5)."""
    if queries < 0:
        raise ValueError(f"the number of queries must be >= 0, got {queries}")
    return dpa.SelfComposedDpEvent(query_event(sigma1, sigma2), queries)


def calibrate_sigma(
    epsilon: float, delta: float, queries: int, accountant: AccountantName = "pld", *, threshold_step: bool = True
) -> float:
    """The smallest σ = σ1 = σ2 whose :func:`plan_event` meets (ε, δ), via the shared calibration.

    ``threshold_step=False`` calibrates σ2 of plain GNMax (σ1 = None).
    """
    if queries < 1:
        raise ValueError(f"calibration needs at least one query, got {queries}")

    def make_event(z: float) -> dpa.DpEvent:
        return plan_event(z if threshold_step else None, z, queries)

    sigma, _ = calibrate(make_event, epsilon, delta, accountant=accountant)
    return float(sigma)


def default_threshold(teachers: int, num_classes: int = 2) -> float:
    """T = N·(1/C + 0.2·(1 − 1/C)): the plurality must beat the uniform share N/C by a fifth of the rest.

    0.6·N for a binary task, 0.31·N for C = 7 (docs/label-privacy.md, "Choosing T"). Only
    N and C enter, both public, so T is data-independent.
    """
    if num_classes < 2:
        raise ValueError(f"a classification task has at least 2 classes, got {num_classes}")
    uniform = 1.0 / num_classes
    return teachers * (uniform + THRESHOLD_MARGIN * (1.0 - uniform))


# -- the whole of steps 1-4 ------------------------------------------------------------------


@dataclass(frozen=True)
class PateDiagnostics:
    """For B's own eyes only: computed from the labels WITHOUT noise, so not covered by any ε.

    Never send these to A or put them in a status line or run summary.
    """

    groups: torch.Tensor  # [n_train] teacher of each training node
    clean_labels: torch.Tensor  # [Q] the ensemble's plurality vote, no noise
    max_counts: torch.Tensor  # [Q] max_m c_m, no noise
    agreement: float  # fraction of answered queries whose noisy label is the clean plurality (nan if none)


@dataclass(frozen=True)
class PateOutcome:
    """The released result of steps 1–4: which queries were answered, and their noisy labels.

    ``query_ids``, ``answered`` and ``labels`` are outputs of the charged mechanism and may
    leave B (the student's training uses them). ``diagnostics`` may not.
    """

    query_ids: torch.Tensor  # [Q] sorted
    answered: torch.Tensor  # [Q] bool
    labels: torch.Tensor  # [Q] int64, −1 where unanswered
    diagnostics: PateDiagnostics

    @property
    def answered_count(self) -> int:
        return int(self.answered.sum())

    @property
    def training_ids(self) -> torch.Tensor:
        """The student's training nodes: the answered queries."""
        return self.query_ids[self.answered]

    @property
    def training_labels(self) -> torch.Tensor:
        return self.labels[self.answered]

    def note(self) -> str:
        """A summary made of released values only, safe for a status line."""
        return f"pate: {self.answered_count} of {int(self.query_ids.numel())} queries answered"


def label_queries(
    train_ids: torch.Tensor,
    train_embeddings: torch.Tensor,
    train_labels: torch.Tensor,
    query_ids: torch.Tensor,
    query_embeddings: torch.Tensor,
    *,
    num_classes: int,
    teachers: int,
    threshold: float | None,
    sigma1: float | None,
    sigma2: float,
    epochs: int,
    lr: float,
    weight_decay: float,
    generator: torch.Generator,
    class_balanced: bool = False,
) -> PateOutcome:
    """Steps 1–4 of [DP-GPL, Alg. 2] on A's embeddings of B's training nodes and of the Q queries.

    ``threshold`` and ``sigma1`` both None: plain GNMax, every query answered. Call it only
    after charging :func:`plan_event` (σ1, σ2, Q) on B's label ledger: its outputs are the
    release.
    """
    if query_ids.shape[0] != query_embeddings.shape[0]:
        raise ValueError(f"{query_ids.shape[0]} query ids but {query_embeddings.shape[0]} query embeddings")
    if (threshold is None) != (sigma1 is None):
        raise ValueError("give both the threshold T and sigma1 (Confident-GNMax), or neither (plain GNMax)")
    if threshold is not None and threshold < 0:
        raise ValueError(f"the threshold T must be >= 0, got {threshold}")
    groups = partition(train_ids, teachers, generator)
    ensemble = train_teachers(
        train_embeddings, train_labels, groups, teachers, num_classes,
        epochs=epochs, lr=lr, weight_decay=weight_decay, generator=generator, class_balanced=class_balanced,
    )
    histogram = vote_histogram(ensemble.votes(query_embeddings), num_classes)
    if threshold is None or sigma1 is None:
        labels = gnmax(histogram, sigma2, generator)
        answered = torch.ones_like(labels, dtype=torch.bool)
    else:
        answered, labels = confident_gnmax(histogram, threshold, sigma1, sigma2, generator)
    clean = histogram.argmax(dim=1)
    agreement = float((labels[answered] == clean[answered]).double().mean()) if bool(answered.any()) else math.nan
    diagnostics = PateDiagnostics(groups, clean, histogram.max(dim=1).values, agreement)
    return PateOutcome(query_ids, answered.to(query_ids.device), labels.to(query_ids.device), diagnostics)
