"""Party B's data: the labels and the split, and nothing of party A's graph.

Party B's own label files (layout ``labels``, common/dataset_files.py) name their classes and
may hold unlabelled nodes (label -1: customers B holds but has not labelled); those are in no
split, so they are never trained on or evaluated.
"""

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
    labels: torch.Tensor  # int64 [N]; -1 = not labelled (in no split)
    split: Split
    num_classes: int
    metric: str
    names: tuple[str, ...] = ()  # class i's name, when B's file names its classes

    @property
    def class_names(self) -> tuple[str, ...]:
        """Class i's name: the file's, else the class number as text (built when asked: the class
        bound is a setting, and a file numbering a billion classes must still load)."""
        return self.names or tuple(str(i) for i in range(self.num_classes))

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
    if part.class_names is not None and len(part.class_names) > max_classes:
        raise DatasetError(
            f"{path}: the file names {len(part.class_names)} classes: party B handles at most {max_classes} "
            "(party_b.max_classes); raise the setting"
        )
    labels = torch.from_numpy(part.labels)
    num_classes = len(part.class_names) if part.class_names is not None else int(labels.max()) + 1
    if num_classes < 2:
        raise ValueError(f"{path}: a classification task needs at least two classes")
    if not (part.labels >= 0).any():
        raise DatasetError(f"{path}: no node is labelled (every label is -1): party B needs labelled nodes to train")
    split = split_for(part, split_seed, label_independent=label_independent)
    return LabelStore(labels, split, num_classes, metric_name(num_classes), part.class_names or ())
