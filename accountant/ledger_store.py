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


class LedgerSchemaError(RuntimeError):
    """The ledger file was written by an accountant with a different schema."""


_COLUMNS = (
    "run_id", "seq", "accounting", "release_key", "nodes_digest", "pass_id", "kind", "num_nodes", "release_event",
    "counted", "epsilon_after", "accountant", "created_at",
)


class LedgerStore:
    """Thread-safe access to one ledger file; writes are serialised and durable."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._check_schema_version()
        self._db.executescript(_SCHEMA)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._lock = threading.Lock()

    def _check_schema_version(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        has_tables = self._db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        if has_tables and version != SCHEMA_VERSION:
            self._db.close()
            raise LedgerSchemaError(
                f"ledger {self.path} has schema version {version}, this accountant writes version "
                f"{SCHEMA_VERSION}; keep the old file for audits and start a new ledger file"
            )

    def close(self) -> None:
        with self._lock:
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
