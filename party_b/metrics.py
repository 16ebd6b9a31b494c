"""Metrics party B reports: accuracy, and ROC-AUC for binary tasks."""

from __future__ import annotations

import numpy as np
import torch


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(dim=1) == labels).double().mean())


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by the rank statistic (Mann-Whitney U), ties averaged."""
    from scipy.stats import rankdata  # slow to import (docs/performance-notes.md): only when a binary task is evaluated

    labels = np.asarray(labels).astype(bool)
    positives, negatives = int(labels.sum()), int((~labels).sum())
    if positives == 0 or negatives == 0:
        raise ValueError("ROC-AUC needs at least one positive and one negative label")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def metric_name(num_classes: int) -> str:
    return "roc_auc" if num_classes == 2 else "accuracy"


def positive_scores(logits: torch.Tensor) -> np.ndarray:
    """A binary task's score of each node: the probability of class 1."""
    return torch.softmax(logits.double(), dim=1)[:, 1].cpu().numpy()


def compute_metric(name: str, logits: torch.Tensor, labels: torch.Tensor) -> float:
    if name == "accuracy":
        return accuracy(logits, labels)
    if name == "roc_auc":
        return roc_auc(positive_scores(logits), labels.cpu().numpy())
    raise ValueError(f"unknown metric {name!r}")
