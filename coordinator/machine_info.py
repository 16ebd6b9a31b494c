"""The machine a benchmark ran on, recorded with its report (``vesper bench perf``, ``vesper bench soak``)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from pydantic import AliasChoices, BaseModel, Field


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
