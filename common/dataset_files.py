"""Dataset files in the two ``.npz`` layouts of ``shared/data/README.md``.

Each party opens the same kind of file but reads only its own arrays: party A the
edges and features (:func:`load_graph_part`), party B the labels and split masks
(:func:`load_label_part`). ``np.load`` on an ``.npz`` reads arrays lazily, so the
other party's arrays are never loaded into memory.

* ``pitfalls`` (Cora): scipy CSR parts ``adj_*`` and ``attr_*``, ``labels``.
* ``heterophily`` (Tolokers, and vesper's synthetic graphs): ``node_features``,
  ``node_labels``, ``edges`` (each undirected edge once), ``train/val/test_masks``.

Party A's graph is built once per file into a memory-mapped cache (common/csr_cache.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

log = logging.getLogger(__name__)

Layout = Literal["pitfalls", "heterophily"]
BUNDLED = ("cora",)
# Published undirected edge counts of the public benchmark graphs (shared/data/README.md): what an
# operator of these datasets may declare as privacy.edge_bound, a public fact of a public graph.
# vesper never counts a party's edges to fill in a public setting.
PUBLISHED_EDGE_COUNTS = {"cora": 5_278, "tolokers": 519_000, "twitch_engb": 35_324}

_PITFALLS_KEYS = {"adj_data", "adj_indices", "adj_indptr", "adj_shape", "attr_data", "attr_indices", "attr_indptr", "attr_shape", "labels"}
_HETEROPHILY_KEYS = {"node_features", "node_labels", "edges"}


class DatasetError(ValueError):
    """A dataset name or file cannot be used; the text says why."""


class DatasetNotFound(DatasetError):
    """The dataset names no file this party has (services answer NOT_FOUND; other
    DatasetErrors are about a file's contents)."""


def bundled_path(name: str) -> Path:
    return Path(__file__).resolve().parent / "bundled" / f"{name}.npz"


def resolve_dataset(name_or_path: str, aliases: dict[str, str] | None = None) -> Path:
    """A party's file for a dataset: its own ``[datasets]`` entry, a bundled name, or a path."""
    aliases = aliases or {}
    if name_or_path in aliases:
        path = Path(aliases[name_or_path]).expanduser()
    elif name_or_path in BUNDLED:
        path = bundled_path(name_or_path)
    else:
        try:
            path = Path(name_or_path).expanduser()
        except RuntimeError:  # "~someone" and there is no such user
            raise DatasetNotFound(f"unknown dataset {name_or_path!r}: no such home directory") from None
    if not path.is_file():
        known = ", ".join(sorted(set(BUNDLED) | set(aliases)))
        raise DatasetNotFound(
            f"unknown dataset {name_or_path!r}: not a file, and not one of this party's "
            f"datasets ({known})"
        )
    if path.suffix != ".npz":
        raise DatasetNotFound(f"dataset file {path} is not an .npz file")
    return path


def detect_layout(keys: set[str], path: Path) -> Layout:
    if _PITFALLS_KEYS <= keys:
        return "pitfalls"
    if _HETEROPHILY_KEYS <= keys:
        return "heterophily"
    raise DatasetError(
        f"{path} has neither layout: expected the keys {sorted(_PITFALLS_KEYS)} "
        f"or {sorted(_HETEROPHILY_KEYS)}; found {sorted(keys)}"
    )


def _csr_to_dense(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape: np.ndarray) -> np.ndarray:
    rows, cols = int(shape[0]), int(shape[1])
    dense = np.zeros((rows, cols), dtype=np.float32)
    row_of = np.repeat(np.arange(rows), np.diff(indptr))
    dense[row_of, indices] = data
    return dense


@dataclass(frozen=True)
class GraphPart:
    """Party A's arrays: raw edges (possibly directed, duplicated or with self-loops)."""

    num_nodes: int
    edges: np.ndarray  # int64 [M, 2]
    features: np.ndarray  # float32 [N, F]


@dataclass(frozen=True)
class LabelPart:
    """Party B's arrays: labels, and the split masks when the file has them."""

    labels: np.ndarray  # int64 [N]
    masks: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # bool [splits, N] each


def open_archive(path: Path) -> tuple[np.lib.npyio.NpzFile, Layout]:
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    return archive, detect_layout(set(archive.files), path)


def load_graph_part(path: Path) -> GraphPart:
    archive, layout = open_archive(path)
    with archive:
        if layout == "pitfalls":
            shape = archive["adj_shape"]
            indptr = archive["adj_indptr"].astype(np.int64)
            sources = np.repeat(np.arange(int(shape[0]), dtype=np.int64), np.diff(indptr))
            edges = np.stack([sources, archive["adj_indices"].astype(np.int64)], axis=1)
            features = _csr_to_dense(
                archive["attr_data"], archive["attr_indices"], archive["attr_indptr"], archive["attr_shape"]
            )
        else:
            edges = archive["edges"].astype(np.int64, copy=False)
            features = archive["node_features"].astype(np.float32, copy=False)
    num_nodes = features.shape[0]
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise DatasetError(f"{path}: edges must have shape [M, 2], got {list(edges.shape)}")
    if edges.size and (edges.min() < 0 or edges.max() >= num_nodes):
        raise DatasetError(f"{path}: an edge names a node outside 0..{num_nodes - 1}")
    if not np.isfinite(features).all():
        raise DatasetError(f"{path}: node features contain NaN or Inf")
    return GraphPart(num_nodes=num_nodes, edges=edges, features=features)


def _class_labels(raw: np.ndarray, path: Path) -> np.ndarray:
    """Labels as int64 classes; a NaN, an infinity or a fraction is named with its row, never cast."""
    if raw.dtype.kind == "f":
        bad = ~np.isfinite(raw)
        if bad.any():
            row = int(np.argmax(bad))
            raise DatasetError(f"{path}: label at row {row} is {raw[row]}: every labelled node needs a class 0..C-1")
        fractional = raw != np.round(raw)
        if fractional.any():
            row = int(np.argmax(fractional))
            raise DatasetError(f"{path}: label at row {row} is {raw[row]}, not a whole number: labels are classes 0..C-1")
    elif raw.dtype.kind not in "iub":
        raise DatasetError(f"{path}: labels are {raw.dtype}, not class numbers 0..C-1")
    return raw.astype(np.int64)


def load_label_part(path: Path) -> LabelPart:
    archive, layout = open_archive(path)
    with archive:
        if layout == "pitfalls":
            labels = _class_labels(archive["labels"], path)
            masks = None
        else:
            labels = _class_labels(archive["node_labels"], path)
            names = ("train_masks", "val_masks", "test_masks")
            masks = (
                tuple(np.atleast_2d(archive[n]).astype(bool) for n in names)
                if all(n in archive.files for n in names)
                else None
            )
    if labels.ndim != 1 or labels.size == 0:
        raise DatasetError(f"{path}: labels must be a non-empty vector")
    if labels.min() < 0:
        row = int(np.argmax(labels < 0))
        raise DatasetError(f"{path}: label {int(labels[row])} at row {row} is negative: labels are classes 0..C-1")
    if masks is not None and any(m.shape[1] != labels.size for m in masks):
        raise DatasetError(f"{path}: split masks do not match the {labels.size} labels")
    return LabelPart(labels=labels, masks=masks)  # type: ignore[arg-type]
