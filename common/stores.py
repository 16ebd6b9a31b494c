"""Where a party keeps its imported data and the aligned datasets made from it.

* A **store** is a directory ``vesper data import`` wrote from an institution's own files:
  party A's holds ``graph.npz`` and ``nodes.parquet`` (its keys), party B's
  ``labels.parquet`` and ``classes.json`` (docs/data-import.md). A service names its stores
  in its ``[datasets]`` table, like any dataset.
* An **aligned dataset** is what ``vesper align`` leaves at each party, in
  ``<workdir>/alignments/<id>/``: party A's graph with the shared index's nodes first
  (``graph.npz``), party B's labels over the shared index (``labels.npz``), each with an
  ``alignment.json`` (docs/alignment.md). Training and prediction runs name it by its id.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from vesper.common.dataset_files import DatasetNotFound

ALIGNMENTS = "alignments"
ALIGNMENT_FILE = "alignment.json"
ALIGNMENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
GRAPH_FILE = "graph.npz"  # party A's, in a store and in an aligned dataset
LABEL_FILE = "labels.npz"  # party B's, in an aligned dataset


def resolve_store(name: str, aliases: dict[str, str], marker: str, role: str) -> Path:
    """The store directory a ``[datasets]`` entry (or a path) names; it must hold ``marker``."""
    path = Path(aliases.get(name, name)).expanduser()
    if not (path / marker).is_file():
        known = ", ".join(sorted(aliases)) or "none"
        raise DatasetNotFound(
            f"{role}: {name!r} names no store of `vesper data import --role {role}` (no {path / marker}); "
            f"this party's datasets: {known}"
        )
    return path


def check_alignment_id(alignment_id: str) -> str:
    if not ALIGNMENT_ID.fullmatch(alignment_id):
        raise ValueError(
            f"alignment id {alignment_id!r} must be 1 to 64 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return alignment_id


def alignment_dir(workdir: Path, alignment_id: str) -> Path:
    return workdir / ALIGNMENTS / check_alignment_id(alignment_id)


def aligned_datasets(workdir: Path, filename: str) -> dict[str, str]:
    """Every aligned dataset in ``workdir`` whose ``filename`` exists, as ``[datasets]`` entries."""
    root = workdir / ALIGNMENTS
    if not root.is_dir():
        return {}
    return {
        entry.name: str(entry / filename)
        for entry in sorted(root.iterdir())
        if (entry / filename).is_file() and (entry / ALIGNMENT_FILE).is_file()
    }


def shared_size(dataset_file: Path) -> int | None:
    """K of an aligned dataset's file (the shared index is 0 .. K-1), None for a dataset that is not aligned."""
    meta = dataset_file.parent / ALIGNMENT_FILE
    if dataset_file.name not in (GRAPH_FILE, LABEL_FILE) or not meta.is_file():
        return None
    return int(json.loads(meta.read_text())["size"])
