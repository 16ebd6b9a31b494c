"""An institution's own table files (CSV or Parquet), read in record batches with pyarrow.

The import commands (party_a/graph_import.py, party_b/label_import.py) read the files a
platform or a bank already has through this module, never whole: a CSV through pyarrow's
streaming reader (blocks of :data:`CSV_BLOCK_BYTES` of text), a Parquet file through
``ParquetFile.iter_batches`` (at most ``batch_rows`` rows at once). Every batch comes with
the absolute offset of its first row, so a problem is named by its data row.

* The format is the file's extension: ``.csv``, or ``.parquet`` / ``.pq``.
* Keys are opaque strings: a key column is read as text (a CSV's ``007`` stays ``007``; a
  Parquet file's integer keys become their decimal strings) and compared byte for byte.
* Every CSV column is read as text and converted here, so a bad value is named with its
  row and column (pyarrow's own CSV conversion names neither).

:class:`InputFileError` is every refusal: it names the file, the data row (counted from 1,
the header not counted), the column, the problem and the fix.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

TableFormat = Literal["csv", "parquet"]
FORMATS: dict[str, TableFormat] = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet"}
BATCH_ROWS = 1 << 20  # Parquet rows per batch unless a caller bounds it by bytes
CSV_BLOCK_BYTES = 1 << 24  # 16 MB of CSV text per batch
ROW_NOTE = "data rows counted from 1, the header not counted"


class InputFileError(ValueError):
    """A table file cannot be imported. The text names the file, the row (``row``: 1-based
    data row; ``where``: a place that is not a row, such as the header), the column, the
    problem and the fix."""

    def __init__(
        self, path: Path, problem: str, fix: str, *, row: int | None = None, column: str | None = None,
        where: str | None = None,
    ) -> None:
        self.path, self.problem, self.fix, self.row, self.column = Path(path), problem, fix, row, column
        places = []
        if row is not None:
            places.append(f"row {row} ({ROW_NOTE})")
        elif where is not None:
            places.append(where)
        if column is not None:
            places.append(f"column {column!r}")
        place = f" {', '.join(places)}:" if places else ""
        super().__init__(f"{self.path}:{place} {problem}. Fix: {fix}")


@dataclass(frozen=True)
class Batch:
    """Rows ``offset .. offset + rows - 1`` (0-based) of a file: one Arrow array per column read."""

    offset: int
    columns: dict[str, pa.Array]

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def row(self, index: int) -> int:
        """The 1-based data row of the batch's ``index``-th row, as errors name it."""
        return self.offset + int(index) + 1


def table_format(path: Path) -> TableFormat:
    """``csv`` or ``parquet``, by the file's extension; anything else is refused."""
    fmt = FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise InputFileError(
            path, f"cannot read a {Path(path).suffix or 'extension-less'} file: vesper imports CSV and Parquet",
            "export the table as .csv (a header row, then one row per record) or as .parquet / .pq",
        )
    if not Path(path).is_file():
        raise InputFileError(path, "no such file", "check the path")
    return fmt


def column_names(path: Path) -> list[str]:
    """The file's columns: a CSV's header (read alone, with Python's csv module), a Parquet
    file's schema. A column named twice is refused."""
    try:
        if table_format(path) == "parquet":
            names = list(pq.ParquetFile(path).schema_arrow.names)
        else:
            with open(path, newline="", encoding="utf-8-sig") as handle:
                names = next(csv.reader(handle), [])
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError, csv.Error) as exc:
        raise InputFileError(path, f"cannot read the file ({exc})", "check that it is a complete CSV (UTF-8) or "
                             "Parquet file", where="the header") from None
    if not names:
        raise InputFileError(path, "the file is empty: no header and no data rows",
                             "export the table with a header row and at least one data row")
    for name in names:
        if names.count(name) > 1:
            raise InputFileError(path, "the header names this column twice", "give every column its own name",
                                 where="the header", column=name)
    return names


def require_columns(path: Path, found: Sequence[str], wanted: Mapping[str, str]) -> None:
    """Refuse a file that lacks a column of ``wanted`` (column -> the flag that names it)."""
    for column, flag in wanted.items():
        if column not in found:
            listed = ", ".join(repr(c) for c in found) or "none"
            raise InputFileError(
                path, f"no such column (the file's columns: {listed})",
                f"name the column with {flag}, or rename it in the file", where="the header", column=column,
            )


def read_batches(
    path: Path, columns: Sequence[str], key_columns: Sequence[str] = (), batch_rows: int = BATCH_ROWS,
) -> Iterator[Batch]:
    """The file's ``columns`` (checked with :func:`require_columns` first) batch by batch.

    A CSV's columns are all text. A Parquet file's ``key_columns`` are turned into text
    (integers into their decimal strings; any other type is refused); its other columns keep
    their types. A file with no data row is refused once the end is reached.
    """
    fmt = table_format(path)
    batches = _csv_batches(path, columns) if fmt == "csv" else _parquet_batches(path, columns, batch_rows)
    offset = 0
    for raw in batches:
        if raw.num_rows == 0:
            continue
        arrays = {name: _plain(raw.column(name)) for name in columns}
        for name in key_columns:
            arrays[name] = _key_text(arrays[name], path, name, offset)
        yield Batch(offset, arrays)
        offset += raw.num_rows
    if offset == 0:
        raise InputFileError(path, "no data rows (the file has a header or schema and nothing else)",
                             "export the table with its records", where="the whole file")


def _plain(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    return array


def _csv_batches(path: Path, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    options = pcsv.ConvertOptions(
        include_columns=list(columns), column_types={c: pa.string() for c in columns},
        strings_can_be_null=False, quoted_strings_can_be_null=False,
    )
    rows_read = 0
    bad_rows: list[str] = []

    def invalid_row(row: pcsv.InvalidRow) -> str:
        bad_rows.append(f"it has {row.actual_columns} fields, the header {row.expected_columns}: {row.text!r}")
        return "error"

    try:
        with pcsv.open_csv(
            path, read_options=pcsv.ReadOptions(block_size=CSV_BLOCK_BYTES), convert_options=options,
            parse_options=pcsv.ParseOptions(newlines_in_values=True, invalid_row_handler=invalid_row),
        ) as reader:
            for batch in reader:
                rows_read += batch.num_rows
                yield batch
    except pa.ArrowInvalid as exc:
        problem = bad_rows[0] if bad_rows else f"cannot parse the CSV ({exc})"
        row = _ragged_row(path) if bad_rows else None
        raise InputFileError(path, problem, "give every row as many fields as the header (quote fields that "
                             "hold commas)", row=row, where=f"a row after row {rows_read} ({ROW_NOTE})") from None


def _ragged_row(path: Path) -> int | None:
    """The first data row whose field count differs from the header's (the error path only: pyarrow's
    streaming reader names the row's text, not its number)."""
    with open(path, newline="", encoding="utf-8-sig") as handle:
        rows = csv.reader(handle)
        width = len(next(rows, []))
        for number, fields in enumerate((f for f in rows if f), start=1):  # blank lines are no rows
            if len(fields) != width:
                return number
    return None


def _parquet_batches(path: Path, columns: Sequence[str], batch_rows: int) -> Iterator[pa.RecordBatch]:
    try:
        source = pq.ParquetFile(path)
        yield from source.iter_batches(batch_size=max(1, batch_rows), columns=list(columns))
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputFileError(path, f"cannot read the Parquet file ({exc})", "check that the file is complete "
                             "and is Parquet") from None


def _key_text(values: pa.Array, path: Path, column: str, offset: int) -> pa.Array:
    """A key column as non-empty text; integers as their decimal strings."""
    kind = values.type
    if pa.types.is_integer(kind):
        values = pc.cast(values, pa.string())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        values = values.cast(pa.string())
    else:
        raise InputFileError(
            path, f"the key column holds {kind} values: keys are text or whole numbers",
            "store the keys as text (or integers) in the file", row=offset + 1, column=column,
        )
    empty = pc.fill_null(pc.equal(pc.binary_length(values), 0), True)
    if pc.any(empty).as_py():
        index = first_true(empty)
        raise InputFileError(path, "the key is empty", "give every row a key, or drop the row",
                             row=offset + index + 1, column=column)
    return values


def first_true(mask: pa.Array | np.ndarray) -> int:
    """The index of the first true value of a boolean mask (nulls are false); -1 when none."""
    if isinstance(mask, pa.Array):
        mask = pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
    flags = np.asarray(mask, dtype=bool)
    return int(np.argmax(flags)) if flags.any() else -1


def text_column(batch: Batch, column: str) -> pa.Array:
    """A column as trimmed text, nulls as empty strings (labels, split names)."""
    values = batch.columns[column]
    if pa.types.is_floating(values.type):  # pandas writes a column with gaps as floats, the gaps as NaN
        values = pc.if_else(pc.is_nan(values), pa.scalar(None, values.type), values)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        values = pc.cast(values, pa.string())
    return pc.utf8_trim_whitespace(pc.fill_null(values.cast(pa.string()), ""))


def numeric_column(batch: Batch, column: str, path: Path) -> np.ndarray:
    """A column as finite float32 values; a non-number, an empty cell, NaN or an infinity (also
    a number beyond float32's range) is refused with its row."""
    values = batch.columns[column]
    fix = "give every row a finite number in this column, or drop the column (it is read as a feature)"
    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        values = pc.utf8_trim_whitespace(values)
        empty = pc.fill_null(pc.equal(pc.utf8_length(values), 0), True)
        if pc.any(empty).as_py():
            raise InputFileError(path, "the value is empty", fix, row=batch.row(first_true(empty)), column=column)
        try:
            values = pc.cast(values, pa.float64())
        except pa.ArrowInvalid:
            index = _first_unparsable(values)
            raise InputFileError(path, f"{values[index].as_py()!r} is not a number", fix,
                                 row=batch.row(index), column=column) from None
    elif pa.types.is_integer(values.type) or pa.types.is_floating(values.type) or pa.types.is_decimal(values.type):
        if values.null_count:
            raise InputFileError(path, "the value is missing (null)", fix,
                                 row=batch.row(first_true(values.is_null())), column=column)
    else:
        raise InputFileError(path, f"the column holds {values.type} values, not numbers", fix,
                             row=batch.row(0), column=column)
    numbers = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64).astype(np.float32)
    finite = np.isfinite(numbers)
    if not finite.all():
        index = int(np.argmin(finite))
        raise InputFileError(path, f"the value {values[index].as_py()!r} is NaN, infinite or beyond float32's range",
                             fix, row=batch.row(index), column=column)
    return numbers


def _first_unparsable(values: pa.Array) -> int:
    """The first value pyarrow cannot cast to float64: bisect on prefixes (the error path only)."""
    low, high = 0, len(values)  # the prefix [0, low) casts; [0, high) does not
    while high - low > 1:
        middle = (low + high) // 2
        try:
            pc.cast(values.slice(0, middle), pa.float64())
            low = middle
        except pa.ArrowInvalid:
            high = middle
    return low


def duplicate_rows(keys: pa.Array) -> tuple[int, int] | None:
    """The first repeated key as (index of its first row, index of the repeat), 0-based; None when
    every key is distinct. Vectorised: ``index_in`` against the keys themselves gives each row
    the index of the first row with its key."""
    first = pc.index_in(keys, value_set=keys).to_numpy(zero_copy_only=False)
    repeats = first != np.arange(len(keys))
    if not repeats.any():
        return None
    again = int(np.argmax(repeats))
    return int(first[again]), again
