"""Party A's import: its own edge and feature tables (CSV or Parquet) into its graph store.

``vesper data import --role party-a --edges FILE --features FILE --out DIR``. Node i is the
i-th row of the features file (its key column and every other column, each a number); an edge
names two keys of that file. Both files are read in batches (common/tabular.py), never whole:

1. the features: keys collected (text), values checked (finite numbers) and appended to a
   float32 file, batch by batch; a repeated key is refused naming both rows;
2. the edges: each batch's keys mapped to node indices by ``pyarrow.compute.index_in``
   (vectorised: no Python object per edge), self-loops dropped and counted, each edge packed
   as ``min * N + max`` (int64) and appended to a file;
3. the packed edges sorted and de-duplicated in memory (8 bytes per edge: 80 MB for 10M), so
   each undirected edge is kept once whichever way round and however often it was listed;
4. the store written (party_a/graph_store_files.py) from memory-maps, and renamed into place
   (common/store_directory.py): a failed import writes nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from vesper.common.dataset_files import write_graph_npz
from vesper.common.store_directory import staged_directory, write_report
from vesper.common.tabular import (
    InputFileError,
    column_names,
    duplicate_rows,
    first_true,
    numeric_column,
    read_batches,
    require_columns,
)
from vesper.party_a.graph_store_files import (  # noqa: F401 (read_node_keys: the store's reader, re-exported)
    GRAPH_FILE,
    NODES_FILE,
    REPORT_FILE,
    read_node_keys,
    write_node_keys,
)

FEATURE_BATCH_BYTES = 1 << 26  # about 64 MB of float64 feature values per batch
EDGE_BATCH_ROWS = 1 << 20  # edge rows per Parquet batch (a CSV's batch is 16 MB of text)
_UNIQUE_BLOCK = 1 << 21  # unique edges unpacked and written at once


class GraphImportReport(BaseModel):
    """What ``import_graph`` read and wrote; kept as ``import-report.json``, local to party A."""

    model_config = ConfigDict(extra="forbid")

    edges_file: str
    features_file: str
    store: str
    key_column: str
    src_column: str
    dst_column: str
    nodes: int
    feature_columns: list[str]
    edge_rows_read: int = Field(description="data rows of the edges file")
    self_loops_dropped: int
    duplicate_edges_dropped: int = Field(description="repeats of an edge kept once, in either orientation")
    edges_kept: int = Field(description="undirected edges in graph.npz, each once as (u, v) with u < v")
    seconds: float


def import_graph(
    edges: Path, features: Path, out: Path, *, src: str = "src", dst: str = "dst", key: str = "id",
) -> GraphImportReport:
    """Import party A's edges and features into a new graph store ``out`` (refused if it exists and
    is not empty). Raises :class:`InputFileError` naming the file, row and column of bad input."""
    started = time.perf_counter()
    edges, features, out = Path(edges), Path(features), Path(out)
    if src == dst:
        raise InputFileError(edges, f"--src and --dst both name {src!r}", "name the two end columns of an edge",
                             where="the header", column=src)
    require_columns(edges, column_names(edges), {src: "--src", dst: "--dst"})
    with staged_directory(out) as stage:
        keys, feature_columns, node_features = _read_features(features, key, stage / "features.raw")
        rows, loops = _read_edges(edges, src, dst, keys, features, stage / "edges.raw")
        unique = _unique_edges(stage / "edges.raw", len(keys), stage / "edges.npy")
        write_graph_npz(stage / GRAPH_FILE, unique, node_features)
        kept = int(unique.shape[0])
        del unique, node_features  # unmap before the temporary files go
        for temporary in ("features.raw", "edges.raw", "edges.npy"):
            (stage / temporary).unlink(missing_ok=True)
        write_node_keys(stage / NODES_FILE, keys)
        report = GraphImportReport(
            edges_file=str(edges), features_file=str(features), store=str(out), key_column=key, src_column=src,
            dst_column=dst, nodes=len(keys), feature_columns=feature_columns, edge_rows_read=rows,
            self_loops_dropped=loops, duplicate_edges_dropped=rows - loops - kept, edges_kept=kept,
            seconds=round(time.perf_counter() - started, 3),
        )
        write_report(stage / REPORT_FILE, report)
    return report


def _read_features(path: Path, key: str, raw: Path) -> tuple[pa.Array, list[str], np.ndarray]:
    """(node keys, feature column names, features float32 [N, F] memory-mapped from ``raw``)."""
    found = column_names(path)
    require_columns(path, found, {key: "--key"})
    columns = [c for c in found if c != key]
    if not columns:
        raise InputFileError(path, "the file has its key column and no feature column",
                             "add the nodes' features as numeric columns beside the key", where="the header")
    key_chunks = []
    batch_rows = max(1, FEATURE_BATCH_BYTES // (8 * len(columns)))
    with open(raw, "wb") as handle:
        for batch in read_batches(path, [key, *columns], key_columns=[key], batch_rows=batch_rows):
            block = np.empty((batch.rows, len(columns)), dtype=np.float32)
            for j, column in enumerate(columns):
                block[:, j] = numeric_column(batch, column, path)
            block.tofile(handle)
            key_chunks.append(batch.columns[key])
    keys = pa.concat_arrays(key_chunks)
    repeated = duplicate_rows(keys)
    if repeated is not None:
        first, again = repeated
        raise InputFileError(path, f"the key {keys[again].as_py()!r} repeats row {first + 1}",
                             "give each node one row of features", row=again + 1, column=key)
    features = np.memmap(raw, dtype=np.float32, mode="r", shape=(len(keys), len(columns)))
    return keys, columns, features


def _read_edges(path: Path, src: str, dst: str, keys: pa.Array, features: Path, raw: Path) -> tuple[int, int]:
    """Append every edge as ``min * N + max`` (int64) to ``raw``; (rows read, self-loops dropped)."""
    n = len(keys)
    rows = loops = 0
    with open(raw, "wb") as handle:
        for batch in read_batches(path, [src, dst], key_columns=[src, dst], batch_rows=EDGE_BATCH_ROWS):
            both = pa.concat_arrays([batch.columns[src], batch.columns[dst]])
            index = pc.index_in(both, value_set=keys)
            if index.null_count:
                at = first_true(index.is_null())
                raise InputFileError(
                    path, f"the key {both[at].as_py()!r} has no row in the features file {features}",
                    "add the node's features to the features file, or drop the edge",
                    row=batch.row(at % batch.rows), column=src if at < batch.rows else dst,
                )
            ends = index.to_numpy(zero_copy_only=False).astype(np.int64)
            u, v = np.minimum(ends[: batch.rows], ends[batch.rows :]), np.maximum(ends[: batch.rows], ends[batch.rows :])
            keep = u != v
            rows += batch.rows
            loops += batch.rows - int(keep.sum())
            (u[keep] * n + v[keep]).tofile(handle)
    return rows, loops


def _unique_edges(raw: Path, num_nodes: int, out: Path) -> np.ndarray:
    """The distinct packed edges of ``raw``, sorted, unpacked into ``out`` (``.npy`` int64 [M, 2]);
    returned memory-mapped."""
    packed = np.fromfile(raw, dtype=np.int64)
    packed.sort()
    if packed.size > 1:
        fresh = np.empty(packed.size, dtype=bool)
        fresh[0] = True
        np.not_equal(packed[1:], packed[:-1], out=fresh[1:])
        packed = packed[fresh]
        del fresh
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.int64)), "fortran_order": False,
              "shape": (int(packed.size), 2)}
    with open(out, "wb") as handle:
        np.lib.format.write_array_header_1_0(handle, header)
        for start in range(0, packed.size, _UNIQUE_BLOCK):
            u, v = np.divmod(packed[start : start + _UNIQUE_BLOCK], num_nodes)
            np.stack([u, v], axis=1).tofile(handle)
    count = int(packed.size)
    del packed
    return np.load(out, mmap_mode="r") if count else np.empty((0, 2), dtype=np.int64)
