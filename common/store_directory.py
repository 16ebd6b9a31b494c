"""The directory an import writes (party A's graph store, party B's label store).

It is written beside its final place as ``OUT.tmp-<pid>`` and renamed to ``OUT`` only once
complete, so an import that fails (bad input, a full disk, an interrupt) leaves nothing at
``OUT``, and a store that exists is a whole one. An ``OUT`` that exists and is not empty is
never touched.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel


class OutputDirectoryError(ValueError):
    """The output directory cannot be used; the text says why and what to do."""


def check_output_directory(out: Path) -> None:
    """Refuse an ``out`` that exists and is not an empty directory."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a directory that is not empty" if out.is_dir() else "a file"
        raise OutputDirectoryError(
            f"{out} is {what}: an import never writes over an existing store; choose a new directory, "
            "or remove this one first"
        )


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """Yield an empty staging directory; rename it to ``out`` when the block completes, remove it when
    the block raises."""
    out = Path(out)
    check_output_directory(out)
    staging = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        check_output_directory(out)  # nobody filled it meanwhile
        os.replace(staging, out)  # an empty ``out`` directory is replaced (POSIX rename)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_report(path: Path, report: BaseModel) -> None:
    path.write_text(report.model_dump_json(indent=2) + "\n")
