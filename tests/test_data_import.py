"""Issue #20, part 1: the institutions' own CSV and Parquet files imported into the stores the
services read (party_a/graph_import.py, party_b/label_import.py), the ``graph`` and ``labels``
layouts, and ``vesper data example`` / ``vesper data import``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from vesper.common.csr_cache import load_csr_part
from vesper.common.dataset_files import (
    DatasetError,
    LabelPart,
    load_graph_part,
    load_label_part,
    resolve_dataset,
    write_graph_npz,
    write_label_npz,
)
from vesper.common.splits import split_for
from vesper.common.store_directory import OutputDirectoryError
from vesper.common.tabular import InputFileError
from vesper.coordinator.cli import app
from vesper.party_a.graph_import import import_graph
from vesper.party_a.graph_store_files import read_node_keys
from vesper.party_b.label_data import load_labels
from vesper.party_b.label_import import import_labels
from vesper.party_b.label_store_files import read_label_table

runner = CliRunner()

EDGES_CSV = "src,dst\n007,b\nb,007\nc,c\nb,c\n007,b\nd,007\n"  # one reversed and one plain repeat, a self-loop
FEATURES_CSV = "id,f1,f2\n007,1,2.5\nb, 3 ,4\nc,5,6\nd,0,-1e3\n"
LABELS_CSV = "id,label,split\n007,cat,train\nb,dog,test\nc,,\nzz,cat,val\nd,dog,train\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def csv_to_parquet(csv: Path, types: dict[str, pa.DataType] | None = None) -> Path:
    """The same table as Parquet (text columns, unless ``types`` says otherwise)."""
    lines = [line.split(",") for line in csv.read_text().splitlines()]
    header, rows = lines[0], lines[1:]
    columns = {}
    for j, name in enumerate(header):
        values = [row[j].strip() or None for row in rows]
        kind = (types or {}).get(name, pa.string())
        columns[name] = pa.array([None if v is None else (float(v) if pa.types.is_floating(kind) else
                                   int(v) if pa.types.is_integer(kind) else v) for v in values], kind)
    out = csv.with_suffix(".parquet")
    pq.write_table(pa.table(columns), out)
    return out


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def nothing_written(out: Path) -> bool:
    return not out.exists() and not list(out.parent.glob(f"{out.name}.tmp-*"))


# party A --------------------------------------------------------------------------------------------
def test_party_a_store_is_the_same_from_csv_and_parquet(tmp_path: Path) -> None:
    edges, features = write(tmp_path / "e.csv", EDGES_CSV), write(tmp_path / "f.csv", FEATURES_CSV)
    report = import_graph(edges, features, tmp_path / "csv")
    assert (report.nodes, report.feature_columns, report.edge_rows_read) == (4, ["f1", "f2"], 6)
    assert (report.self_loops_dropped, report.duplicate_edges_dropped, report.edges_kept) == (1, 2, 3)
    saved = json.loads((tmp_path / "csv" / "import-report.json").read_text())
    assert saved["edges_kept"] == 3 and saved["duplicate_edges_dropped"] == 2
    part = load_graph_part(tmp_path / "csv" / "graph.npz")
    assert part.edges.tolist() == [[0, 1], [0, 3], [1, 2]]
    assert part.features.dtype == np.float32 and part.features.tolist() == [[1, 2.5], [3, 4], [5, 6], [0, -1000]]
    assert read_node_keys(tmp_path / "csv").to_pylist() == ["007", "b", "c", "d"]  # "007" stays text
    with np.load(tmp_path / "csv" / "graph.npz") as archive:
        assert set(archive.files) == {"edges", "node_features"}  # no labels at A

    import_graph(csv_to_parquet(edges), csv_to_parquet(features, {"f1": pa.int64(), "f2": pa.float64()}),
                 tmp_path / "pq")
    again = load_graph_part(tmp_path / "pq" / "graph.npz")
    assert np.array_equal(again.edges, part.edges) and np.array_equal(again.features, part.features)
    assert read_node_keys(tmp_path / "pq").equals(read_node_keys(tmp_path / "csv"))
    csr = load_csr_part(tmp_path / "pq" / "graph.npz", root=tmp_path / "cache")
    assert csr.num_nodes == 4 and csr.indptr.tolist() == [0, 2, 4, 5, 6]


def test_integer_keys_of_a_parquet_file_become_their_decimal_text(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": pa.array([10, 7, 3]), "x": pa.array([1.0, 2.0, 3.0])}), tmp_path / "f.parquet")
    pq.write_table(pa.table({"src": pa.array([10, 3], pa.int32()), "dst": pa.array([7, 10], pa.int32())}),
                   tmp_path / "e.pq")
    import_graph(tmp_path / "e.pq", tmp_path / "f.parquet", tmp_path / "store")
    assert read_node_keys(tmp_path / "store").to_pylist() == ["10", "7", "3"]
    assert load_graph_part(tmp_path / "store" / "graph.npz").edges.tolist() == [[0, 1], [0, 2]]


def test_custom_column_names_and_an_empty_output_directory(tmp_path: Path) -> None:
    edges = write(tmp_path / "e.csv", "from,to,amount\nx,y,3.5\n")
    features = write(tmp_path / "f.csv", "node,age\nx,1\ny,2\n")
    (tmp_path / "store").mkdir()  # an empty directory may be used
    report = import_graph(edges, features, tmp_path / "store", src="from", dst="to", key="node")
    assert report.edges_kept == 1 and report.feature_columns == ["age"]
    with pytest.raises(OutputDirectoryError, match="choose a new directory, or remove this one"):
        import_graph(edges, features, tmp_path / "store", src="from", dst="to", key="node")


A_BAD = [
    # (edges text, features text, file named, row, column, fragment)
    ("src,dst\na,b\n", "node,f\na,1\nb,2\n", "f.csv", "the header", "id", "no such column (the file's columns: 'node', 'f')"),
    ("src,to\na,b\n", "id,f\na,1\nb,2\n", "e.csv", "the header", "dst", "no such column"),
    ("src,dst\na,b\n", "id,f\na,1\nb,2\na,3\n", "f.csv", "row 3", "id", "the key 'a' repeats row 1"),
    ("src,dst\na,b\n", "id,f,g\na,1,2\nb,2,blue\n", "f.csv", "row 2", "g", "'blue' is not a number"),
    ("src,dst\na,b\n", "id,f\na,1\nb,NaN\n", "f.csv", "row 2", "f", "NaN, infinite"),
    ("src,dst\na,b\n", "id,f\na,inf\nb,1\n", "f.csv", "row 1", "f", "NaN, infinite"),
    ("src,dst\na,b\n", "id,f\na,1\nb,\n", "f.csv", "row 2", "f", "the value is empty"),
    ("src,dst\na,b\nb,zz\n", "id,f\na,1\nb,2\n", "e.csv", "row 2", "dst", "the key 'zz' has no row in the features"),
    ("src,dst\na,b\n,b\n", "id,f\na,1\nb,2\n", "e.csv", "row 2", "src", "the key is empty"),
    ("src,dst\n", "id,f\na,1\n", "e.csv", "the whole file", None, "no data rows"),
    ("src,dst\na,b\n", "", "f.csv", None, None, "the file is empty"),
]


@pytest.mark.parametrize("edges_text, features_text, named, row, column, fragment", A_BAD)
def test_bad_party_a_input_is_named_and_writes_nothing(
    tmp_path: Path, edges_text: str, features_text: str, named: str, row: str | None, column: str | None,
    fragment: str,
) -> None:
    out = tmp_path / "store"
    with pytest.raises(InputFileError) as caught:
        import_graph(write(tmp_path / "e.csv", edges_text), write(tmp_path / "f.csv", features_text), out)
    message = str(caught.value)
    assert message.startswith(str(tmp_path / named)) and fragment in message and "Fix: " in message
    if row is not None:
        assert row in message
    if row and row.startswith("row"):
        assert "data rows counted from 1, the header not counted" in message
    if column is not None:
        assert f"column {column!r}" in message
    assert nothing_written(out)


def test_bad_parquet_features_are_named_with_row_and_column(tmp_path: Path) -> None:
    write(tmp_path / "e.csv", "src,dst\na,b\n")
    pq.write_table(pa.table({"id": ["a", "b"], "f": [1.0, float("nan")]}), tmp_path / "f.parquet")
    with pytest.raises(InputFileError, match=r"row 2 .*column 'f': the value nan is NaN"):
        import_graph(tmp_path / "e.csv", tmp_path / "f.parquet", tmp_path / "store")
    pq.write_table(pa.table({"id": ["a", "b"], "colour": ["red", "blue"]}), tmp_path / "f.parquet")
    with pytest.raises(InputFileError, match=r"row 1 .*column 'colour': 'red' is not a number"):
        import_graph(tmp_path / "e.csv", tmp_path / "f.parquet", tmp_path / "store")
    pq.write_table(pa.table({"id": ["a", "b"], "ok": [1, 2], "flag": [True, False]}), tmp_path / "f.parquet")
    with pytest.raises(InputFileError, match=r"row 1 .*column 'flag': the column holds bool values, not numbers"):
        import_graph(tmp_path / "e.csv", tmp_path / "f.parquet", tmp_path / "store")
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "f": pa.array([], pa.float64())}), tmp_path / "f.parquet")
    with pytest.raises(InputFileError, match="no data rows"):
        import_graph(tmp_path / "e.csv", tmp_path / "f.parquet", tmp_path / "store")
    with pytest.raises(InputFileError, match=r"cannot read a \.txt file: vesper imports CSV and Parquet"):
        import_graph(write(tmp_path / "e.txt", "src,dst\n"), tmp_path / "f.parquet", tmp_path / "store")
    assert nothing_written(tmp_path / "store")


# party B --------------------------------------------------------------------------------------------
def test_party_b_store_is_the_same_from_csv_and_parquet(tmp_path: Path) -> None:
    labels = write(tmp_path / "l.csv", LABELS_CSV)
    report = import_labels(labels, tmp_path / "csv")
    assert (report.rows, report.labelled, report.unlabelled, report.labels_were) == (5, 4, 1, "names")
    assert report.classes == ["cat", "dog"] and report.class_counts == [2, 2]
    assert report.split_given and report.split_counts == {"train": 2, "val": 1, "test": 1}
    keys, codes, splits, names = read_label_table(tmp_path / "csv")
    assert keys.to_pylist() == ["007", "b", "c", "zz", "d"] and names == ["cat", "dog"]
    assert codes.dtype == np.int32 and codes.tolist() == [0, 1, -1, 0, 1]
    assert splits.dtype == np.int8 and splits.tolist() == [0, 2, -1, 1, 0]
    assert json.loads((tmp_path / "csv" / "classes.json").read_text()) == {"classes": ["cat", "dog"]}
    import_labels(csv_to_parquet(labels), tmp_path / "pq")
    again = read_label_table(tmp_path / "pq")
    assert again[0].equals(keys) and np.array_equal(again[1], codes) and np.array_equal(again[2], splits)


def test_integer_labels_are_classes_named_by_their_number(tmp_path: Path) -> None:
    labels = write(tmp_path / "l.csv", "id,label\n1,7\n2,007\n3,-2\n4,\n5,10\n")
    report = import_labels(labels, tmp_path / "csv")
    assert report.labels_were == "integers" and report.classes == ["-2", "7", "10"] and not report.split_given
    assert read_label_table(tmp_path / "csv")[1].tolist() == [1, 1, 0, -1, 2]
    pq.write_table(pa.table({"id": [1, 2, 3, 4, 5], "label": pa.array([7, 7, -2, None, 10])}), tmp_path / "l.parquet")
    import_labels(tmp_path / "l.parquet", tmp_path / "pq")
    keys, codes, _, names = read_label_table(tmp_path / "pq")
    assert keys.to_pylist() == ["1", "2", "3", "4", "5"] and codes.tolist() == [1, 1, 0, -1, 2] and names == report.classes
    # pandas writes a label column with gaps as floats, the gaps as NaN: still the integer classes
    pq.write_table(pa.table({"id": ["a", "b", "c"], "label": [1.0, float("nan"), 0.0]}), tmp_path / "f.parquet")
    assert import_labels(tmp_path / "f.parquet", tmp_path / "floats").classes == ["0", "1"]
    assert read_label_table(tmp_path / "floats")[1].tolist() == [1, -1, 0]


B_BAD = [
    # (labels text, row, column, fragment)
    ("key,label\na,x\n", "the header", "id", "no such column (the file's columns: 'key', 'label')"),
    ("id,label\na,x\nb,y\na,y\n", "row 3", "id", "the key 'a' repeats row 1"),
    ("id,label,split\na,x,train\nb,y,holdout\n", "row 2", "split", "'holdout' is not a split"),
    ("id,label,split\na,x,train\nb,y,\n", "row 2", "split", "1 of the 2 labelled rows have a split"),
    ("id,label,split\na,x,train\nb,y,test\nc,,val\n", "row 3", "split", "has the split 'val' but no label"),
    ("id,label\na,x\nb,x\nc,\n", "every row", "label", "the one class 'x'"),
    ("id,label\na,\nb,\n", "every row", "label", "no row has a label"),
    ("id,label\na,x\nb,y,z\n", "row 2", None, "it has 3 fields, the header 2: 'b,y,z'"),
    ("id,label,label\na,x,y\n", "the header", "label", "the header names this column twice"),
    ("id,label\n", "the whole file", None, "no data rows"),
    ("", None, None, "the file is empty"),
]


@pytest.mark.parametrize("text, row, column, fragment", B_BAD)
def test_bad_party_b_input_is_named_and_writes_nothing(
    tmp_path: Path, text: str, row: str | None, column: str | None, fragment: str,
) -> None:
    out = tmp_path / "store"
    with pytest.raises(InputFileError) as caught:
        import_labels(write(tmp_path / "l.csv", text), out)
    message = str(caught.value)
    assert message.startswith(str(tmp_path / "l.csv")) and fragment in message and "Fix: " in message
    if row is not None:
        assert row in message
    if column is not None:
        assert f"column {column!r}" in message
    assert nothing_written(out)


def test_an_explicit_split_column_must_exist(tmp_path: Path) -> None:
    labels = write(tmp_path / "l.csv", "id,label\na,x\nb,y\n")
    assert not import_labels(labels, tmp_path / "one").split_given  # the default 'split' is optional
    with pytest.raises(InputFileError, match="column 'fold': no such column"):
        import_labels(labels, tmp_path / "two", split="fold", require_split=True)


# the layouts the services read ------------------------------------------------------------------
def test_graph_layout_loads_for_party_a_and_is_refused_for_party_b(tmp_path: Path) -> None:
    path = tmp_path / "graph.npz"
    edges = np.array([[0, 1], [1, 2], [2, 0]], dtype=np.int32)  # converted to int64 as written
    write_graph_npz(path, edges, np.arange(6, dtype=np.float64).reshape(3, 2))
    part = load_graph_part(path)
    assert part.edges.dtype == np.int64 and part.features.dtype == np.float32 and part.num_nodes == 3
    assert load_csr_part(path, root=tmp_path / "cache").indptr.tolist() == [0, 2, 4, 6]
    with pytest.raises(DatasetError, match="party A's graph file has no labels"):
        load_label_part(path)
    with pytest.raises(DatasetError, match="outside 0..2"):
        write_graph_npz(tmp_path / "bad.npz", np.array([[0, 3]]), np.zeros((3, 1), np.float32))
    with pytest.raises(DatasetError, match="NaN or Inf"):
        write_graph_npz(tmp_path / "bad.npz", edges, np.array([[0.0], [np.inf], [1.0]]))
    assert not (tmp_path / "bad.npz").exists() and not list(tmp_path.glob(".bad.npz*"))


def test_labels_layout_keeps_unlabelled_nodes_out_of_every_split(tmp_path: Path) -> None:
    labels = np.array([0, -1, 1, 2, -1, 0, 1, 2] * 10)
    names = ["low", "mid", "high", "unused"]
    path = tmp_path / "labels.npz"
    write_label_npz(path, labels, names)
    part = load_label_part(path)
    assert part.class_names == tuple(names) and part.masks is None
    with pytest.raises(DatasetError, match="is party B's label file"):
        load_graph_part(path)
    with pytest.raises(DatasetError, match="is party B's label file"):
        load_csr_part(path, root=tmp_path / "cache")
    labelled = set(np.flatnonzero(labels >= 0).tolist())
    for independent in (False, True):
        store = load_labels(path, 0, label_independent=independent)
        assert store.class_names == tuple(names) and store.num_classes == 4 and store.metric == "accuracy"
        chosen = np.concatenate([store.split.train, store.split.val, store.split.test]).tolist()
        assert sorted(chosen) == sorted(labelled)  # every labelled node once, no unlabelled one
    masks = tuple(np.isin(np.arange(labels.size), np.flatnonzero(labels >= 0)[i::3]) for i in range(3))
    write_label_npz(path, labels, names, masks)
    store = load_labels(path, 0)
    assert store.split.description == "the file's split 0" and store.split.train.tolist() == np.flatnonzero(masks[0]).tolist()
    bad = (masks[0] | (labels < 0), masks[1], masks[2])
    with pytest.raises(DatasetError, match="not labelled"):
        write_label_npz(path, labels, names, bad)
    with pytest.raises(DatasetError, match="not labelled"):
        split_for(LabelPart(labels=labels, masks=tuple(np.atleast_2d(m) for m in bad)), 0)  # type: ignore[arg-type]


def test_unlabelled_nodes_stay_refused_in_the_benchmark_layouts(tmp_path: Path) -> None:
    path = tmp_path / "het.npz"
    np.savez(path, node_features=np.zeros((3, 1), np.float32), node_labels=np.array([0, -1, 1]),
             edges=np.array([[0, 1]]))
    with pytest.raises(DatasetError, match="label -1 at row 1 is negative: labels are classes 0..C-1"):
        load_label_part(path)
    cora = load_labels(resolve_dataset("cora"), 0)  # a file that names no classes: their numbers
    assert cora.class_names == tuple(str(i) for i in range(7)) and cora.num_classes == 7


# the command line --------------------------------------------------------------------------------
def test_example_files_import_cleanly_through_the_command_line(tmp_path: Path) -> None:
    example = tmp_path / "example"
    result = runner.invoke(app, ["data", "example", "--out", str(example), "--seed", "3"])
    assert result.exit_code == 0, result.output
    first = (example / "party_b" / "labels.csv").read_text()
    result = runner.invoke(app, [
        "data", "import", "--role", "party-a", "--edges", str(example / "party_a" / "edges.csv"),
        "--features", str(example / "party_a" / "features.csv"), "--out", str(tmp_path / "a"),
    ])
    assert result.exit_code == 0, result.output
    assert "2708 nodes, 1433 feature columns" in flat(result.output) and "5278 edges kept" in flat(result.output)
    result = runner.invoke(app, [
        "data", "import", "--role", "party-b", "--labels", str(example / "party_b" / "labels.csv"),
        "--out", str(tmp_path / "b"),
    ])
    assert result.exit_code == 0, result.output
    keys_a = set(read_node_keys(tmp_path / "a").to_pylist())
    keys_b, codes, _, names = read_label_table(tmp_path / "b")
    assert names[0] == "Case_Based" and names[-1] == "Theory" and len(names) == 7
    b_only = set(keys_b.to_pylist()) - keys_a
    assert len(b_only) == 200 and len(keys_b) - 200 == round(0.8 * 2708)
    assert 0 < int((codes < 0).sum()) < len(keys_b) // 5
    assert all(re.fullmatch(r"cust-[0-9a-f]{6}", key) for key in keys_a)
    again = runner.invoke(app, ["data", "example", "--out", str(tmp_path / "again"), "--seed", "3"])
    assert again.exit_code == 0 and (tmp_path / "again" / "party_b" / "labels.csv").read_text() == first


def test_the_import_command_refuses_wrong_flags_and_bad_input(tmp_path: Path) -> None:
    labels = write(tmp_path / "l.csv", "id,label\na,x\na,y\n")
    result = runner.invoke(app, ["data", "import", "--role", "party-a", "--labels", str(labels), "--out", "x"])
    assert result.exit_code == 2 and "--role party-a does not take --labels" in flat(result.output)
    result = runner.invoke(app, ["data", "import", "--role", "party-a", "--edges", str(labels), "--out", "x"])
    assert result.exit_code == 2 and "--role party-a needs --features" in flat(result.output)
    result = runner.invoke(app, ["data", "import", "--role", "party-b", "--src", "s", "--labels", str(labels),
                                 "--out", "x"])
    assert result.exit_code == 2 and "does not take --src" in flat(result.output)
    result = runner.invoke(app, ["data", "import", "--role", "party-b", "--labels", str(labels),
                                 "--out", str(tmp_path / "b")])
    assert result.exit_code == 1 and "the key 'a' repeats row 1" in flat(result.output)
    assert nothing_written(tmp_path / "b")
