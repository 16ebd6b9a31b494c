"""The ledger on disk: SQLite, one row per charge, committed before it is acknowledged."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from vesper.common.privacy.ledger import LedgerRow, RunRecord

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    record TEXT NOT NULL             -- RunRecord as JSON
);
CREATE TABLE IF NOT EXISTS charges (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    seq INTEGER NOT NULL,
    accounting TEXT NOT NULL,        -- the run's mode, repeated so every row states it
    release_key TEXT NOT NULL,       -- party A's name for the release; a retry reuses it
    nodes_digest TEXT NOT NULL,
    pass_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    num_nodes INTEGER NOT NULL,
    release_event TEXT NOT NULL,     -- DpEvent as JSON
    counted INTEGER NOT NULL,
    epsilon_after REAL NOT NULL,
    accountant TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, release_key)
);
"""


SCHEMA_VERSION = 2  # 2: release keys and per-kind charge rules




_COLUMNS = (
    "run_id", "seq", "accounting", "release_key", "nodes_digest", "pass_id", "kind", "num_nodes", "release_event",
    "counted", "epsilon_after", "accountant", "created_at",
)


class LedgerFileError(ValueError):
    """The ledger path is not a ledger this code can open; the message names the setting, the
    file and the fix, and the file is left exactly as it was."""


class LedgerSchemaError(LedgerFileError):
    """The ledger file was written by an accountant with a different schema."""


_SQLITE_HEADER = b"SQLite format 3\x00"
_MEMORY = ":memory:"


def check_ledger_file(path: Path, setting: str) -> bool:
    """Whether ``path`` holds a ledger (False: nothing there yet). LedgerFileError for a
    directory, a file that is not SQLite, or a truncated one; reads only its first 100 bytes."""
    if str(path) == _MEMORY or not path.exists():
        return False
    if path.is_dir():
        raise LedgerFileError(f"{setting} = {path} is a directory, not a ledger file: give the path of a file")
    try:
        with path.open("rb") as handle:
            header = handle.read(100)
    except OSError as exc:
        raise LedgerFileError(f"{setting} = {path} cannot be read: {exc.strerror or exc}") from None
    if not header:
        return False  # an empty file: a new ledger
    if not header.startswith(_SQLITE_HEADER):
        raise LedgerFileError(
            f"{setting} = {path} is not a SQLite database (it starts with {header[:16]!r}), so not a ledger: give "
            "the ledger file an accountant wrote, or a path for a new one; the file was left as it was"
        )
    if len(header) < 100:
        raise LedgerFileError(
            f"{setting} = {path} is a truncated SQLite file ({len(header)} bytes), not a ledger: restore it from a "
            "copy; the file was left as it was"
        )
    return True


def _damaged(path: Path, setting: str, exc: sqlite3.Error) -> LedgerFileError:
    return LedgerFileError(
        f"{setting} = {path} is not a readable ledger (SQLite: {exc}): restore it from a copy, or give a path for a "
        "new ledger; the file was left as it was"
    )


def _read_only_connection(path: Path) -> sqlite3.Connection:
    """A connection that never writes the ledger. Without a write-ahead log beside it the file is
    opened immutable (nothing is written anywhere); with one, read-only, so that SQLite reads the
    log's charges too (it may update the ``-shm`` index, never the ledger or its log)."""
    wal = Path(f"{path}-wal")
    mode = "mode=ro" if wal.exists() and wal.stat().st_size else "immutable=1"
    return sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True, check_same_thread=False, isolation_level=None)


class LedgerStore:
    """Thread-safe access to one ledger file; writes are serialised and durable.

    ``read_only``: for audits (``vesper ledger verify``, ``vesper status --ledger``): opens an
    existing ledger without writing a byte of it. ``setting``: what the path was given as, for
    the messages of :class:`LedgerFileError`.
    """

    def __init__(self, path: Path, *, read_only: bool = False, setting: str = "accountant.ledger") -> None:
        self.path = path
        self.read_only = read_only
        exists = check_ledger_file(path, setting)
        if read_only and not exists:
            raise LedgerFileError(f"{setting} = {path}: no ledger there (no such file, or an empty one)")
        if exists:  # read and check it before any connection that could write
            probe = _read_only_connection(path)
            try:
                self._check_schema_version(probe, setting)
            finally:
                if not read_only:
                    probe.close()
        if read_only:
            self._db = probe
        else:
            if str(path) != _MEMORY:
                path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._lock = threading.Lock()

    def _check_schema_version(self, db: sqlite3.Connection, setting: str) -> None:
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            db.close()
            raise _damaged(self.path, setting, exc) from None
        if self.read_only and not tables:
            db.close()
            raise LedgerFileError(
                f"{setting} = {self.path} holds no ledger (an SQLite database without tables; after an accountant "
                "was stopped uncleanly its charges may be in a -wal file beside it: copy that too)"
            )
        if tables and "runs" not in tables:  # every schema of the ledger has its runs table
            db.close()
            raise LedgerFileError(
                f"{setting} = {self.path} is a SQLite database but not a ledger (its tables: "
                f"{', '.join(sorted(tables))}): give the ledger file an accountant wrote, or a path for a new one; "
                "the file was left as it was"
            )
        if tables and version != SCHEMA_VERSION:
            db.close()
            raise LedgerSchemaError(
                f"{setting} = {self.path}: ledger of schema version {version}, this accountant writes version "
                f"{SCHEMA_VERSION}; keep the old file for audits and start a new ledger file"
            )

    def close(self) -> None:
        """Close the ledger; a writer first moves every charge from the write-ahead log into the
        file itself, so that the file alone holds the whole ledger after a clean stop."""
        with self._lock:
            if not self.read_only:
                try:
                    self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                except sqlite3.Error:
                    pass  # the log still holds them; SQLite replays it on the next open
            self._db.close()

    def insert_run(self, record: RunRecord) -> None:
        with self._lock:
            self._db.execute("INSERT INTO runs VALUES (?, ?)", (record.run_id, record.model_dump_json()))

    def update_run(self, record: RunRecord) -> None:
        with self._lock:
            self._db.execute("UPDATE runs SET record = ? WHERE run_id = ?", (record.model_dump_json(), record.run_id))

    def get_run(self, run_id: str) -> RunRecord | None:
        with self._lock:
            row = self._db.execute("SELECT record FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return None if row is None else RunRecord.model_validate_json(row[0])

    def list_runs(self) -> list[RunRecord]:
        with self._lock:
            rows = self._db.execute("SELECT record FROM runs ORDER BY rowid").fetchall()
        return [RunRecord.model_validate_json(r[0]) for r in rows]

    def append_charge(self, row: LedgerRow) -> None:
        """Insert one charge; returns only after SQLite has committed it."""
        with self._lock:
            self._db.execute(
                "INSERT INTO charges VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.run_id, row.seq, row.accounting, row.release_key, row.nodes_digest, row.pass_id, row.kind, row.num_nodes, row.release_event,
                    int(row.counted), row.epsilon_after, row.accountant, row.created_at,
                ),
            )

    def charges(self, run_id: str) -> list[LedgerRow]:
        return self._select("WHERE run_id = ? ORDER BY seq", (run_id,))

    def charge_by_key(self, run_id: str, release_key: str) -> LedgerRow | None:
        rows = self._select("WHERE run_id = ? AND release_key = ?", (run_id, release_key))
        return rows[0] if rows else None

    def _select(self, where: str, args: tuple) -> list[LedgerRow]:
        with self._lock:
            rows = self._db.execute(f"SELECT {', '.join(_COLUMNS)} FROM charges {where}", args).fetchall()
        return [LedgerRow(**dict(zip(_COLUMNS, r, strict=True))) for r in rows]
