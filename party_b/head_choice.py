"""Which of the FallbackDecoder's heads B keeps (docs/privacy.md, section 2.5).

The edge-free head is the MLP baseline's decoder, so keeping it costs nothing against the MLP.
Taking whichever of three heads scores best on B's validation nodes picks, when the heads are
about level, the one that led by chance, and it then scores lower on test (the winner's curse;
docs/utility.md, section 10). So B keeps the edge-free head unless the best other head leads it
on the validation nodes by more than ``z`` standard errors of the paired difference over those
same nodes:

    Δ = M(h) − M(edge-free) > z · SE(Δ),

with SE(Δ) the sample standard deviation of the per-node correctness difference over √n for
accuracy, and DeLong's paired variance for ROC-AUC [DDC88]. Both heads scored the same nodes,
so the paired SE is far smaller than either metric's own noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from vesper.party_b.metrics import positive_scores

# z of the rule above: a lead of one standard error. The choice of z is measured in
# docs/utility.md, section 10 (every head of GAP's runs on every development graph and ε).
MARGIN_Z = 1.0
BASE_HEAD = "edge-free"


@dataclass(frozen=True)
class HeadChoice:
    """The head B keeps; the best other head by validation (the rival), its lead over the
    edge-free head there, and each other head's SE of that difference."""

    head: str
    rival: str
    lead: float
    errors: dict[str, float]

    @property
    def standard_error(self) -> float:
        """The rival's."""
        return self.errors[self.rival]


def accuracy_difference_se(truth: torch.Tensor, base: torch.Tensor, other: torch.Tensor) -> float:
    """SE of acc(other) − acc(base) over the same n nodes: sd(c_other − c_base) / √n."""
    difference = (other.argmax(1) == truth).double() - (base.argmax(1) == truth).double()
    if difference.numel() < 2:
        return math.inf
    return float(difference.std(correction=1) / math.sqrt(difference.numel()))


def _placements(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeLong's structural components [DDC88]: V10_i, the share of negatives a positive i
    outranks, and V01_j, the share of positives that outrank a negative j (ties count half)."""
    from scipy.stats import rankdata

    overall = rankdata(scores)
    among_positives, among_negatives = rankdata(scores[positive]), rankdata(scores[~positive])
    m, n = int(positive.sum()), int((~positive).sum())
    v10 = (overall[positive] - among_positives) / n
    v01 = 1.0 - (overall[~positive] - among_negatives) / m
    return v10, v01


def auc_difference_se(truth: torch.Tensor, base: torch.Tensor, other: torch.Tensor) -> float:
    """SE of AUC(other) − AUC(base) over the same nodes, by DeLong's paired variance [DDC88]:
    Var = Var(V10_other − V10_base) / m + Var(V01_other − V01_base) / n."""
    positive = truth.cpu().numpy().astype(bool)
    m, n = int(positive.sum()), int((~positive).sum())
    if m < 2 or n < 2:
        return math.inf
    base10, base01 = _placements(positive_scores(base), positive)
    other10, other01 = _placements(positive_scores(other), positive)
    variance = np.var(other10 - base10, ddof=1) / m + np.var(other01 - base01, ddof=1) / n
    return float(math.sqrt(variance))


def difference_se(metric: str, truth: torch.Tensor, base: torch.Tensor, other: torch.Tensor) -> float:
    """SE of metric(other) − metric(base), paired over the same nodes."""
    if metric == "accuracy":
        return accuracy_difference_se(truth, base, other)
    if metric == "roc_auc":
        return auc_difference_se(truth, base, other)
    raise ValueError(f"unknown metric {metric!r}")


def choose_head(
    metric: str, truth: torch.Tensor, logits: dict[str, torch.Tensor], validation: dict[str, float],
    z: float = MARGIN_Z,
) -> HeadChoice:
    """The head B keeps: the edge-free head, unless the best other head by validation leads it
    by more than ``z`` SE (module docstring). ``logits``: each head's on the validation nodes,
    whose labels are ``truth``; ``validation``: each head's metric there."""
    rivals = [head for head in logits if head != BASE_HEAD]
    rival = max(rivals, key=lambda head: (validation[head], -rivals.index(head)))
    lead = validation[rival] - validation[BASE_HEAD]
    errors = {head: difference_se(metric, truth, logits[BASE_HEAD], logits[head]) for head in rivals}
    head = rival if lead > z * errors[rival] else BASE_HEAD
    return HeadChoice(head=head, rival=rival, lead=lead, errors=errors)
