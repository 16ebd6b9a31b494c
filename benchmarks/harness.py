"""The benchmarks' shared harness: cells run concurrently, budgets on a command line, the machine.

* ``run_cells`` / ``newest_only``: benchmark cells run concurrently, one worker per driver (each
  driving its own services). Used by ``vesper bench extractors`` sweeps, ``vesper bench
  label-privacy``, ``utility`` and ``audit``: a finished cell's row is handed to ``append``
  under a lock (the caller writes it to its CSV, so a killed benchmark resumes where it
  stopped) and returned; a row whose run did not complete is reported. The first error stops
  every worker and is raised once they have finished their current cell.
* ``parse_epsilons``: budgets on a benchmark's command line, each flag a positive number or 'inf'.
* ``Machine``: the machine a benchmark ran on, recorded with its report (``vesper bench perf``,
  ``vesper bench soak``).
"""

from __future__ import annotations

import math
import os
import platform
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import typer
from pydantic import AliasChoices, BaseModel, Field
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


# -- budgets on a command line ------------------------------------------------------------------
def parse_epsilons(texts: Sequence[str], param_hint: str = "--epsilon", what: str = "ε") -> list[float]:
    """The budgets of repeated flags, in order, each once (typer.BadParameter names a bad one)."""
    values = []
    for text in texts:
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a number or inf", param_hint=param_hint) from None
        if math.isnan(value) or value <= 0:
            raise typer.BadParameter(f"{text!r}: {what} must be > 0 (or inf)", param_hint=param_hint)
        values.append(value)
    return list(dict.fromkeys(values))


# -- the machine ------------------------------------------------------------------------------
def _proc_value(path: str, prefix: str) -> str | None:
    """The value after the first line of ``path`` that starts with ``prefix`` (None off Linux)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


class Machine(BaseModel):
    cpu_model: str
    # soak reports written before this model called it cpus: they still load
    cores: int = Field(validation_alias=AliasChoices("cores", "cpus"))
    python: str
    system: str
    # None only in those older soak reports, which did not record them
    ram_gib: float | None = None
    torch: str | None = None
    torch_threads: int | None = Field(None, description="intra-op threads of the process that recorded it")

    @classmethod
    def here(cls) -> Machine:
        import torch  # not at module level: the CLI that imports this stays light

        model = _proc_value("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()
        memory = _proc_value("/proc/meminfo", "MemTotal:")  # "16318480 kB"
        ram = int(memory.split()[0]) / 1024 / 1024 if memory else 0.0
        return cls(
            cpu_model=model, cores=os.cpu_count() or 0, python=platform.python_version(), system=platform.platform(),
            ram_gib=round(ram, 1), torch=torch.__version__, torch_threads=torch.get_num_threads(),
        )
