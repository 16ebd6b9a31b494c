"""The files of party A's graph store, the directory ``vesper data import --role party-a`` writes.

* ``graph.npz``: layout ``graph`` (common/dataset_files.py): ``edges`` int64 [M, 2], each
  undirected edge once as (u, v) with u < v, and ``node_features`` float32 [N, F]. No labels.
* ``nodes.parquet``: one column ``key`` (text); row i is node i's key in A's own files.
* ``import-report.json``: what the import read and dropped (local to A, never sent).

Everything here stays at party A.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from vesper.common.dataset_files import DatasetError

GRAPH_FILE = "graph.npz"
NODES_FILE = "nodes.parquet"
REPORT_FILE = "import-report.json"
KEY_COLUMN = "key"


def graph_file(store_dir: Path) -> Path:
    """The store's ``graph.npz``: the dataset file party A's ``[datasets]`` entry names."""
    return Path(store_dir) / GRAPH_FILE


def write_node_keys(path: Path, keys: pa.Array) -> None:
    pq.write_table(pa.table({KEY_COLUMN: keys}), path)


def read_node_keys(store_dir: Path) -> pa.Array:
    """Node i's key at index i (text), from the store's ``nodes.parquet``."""
    path = Path(store_dir) / NODES_FILE
    if not path.is_file():
        raise DatasetError(
            f"{path}: no such file: {store_dir} is not party A's graph store; "
            "`vesper data import --role party-a` writes one"
        )
    try:
        table = pq.read_table(path, columns=[KEY_COLUMN])
    except (pa.ArrowInvalid, OSError, KeyError) as exc:
        raise DatasetError(f"cannot read {path} ({exc}): import the graph again") from None
    keys = table.column(KEY_COLUMN).combine_chunks()
    return keys if keys.type == pa.string() else keys.cast(pa.string())
