"""Dataset files: the two ``.npz`` layouts of ``shared/data/README.md`` and the parties' own.

Each party opens the same kind of file but reads only its own arrays: party A the
edges and features (:func:`load_graph_part`), party B the labels and split masks
(:func:`load_label_part`). ``np.load`` on an ``.npz`` reads arrays lazily, so the
other party's arrays are never loaded into memory.

* ``pitfalls`` (Cora): scipy CSR parts ``adj_*`` and ``attr_*``, ``labels``.
* ``heterophily`` (Tolokers, and vesper's synthetic graphs): ``node_features``,
  ``node_labels``, ``edges`` (each undirected edge once), ``train/val/test_masks``.
* ``graph`` (party A's own store, ``vesper data import --role party-a``, and the aligned
  graph): ``edges`` and ``node_features``, no labels (:func:`write_graph_npz`).
* ``labels`` (party B's aligned label file): ``node_labels`` (-1: a node B holds but has not
  labelled), optional ``class_names`` and ``train/val/test_masks``, no edges or features
  (:func:`write_label_npz`). Only this layout may hold unlabelled nodes.

Party A's graph is built once per file into a memory-mapped cache (common/csr_cache.py).
"""

from __future__ import annotations

import logging
import os
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import numpy as np

from vesper.common.npz_files import NPZ_HEADERS

log = logging.getLogger(__name__)

Layout = Literal["pitfalls", "heterophily", "graph", "labels"]
BUNDLED = ("cora",)
# Published undirected edge counts of the public benchmark graphs (shared/data/README.md): what an
# operator of these datasets may declare as privacy.edge_bound, a public fact of a public graph.
# vesper never counts a party's edges to fill in a public setting.
PUBLISHED_EDGE_COUNTS = {"cora": 5_278, "tolokers": 519_000, "twitch_engb": 35_324}

_PITFALLS_KEYS = {"adj_data", "adj_indices", "adj_indptr", "adj_shape", "attr_data", "attr_indices", "attr_indptr", "attr_shape", "labels"}
_HETEROPHILY_KEYS = {"node_features", "node_labels", "edges"}
_GRAPH_KEYS = {"node_features", "edges"}
_MASK_NAMES = ("train_masks", "val_masks", "test_masks")
UNLABELLED = -1  # the label of a node party B holds but has not labelled (layout "labels" only)


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
    if _GRAPH_KEYS <= keys and "node_labels" not in keys:
        return "graph"
    if "node_labels" in keys and not keys & _GRAPH_KEYS:
        return "labels"
    raise DatasetError(
        f"{path} matches no dataset layout (neither layout of shared/data/README.md, nor party A's graph "
        f"file, nor party B's label file): expected the keys {sorted(_PITFALLS_KEYS)}, "
        f"{sorted(_HETEROPHILY_KEYS)}, {sorted(_GRAPH_KEYS)} (no labels) or ['node_labels'] (no edges or "
        f"features); found {sorted(keys)}"
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

    labels: np.ndarray  # int64 [N]; -1 = unlabelled (layout "labels" only)
    masks: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # bool [splits, N] each
    class_names: tuple[str, ...] | None = None  # class i's name, when the file names them


def open_archive(path: Path) -> tuple[np.lib.npyio.NpzFile, Layout]:
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise DatasetError(f"cannot read {path}: {exc}") from None
    return archive, detect_layout(set(archive.files), path)


def require_graph_layout(layout: Layout, path: Path) -> None:
    """Refuse party B's label file where party A's graph is wanted."""
    if layout == "labels":
        raise DatasetError(
            f"{path} is party B's label file (node_labels, no edges or node_features): party A's dataset must "
            "be a graph file; give party A its own store's graph.npz (vesper data import --role party-a)"
        )


def load_graph_part(path: Path) -> GraphPart:
    archive, layout = open_archive(path)
    require_graph_layout(layout, path)
    with archive, NPZ_HEADERS:  # numpy parses each member's header as it is read
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
    if layout == "graph":
        raise DatasetError(
            f"{path}: party A's graph file has no labels (edges and node_features only): party B's dataset must "
            "be its own label file (node_labels), or a file of a layout with labels"
        )
    class_names = None
    with archive, NPZ_HEADERS:  # numpy parses each member's header as it is read
        if layout == "pitfalls":
            labels = _class_labels(archive["labels"], path)
            masks = None
        else:
            labels = _class_labels(archive["node_labels"], path)
            masks = (
                tuple(np.atleast_2d(archive[n]).astype(bool) for n in _MASK_NAMES)
                if all(n in archive.files for n in _MASK_NAMES)
                else None
            )
            if layout == "labels" and "class_names" in archive.files:
                class_names = tuple(str(name) for name in archive["class_names"].reshape(-1))
    if labels.ndim != 1 or labels.size == 0:
        raise DatasetError(f"{path}: labels must be a non-empty vector")
    lowest = UNLABELLED if layout == "labels" else 0
    if labels.min() < lowest:
        row = int(np.argmax(labels < lowest))
        allowed = "classes 0..C-1, or -1 for a node not labelled" if layout == "labels" else "classes 0..C-1"
        raise DatasetError(f"{path}: label {int(labels[row])} at row {row} is negative: labels are {allowed}")
    if masks is not None and any(m.shape[1] != labels.size for m in masks):
        raise DatasetError(f"{path}: split masks do not match the {labels.size} labels")
    _check_class_names(labels, class_names, str(path))
    if masks is not None:
        check_masks_labelled(labels, masks, str(path))  # type: ignore[arg-type]
    return LabelPart(labels=labels, masks=masks, class_names=class_names)  # type: ignore[arg-type]


def _check_class_names(labels: np.ndarray, class_names: Sequence[str] | None, where: str) -> None:
    if class_names is None:
        return
    if len(set(class_names)) != len(class_names):
        raise DatasetError(f"{where}: class_names repeats a name: {list(class_names)}")
    if labels.size and int(labels.max()) >= len(class_names):
        row = int(np.argmax(labels >= len(class_names)))
        raise DatasetError(
            f"{where}: label {int(labels[row])} at row {row} has no name: class_names names classes "
            f"0..{len(class_names) - 1}"
        )


def check_masks_labelled(
    labels: np.ndarray, masks: tuple[np.ndarray, np.ndarray, np.ndarray], where: str = "the split"
) -> None:
    """Refuse split masks ([splits, N] or [N] each) that put an unlabelled node (label -1) in a split."""
    unlabelled = labels < 0
    if not unlabelled.any():
        return
    for name, mask in zip(("train", "val", "test"), masks):
        both = np.atleast_2d(mask) & unlabelled
        if both.any():
            split, node = (int(i[0]) for i in np.nonzero(both))
            raise DatasetError(
                f"{where}: split {split} puts node {node} in {name}, but node {node} is not labelled (label -1): "
                "only labelled nodes are trained on or evaluated; take it out of the split, or label it"
            )


# writers: party A's graph file and party B's label file, streamed block by block -----------------
_BLOCK_BYTES = 1 << 24  # about this much of an array converted and written at once


def write_graph_npz(path: Path, edges: np.ndarray, features: np.ndarray) -> None:
    """Party A's graph file (layout ``graph``): ``edges`` int64 [M, 2] and ``node_features``
    float32 [N, F], no labels. ``edges`` and ``features`` may be memory-maps: they are read,
    checked (every edge names a node 0..N-1, every feature is finite) and written in blocks of
    about 16 MB, never copied whole. The file is written beside ``path`` and renamed into
    place, uncompressed (``np.savez``'s layout), so the CSR cache memory-maps its members."""
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise DatasetError(f"{path}: edges must have shape [M, 2], got {list(edges.shape)}")
    if features.ndim != 2:
        raise DatasetError(f"{path}: node features must have shape [N, F], got {list(features.shape)}")
    num_nodes = int(features.shape[0])

    def check_edges(block: np.ndarray, start: int) -> None:
        if block.size and (block.min() < 0 or block.max() >= num_nodes):
            row = start + int(np.argmax(((block < 0) | (block >= num_nodes)).any(axis=1)))
            raise DatasetError(f"{path}: edge {row} names a node outside 0..{num_nodes - 1}")

    def check_features(block: np.ndarray, start: int) -> None:
        if not np.isfinite(block).all():
            row = start + int(np.argmax(~np.isfinite(block).all(axis=1)))
            raise DatasetError(f"{path}: node features of node {row} contain NaN or Inf")

    _write_npz(path, {
        "edges": (edges, np.dtype(np.int64), check_edges),
        "node_features": (features, np.dtype(np.float32), check_features),
    })


def write_label_npz(
    path: Path, labels: np.ndarray, class_names: Sequence[str],
    masks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> None:
    """Party B's label file (layout ``labels``): ``node_labels`` int64 [N] (class indices, -1 for a
    node B holds but has not labelled), ``class_names`` (text, no pickle) and, when given, the
    train/val/test ``masks`` ([N] or [1, N] bool each, stored [1, N]; only labelled nodes may be in
    them). Streamed and renamed into place like :func:`write_graph_npz`."""
    if labels.ndim != 1 or labels.size == 0:
        raise DatasetError(f"{path}: labels must be a non-empty vector, got shape {list(labels.shape)}")
    names = [str(name) for name in class_names]
    if len(names) < 2:
        raise DatasetError(f"{path}: a classification task needs at least two class names, got {names}")
    count = len(names)

    def check_labels(block: np.ndarray, start: int) -> None:
        bad = (block < UNLABELLED) | (block >= count)
        if bad.any():
            row = start + int(np.argmax(bad))
            raise DatasetError(f"{path}: label {int(block[row - start])} of node {row} is outside -1..{count - 1}")

    members: dict[str, tuple[np.ndarray, np.dtype, Callable[[np.ndarray, int], None] | None]] = {
        "node_labels": (labels, np.dtype(np.int64), check_labels),
        "class_names": (np.array(names, dtype=str), np.array(names, dtype=str).dtype, None),
    }
    if masks is not None:
        shaped = tuple(np.atleast_2d(m) for m in masks)
        if any(m.shape[1] != labels.size for m in shaped):
            raise DatasetError(f"{path}: split masks do not match the {labels.size} labels")
        check_masks_labelled(np.asarray(labels), shaped, str(path))  # type: ignore[arg-type]
        members.update({name: (m, np.dtype(bool), None) for name, m in zip(_MASK_NAMES, shaped)})
    _write_npz(path, members)


def _write_npz(
    path: Path, members: dict[str, tuple[np.ndarray, np.dtype, Callable[[np.ndarray, int], None] | None]],
) -> None:
    """An uncompressed ``.npz`` of ``members`` (name -> array, dtype, check of each block of rows and
    its first row), each array converted and written block by block; renamed into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
            for name, (array, dtype, check) in members.items():
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    _write_npy_member(member, array, dtype, check)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_npy_member(
    member: IO[bytes], array: np.ndarray, dtype: np.dtype, check: Callable[[np.ndarray, int], None] | None,
) -> None:
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(array.shape)}
    np.lib.format.write_array_header_1_0(member, header)
    row_bytes = max(1, int(np.prod(array.shape[1:], dtype=np.int64)) * dtype.itemsize)
    rows = max(1, _BLOCK_BYTES // row_bytes)
    for start in range(0, int(array.shape[0]) if array.ndim else 0, rows):
        block = np.ascontiguousarray(array[start : start + rows], dtype=dtype)
        if check is not None:
            check(block, start)
        member.write(block.reshape(-1).view(np.uint8))
