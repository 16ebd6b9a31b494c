"""Party B's data: the labels and the split, and nothing of party A's graph."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vesper.common.dataset_files import load_label_part
from vesper.common.splits import Split, split_for
from vesper.party_b.metrics import metric_name


@dataclass(frozen=True)
class LabelStore:
    labels: torch.Tensor  # int64 [N]
    split: Split
    num_classes: int
    metric: str

    @property
    def num_nodes(self) -> int:
        return int(self.labels.numel())


def load_labels(path: Path, split_seed: int, label_independent: bool = False) -> LabelStore:
    """B's labels and split; ``label_independent`` when B protects its labels (common/splits.py)."""
    part = load_label_part(path)
    labels = torch.from_numpy(part.labels)
    num_classes = int(labels.max()) + 1
    if num_classes < 2:
        raise ValueError(f"{path}: a classification task needs at least two classes")
    return LabelStore(labels, split_for(part, split_seed, label_independent=label_independent), num_classes, metric_name(num_classes))
