"""Train/validation/test splits of labelled nodes, made by party B.

A file's own masks are used when it has them (split 0 unless told otherwise);
otherwise a stratified split with a fixed, recorded seed. Only labelled nodes are ever in a
split: a node party B holds but has not labelled (label -1, party B's own label files) is
left out of the split B makes, and a file whose masks put one in a split is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vesper.common.dataset_files import LabelPart, check_masks_labelled

FRACTIONS = (0.5, 0.25, 0.25)


@dataclass(frozen=True)
class Split:
    train: np.ndarray  # sorted int64 node ids
    val: np.ndarray
    test: np.ndarray
    description: str


def stratified_split(labels: np.ndarray, seed: int, fractions: tuple[float, float, float] = FRACTIONS) -> Split:
    """Per class, a seeded permutation cut into train/val/test by ``fractions`` (unlabelled nodes,
    label -1, are in no class and no split)."""
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[], [], []]
    for cls in np.unique(labels[labels >= 0]):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_train = int(round(fractions[0] * members.size))
        n_val = int(round(fractions[1] * members.size))
        parts[0].append(members[:n_train])
        parts[1].append(members[n_train : n_train + n_val])
        parts[2].append(members[n_train + n_val :])
    train, val, test = (np.sort(np.concatenate(p)).astype(np.int64) for p in parts)
    shares = "/".join(str(round(100 * f)) for f in fractions)
    return Split(train, val, test, f"stratified {shares}, seed {seed}")


def random_split(
    num_nodes: int, seed: int, fractions: tuple[float, float, float] = FRACTIONS, nodes: np.ndarray | None = None,
) -> Split:
    """One seeded permutation of all nodes (or of ``nodes``: the labelled ones) cut by ``fractions``:
    it never reads a label's value.

    Under label privacy the split is sent to party A (every batch names its roots), so
    it must not depend on the labels it protects; a stratified split would. Which nodes B has
    labelled is not hidden from A: only they are roots.
    """
    rng = np.random.default_rng(seed)
    members = rng.permutation(num_nodes) if nodes is None else rng.permutation(nodes)
    n_train = int(round(fractions[0] * members.size))
    n_val = int(round(fractions[1] * members.size))
    train, val, test = (
        np.sort(part).astype(np.int64)
        for part in (members[:n_train], members[n_train : n_train + n_val], members[n_train + n_val :])
    )
    shares = "/".join(str(round(100 * f)) for f in fractions)
    among = "" if nodes is None else f" of the {members.size} labelled nodes"
    return Split(train, val, test, f"random {shares}{among} (label-independent), seed {seed}")


def split_for(part: LabelPart, seed: int, index: int = 0, label_independent: bool = False) -> Split:
    """The file's own split if it has one (public), else a seeded split made by B.

    ``label_independent``: B protects its labels, so a split it makes must not read them.
    """
    if part.masks is None:
        if label_independent:
            labelled = part.labels >= 0
            nodes = None if labelled.all() else np.flatnonzero(labelled)
            return random_split(part.labels.size, seed, nodes=nodes)
        return stratified_split(part.labels, seed)
    check_masks_labelled(part.labels, part.masks)
    train_m, val_m, test_m = (m[index] for m in part.masks)
    return Split(
        np.flatnonzero(train_m).astype(np.int64),
        np.flatnonzero(val_m).astype(np.int64),
        np.flatnonzero(test_m).astype(np.int64),
        f"the file's split {index}",
    )
