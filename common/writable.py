"""Checks that a service can write where its settings say, before it serves or acknowledges.

A service that starts on a directory it cannot write serves without complaint until the
first record it must keep, and by then a run may have spent ε on releases nobody recorded
(party B's receipt log, A's release journal). Each service checks its directories when it
starts, and party B checks again before it acknowledges a run (party_b.service).
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path


class SettingError(ValueError):
    """A service cannot run as configured; the message names the setting, the path and the fix."""


def check_writable_dir(path: Path, setting: str) -> Path:
    """``path`` exists (created if missing) and a file can be created and removed in it."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".vesper-write-check-{uuid.uuid4().hex}"
        descriptor = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.write(descriptor, b"ok")
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
            probe.unlink(missing_ok=True)
    except OSError as exc:
        reason = "no space left on the device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
        raise SettingError(
            f"{setting} = {path}: this service cannot write there ({reason}); give it a directory it can "
            "write, or fix the directory's permissions, space or mount, then start it again"
        ) from None
    return path


def check_writable_file_dir(path: Path, setting: str) -> Path:
    """The directory a file named by ``setting`` is written into is writable (see :func:`check_writable_dir`)."""
    check_writable_dir(Path(path).parent, setting)
    return Path(path)
