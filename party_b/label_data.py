"""Party B's data: the labels and the split, and nothing of party A's graph."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vesper.common.config import DEFAULT_MAX_CLASSES
from vesper.common.dataset_files import DatasetError, load_label_part
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


def load_labels(
    path: Path, split_seed: int, label_independent: bool = False, max_classes: int = DEFAULT_MAX_CLASSES
) -> LabelStore:
    """B's labels and split; ``label_independent`` when B protects its labels (common/splits.py).

    At most ``max_classes`` classes (``party_b.max_classes``): the decoder's output layer has one
    row per class, so a stray label value of 1e9 would ask for a 256 GB matrix. A label outside
    0..max_classes-1 is refused here, with its row.
    """
    part = load_label_part(path)
    too_large = part.labels >= max_classes
    if too_large.any():
        row = int(too_large.argmax())
        raise DatasetError(
            f"{path}: label {int(part.labels[row])} at row {row} is outside 0..{max_classes - 1}: party B handles at most "
            f"{max_classes} classes (party_b.max_classes); number the classes 0..C-1, or raise the setting"
        )
    labels = torch.from_numpy(part.labels)
    num_classes = int(labels.max()) + 1
    if num_classes < 2:
        raise ValueError(f"{path}: a classification task needs at least two classes")
    return LabelStore(labels, split_for(part, split_seed, label_independent=label_independent), num_classes, metric_name(num_classes))
