"""Benchmark cells run concurrently, one worker per driver (each driving its own services).

Used by ``vesper bench extractors`` sweeps and ``vesper bench label-privacy``: a finished
cell's row is handed to ``append`` under a lock (the caller writes it to its CSV, so a
killed benchmark resumes where it stopped) and returned; a row whose run did not complete
is reported. The first error stops every worker and is raised once they have finished
their current cell.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar

from rich.console import Console


class _Row(Protocol):
    status: str
    message: str


class _Keyed(Protocol):
    @property
    def key(self) -> object: ...


Cell = TypeVar("Cell")
Driver = TypeVar("Driver")
Row = TypeVar("Row", bound=_Row)
Keyed = TypeVar("Keyed", bound=_Keyed)


def run_cells(
    cells: Iterable[Cell], drivers: Sequence[Driver], run: Callable[[Driver, Cell], Row],
    append: Callable[[Row], None], describe: Callable[[Cell], str], console: Console,
) -> list[Row]:
    """Rows of the cells run here, in the order they finished."""
    work: queue.Queue = queue.Queue()
    for cell in cells:
        work.put(cell)
    lock = threading.Lock()
    errors: list[BaseException] = []
    rows: list[Row] = []

    def worker(drive: Driver) -> None:
        while not errors:
            try:
                cell = work.get_nowait()
            except queue.Empty:
                return
            with lock:
                console.print(describe(cell), highlight=False)
            try:
                row = run(drive, cell)
            except BaseException as exc:  # noqa: BLE001 — stop the other workers; re-raised below
                errors.append(exc)
                return
            with lock:
                append(row)
                rows.append(row)
                if row.status != "completed":
                    console.print(f"  {row.status}: {row.message}", highlight=False)

    threads = [threading.Thread(target=worker, args=(drive,), daemon=True) for drive in drivers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return rows


def newest_only(rows: Sequence[Keyed], rerun: Iterable[object]) -> list[Keyed]:
    """``rows`` (oldest first) with only the newest row of each key in ``rerun``: a cell run
    again after a failure is listed once, not once per attempt."""
    keys = set(rerun)
    newest = {row.key: index for index, row in enumerate(rows) if row.key in keys}
    return [row for index, row in enumerate(rows) if row.key not in keys or newest[row.key] == index]
