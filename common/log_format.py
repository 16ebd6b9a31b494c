"""How the services log: plain text or JSON lines, each line naming the run it was logged for.

``RUN_ID`` holds the run (or ledger) a thread is working on; whoever starts a run's work
sets it (``running(run_id)``; the gRPC server does it for every request that names a
``run_id``, common/grpc_observer.py), and ``RunIdFilter`` copies it onto every record, so
a line logged while handling a run carries that run's id and a line outside any run
carries none (``null`` in JSON).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Literal, get_args

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[str, ...] = get_args(LogFormat)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

RUN_ID: ContextVar[str | None] = ContextVar("vesper_run_id", default=None)
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"  # as before JSON lines existed


class LogSettingError(ValueError):
    """A ``--log-format`` or ``--log-level`` vesper does not know."""


def name_run(run_id: str | None) -> None:
    """Lines logged from now on in this thread (or context) carry ``run_id`` (None: no run)."""
    RUN_ID.set(run_id or None)


@contextmanager
def running(run_id: str | None) -> Iterator[None]:
    """Lines logged inside carry ``run_id``; the value before is restored after (in this thread)."""
    previous = RUN_ID.get()
    RUN_ID.set(run_id or None)
    try:
        yield
    finally:
        RUN_ID.set(previous)


class RunIdFilter(logging.Filter):
    """Puts the current run's id on every record (``record.run_id``, None outside a run)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "run_id"):
            record.run_id = RUN_ID.get()
        return True


class JsonLineFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, logger, message, run_id, and the
    exception's traceback as ``exc_info`` when there is one. Newlines inside the message are
    escaped by JSON, so a record is always exactly one line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "run_id": getattr(record, "run_id", RUN_ID.get()),
        }
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(level: str = "info", log_format: str = "text", force: bool = False) -> None:
    """The process's root logger: one stderr handler in ``log_format``, the run id on every record.

    Like ``logging.basicConfig``, it leaves a root logger that already has handlers as it is
    (a service run inside another program, such as a test runner, logs through that program's
    handlers) unless ``force``. The settings are checked either way."""
    if log_format not in LOG_FORMATS:
        raise LogSettingError(f"--log-format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    if level.lower() not in LOG_LEVELS:
        raise LogSettingError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    root = logging.getLogger()
    if root.handlers and not force:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RunIdFilter())
    handler.setFormatter(JsonLineFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # a Python warning is a line in the same format, not raw stderr
