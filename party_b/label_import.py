"""Party B's import: its own label table (CSV or Parquet) into its label store.

``vesper data import --role party-b --labels FILE --out DIR``. One row per key B holds: the key,
its label, and optionally its split.

* Labels are integers or class names: when every non-empty label is a whole number the classes
  are those numbers, sorted, named by their decimal text ("007" and "7" are class "7");
  otherwise the distinct names, sorted. An empty label is a key B holds but has not labelled
  (a customer to score): label -1, in no split.
* The split column (``train``, ``val``, ``test``, any case; empty = unspecified) is optional. If
  it gives a split it must give every labelled row one, and no unlabelled row any.
* At least two classes among the labelled rows; a repeated key is refused naming both rows.

The store (party_b/label_store_files.py) is staged and renamed into place
(common/store_directory.py): a failed import writes nothing.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field

from vesper.common.config import DEFAULT_MAX_CLASSES
from vesper.common.store_directory import staged_directory, write_report
from vesper.common.tabular import (
    InputFileError,
    column_names,
    duplicate_rows,
    first_true,
    read_batches,
    require_columns,
    text_column,
)
from vesper.party_b.label_store_files import (  # noqa: F401 (read_label_table: the store's reader, re-exported)
    REPORT_FILE,
    SPLIT_NAMES,
    read_label_table,
    write_label_table,
)

_INTEGER = r"^[+-]?[0-9]+$"


class LabelImportReport(BaseModel):
    """What ``import_labels`` read and wrote; kept as ``import-report.json``, local to party B."""

    model_config = ConfigDict(extra="forbid")

    labels_file: str
    store: str
    key_column: str
    label_column: str
    split_column: str | None = Field(description="None: the file has no split column")
    rows: int
    labelled: int
    unlabelled: int = Field(description="keys with an empty label: held by B, to be scored, in no split")
    labels_were: Literal["integers", "names"]
    classes: list[str]
    class_counts: list[int]
    split_given: bool
    split_counts: dict[str, int]
    seconds: float


def import_labels(
    labels: Path, out: Path, *, key: str = "id", label: str = "label", split: str = "split",
    require_split: bool = False, max_classes: int = DEFAULT_MAX_CLASSES,
) -> LabelImportReport:
    """Import party B's label table into a new label store ``out`` (refused if it exists and is not
    empty). The ``split`` column is read when the file has it (``require_split``: it must). Raises
    :class:`InputFileError` naming the file, row and column of bad input."""
    started = time.perf_counter()
    path, out = Path(labels), Path(out)
    found = column_names(path)
    require_columns(path, found, {key: "--key", label: "--label"})
    if require_split:
        require_columns(path, found, {split: "--split"})
    if key == label:
        raise InputFileError(path, f"--key and --label both name {key!r}", "name the key and the label columns",
                             where="the header", column=key)
    has_split = split in found and split not in (key, label)
    keys, text, split_text = _read_rows(path, key, label, split if has_split else None)
    repeated = duplicate_rows(keys)
    if repeated is not None:
        first, again = repeated
        raise InputFileError(path, f"the key {keys[again].as_py()!r} repeats row {first + 1}",
                             "give each key one row", row=again + 1, column=key)
    codes, class_names, kind = class_indices(text, path, label, max_classes)
    splits = (
        split_codes(split_text, codes >= 0, path, split) if split_text is not None
        else np.full(len(keys), -1, dtype=np.int8)
    )
    labelled = int((codes >= 0).sum())
    with staged_directory(out) as stage:
        write_label_table(stage, keys, codes, splits, class_names)
        report = LabelImportReport(
            labels_file=str(path), store=str(out), key_column=key, label_column=label,
            split_column=split if has_split else None, rows=len(keys), labelled=labelled,
            unlabelled=len(keys) - labelled, labels_were=kind, classes=class_names,
            class_counts=np.bincount(codes[codes >= 0], minlength=len(class_names)).tolist(),
            split_given=bool((splits >= 0).any()),
            split_counts={name: int((splits == i).sum()) for i, name in enumerate(SPLIT_NAMES)},
            seconds=round(time.perf_counter() - started, 3),
        )
        write_report(stage / REPORT_FILE, report)
    return report


def _read_rows(path: Path, key: str, label: str, split: str | None) -> tuple[pa.Array, pa.Array, pa.Array | None]:
    """(keys, labels as trimmed text, splits as trimmed lower-case text or None), batch by batch."""
    columns = [key, label, *([split] if split else [])]
    keys, labels, splits = [], [], []
    for batch in read_batches(path, columns, key_columns=[key]):
        keys.append(batch.columns[key])
        labels.append(text_column(batch, label))
        if split:
            splits.append(pc.utf8_lower(text_column(batch, split)))
    return pa.concat_arrays(keys), pa.concat_arrays(labels), pa.concat_arrays(splits) if split else None


def class_indices(
    text: pa.Array, path: Path, column: str, max_classes: int = DEFAULT_MAX_CLASSES,
) -> tuple[np.ndarray, list[str], Literal["integers", "names"]]:
    """Labels as text -> (int32 class index per row, -1 for empty; class names; how they were read)."""
    present = pc.not_equal(pc.utf8_length(text), 0)
    values = pc.filter(text, present)
    if len(values) == 0:
        raise InputFileError(path, "no row has a label", "label at least two classes' rows",
                             where="every row", column=column)
    ints = None
    if pc.all(pc.match_substring_regex(values, _INTEGER)).as_py():
        try:
            ints = pc.cast(values, pa.int64()).to_numpy()
        except pa.ArrowInvalid:  # beyond int64: read as names
            ints = None
    found = np.unique(ints) if ints is not None else pc.unique(values)
    if len(found) > max_classes:
        raise InputFileError(
            path, f"{len(found)} distinct labels: party B handles at most {max_classes} classes "
            "(party_b.max_classes)", "check that --label names the class column, or raise party_b.max_classes",
            where="every row", column=column,
        )
    if len(found) < 2:
        raise InputFileError(path, f"every labelled row has the one class {values[0].as_py()!r}",
                             "a classification task needs labelled rows of at least two classes",
                             where="every row", column=column)
    if ints is not None:
        index, names, kind = np.searchsorted(found, ints), [str(int(c)) for c in found], "integers"
    else:
        names = sorted(found.to_pylist())
        index, kind = pc.index_in(values, value_set=pa.array(names, pa.string())).to_numpy(), "names"
    codes = np.full(len(text), -1, dtype=np.int32)
    codes[pc.fill_null(present, False).to_numpy(zero_copy_only=False)] = index
    return codes, names, kind  # type: ignore[return-value]


def split_codes(text: pa.Array, labelled: np.ndarray, path: Path, column: str) -> np.ndarray:
    """Split names (lower-case text) -> int8 codes (0 train, 1 val, 2 test, -1 unspecified), with the
    rules of the module's docstring."""
    index = pc.index_in(text, value_set=pa.array(list(SPLIT_NAMES), pa.string()))
    unknown = pc.and_(pc.not_equal(pc.utf8_length(text), 0), index.is_null())
    if pc.any(unknown).as_py():
        row = first_true(unknown)
        raise InputFileError(path, f"{text[row].as_py()!r} is not a split", "write train, val or test, or leave "
                             "the cell empty", row=row + 1, column=column)
    codes = pc.fill_null(index, -1).to_numpy(zero_copy_only=False).astype(np.int8)
    stray = (codes >= 0) & ~labelled
    if stray.any():
        row = first_true(stray)
        raise InputFileError(path, f"the row has the split {SPLIT_NAMES[codes[row]]!r} but no label",
                             "leave the split empty for unlabelled rows (they are scored, not trained on), or "
                             "label the row", row=row + 1, column=column)
    given = (codes >= 0) & labelled
    if given.any() and not given[labelled].all():
        row = first_true(labelled & ~given)
        raise InputFileError(
            path, f"{int(given.sum())} of the {int(labelled.sum())} labelled rows have a split and this labelled "
            "row has none", "give every labelled row train, val or test, or leave the split empty in every row "
            "(party B then makes the split)", row=row + 1, column=column,
        )
    return codes
