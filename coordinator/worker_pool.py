"""Benchmark cells run concurrently, one worker per driver (each driving its own services).

Used by ``vesper bench extractors`` sweeps and ``vesper bench label-privacy``: a finished
cell's row is handed to ``record`` under a lock (the caller appends it to its CSV, so a
killed benchmark resumes where it stopped); the first error stops every worker and is
raised once they have finished their current cell.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from rich.console import Console

Cell = TypeVar("Cell")
Driver = TypeVar("Driver")
Row = TypeVar("Row")


def run_cells(
    cells: Iterable[Cell], drivers: Sequence[Driver], run: Callable[[Driver, Cell], Row],
    record: Callable[[Row], None], describe: Callable[[Cell], str], console: Console,
) -> None:
    work: queue.Queue = queue.Queue()
    for cell in cells:
        work.put(cell)
    lock = threading.Lock()
    errors: list[BaseException] = []

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
                record(row)

    threads = [threading.Thread(target=worker, args=(drive,), daemon=True) for drive in drivers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
