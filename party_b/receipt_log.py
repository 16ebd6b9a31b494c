"""Party B's JSONL record of every release it receives, written before B uses it (for audits)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path


class ReceiptLog:
    """JSONL record of every release B receives, written before B uses it (for audits)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, **entry: object) -> None:
        if self.path is None:
            return
        line = json.dumps({"received_at": time.time(), **entry})
        with self._lock, self.path.open("a") as handle:
            handle.write(line + "\n")
            handle.flush()
