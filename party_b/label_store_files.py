"""The files of party B's label store, the directory ``vesper data import --role party-b`` writes.

* ``labels.parquet``: ``key`` (text), ``label`` (int32 class index, -1 = a key B holds but has
  not labelled, a customer B wants scored), ``split`` (int8: 0 train, 1 val, 2 test,
  -1 unspecified), one row per key of B's file, in its order.
* ``classes.json``: ``{"classes": [names in index order]}``.
* ``import-report.json``: what the import read (local to B, never sent).

Everything here stays at party B.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vesper.common.dataset_files import DatasetError

LABELS_FILE = "labels.parquet"
CLASSES_FILE = "classes.json"
REPORT_FILE = "import-report.json"
SPLIT_NAMES = ("train", "val", "test")  # split codes 0, 1, 2; -1 = unspecified
UNSPECIFIED = -1


def write_label_table(
    store_dir: Path, keys: pa.Array, labels: np.ndarray, splits: np.ndarray, class_names: list[str],
) -> None:
    table = pa.table({
        "key": keys,
        "label": pa.array(labels.astype(np.int32, copy=False)),
        "split": pa.array(splits.astype(np.int8, copy=False)),
    })
    pq.write_table(table, Path(store_dir) / LABELS_FILE)
    (Path(store_dir) / CLASSES_FILE).write_text(json.dumps({"classes": class_names}, indent=2) + "\n")


def read_label_table(store_dir: Path) -> tuple[pa.Array, np.ndarray, np.ndarray, list[str]]:
    """(keys (text), labels int32 (-1 unlabelled), splits int8 (-1 unspecified), class names in
    index order) of party B's label store."""
    store_dir = Path(store_dir)
    path, classes_path = store_dir / LABELS_FILE, store_dir / CLASSES_FILE
    for needed in (path, classes_path):
        if not needed.is_file():
            raise DatasetError(
                f"{needed}: no such file: {store_dir} is not party B's label store; "
                "`vesper data import --role party-b` writes one"
            )
    try:
        table = pq.read_table(path, columns=["key", "label", "split"])
        class_names = json.loads(classes_path.read_text())["classes"]
    except (pa.ArrowInvalid, OSError, KeyError, ValueError, TypeError) as exc:
        raise DatasetError(f"cannot read the label store {store_dir} ({exc}): import the labels again") from None
    if not isinstance(class_names, list) or not all(isinstance(name, str) for name in class_names):
        raise DatasetError(f"{classes_path}: 'classes' must be a list of names: import the labels again")
    keys = table.column("key").combine_chunks().cast(pa.string())
    labels = table.column("label").to_numpy().astype(np.int32, copy=False)
    splits = table.column("split").to_numpy().astype(np.int8, copy=False)
    if labels.size and (labels.min() < -1 or labels.max() >= len(class_names)):
        raise DatasetError(f"{path}: a label lies outside -1..{len(class_names) - 1}: import the labels again")
    return keys, labels, splits, class_names
