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
    pass_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    num_nodes INTEGER NOT NULL,
    release_event TEXT NOT NULL,     -- DpEvent as JSON
    counted INTEGER NOT NULL,
    epsilon_after REAL NOT NULL,
    accountant TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);
"""


class LedgerStore:
    """Thread-safe access to one ledger file; writes are serialised and durable."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

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
                "INSERT INTO charges VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.run_id, row.seq, row.pass_id, row.kind, row.num_nodes, row.release_event,
                    int(row.counted), row.epsilon_after, row.accountant, row.created_at,
                ),
            )

    def charges(self, run_id: str) -> list[LedgerRow]:
        with self._lock:
            rows = self._db.execute(
                "SELECT run_id, seq, pass_id, kind, num_nodes, release_event, counted, epsilon_after,"
                " accountant, created_at FROM charges WHERE run_id = ? ORDER BY seq",
                (run_id,),
            ).fetchall()
        return [
            LedgerRow(
                run_id=r[0], seq=r[1], pass_id=r[2], kind=r[3], num_nodes=r[4], release_event=r[5],
                counted=bool(r[6]), epsilon_after=r[7], accountant=r[8], created_at=r[9],
            )
            for r in rows
        ]
