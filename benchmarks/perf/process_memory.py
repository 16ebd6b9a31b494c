"""Each service's memory, from /proc/PID/status (Linux): resident memory now (VmRSS), its peak
over the process's life as the kernel keeps it (VmHWM), and the heap / file-backed split
(RssAnon, RssFile); :class:`PeakSampler` reads them on a thread, with the maximum VmRSS per phase
of a run. Used by the scale benchmark (:mod:`vesper.benchmarks.perf.scale`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field


class MemoryReading(BaseModel):
    rss_kib: int = Field(description="VmRSS: resident now")
    hwm_kib: int = Field(description="VmHWM: the peak of VmRSS over the process's life, kept by the kernel")
    anon_kib: int = Field(0, description="RssAnon: the heap (tensors, arrays, Python)")
    file_kib: int = Field(0, description="RssFile: file pages mapped in (the memory-mapped CSR, libraries)")


_STATUS_KEYS = {"VmRSS": "rss_kib", "VmHWM": "hwm_kib", "RssAnon": "anon_kib", "RssFile": "file_kib"}


def read_memory(pid: int) -> MemoryReading:
    """VmRSS and VmHWM of ``pid`` from /proc/PID/status (Linux). ProcessLookupError when gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        raise ProcessLookupError(pid) from None
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in _STATUS_KEYS:
            values[_STATUS_KEYS[key]] = int(rest.split()[0])  # "  123456 kB"
    if "rss_kib" not in values or "hwm_kib" not in values:  # a zombie has no memory lines
        raise ProcessLookupError(pid)
    return MemoryReading(**values)


class PeakSampler:
    """Samples VmRSS and VmHWM of named processes on a thread; the maximum VmRSS per phase.

    ``phase(name)`` switches the phase the following samples count for (it takes one sample
    first, so a short phase is never empty); ``snapshot()`` reads every process now.
    ``discover``, when given, is asked before every sample for processes to add (name -> pid):
    processes that start during the run.
    """

    def __init__(
        self, pids: dict[str, int], every_s: float = 0.25, discover: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.pids = dict(pids)
        self.discover = discover
        self.every_s = every_s
        self.current = "start"
        self.max_rss_kib: dict[str, dict[str, int]] = {}  # phase -> process -> max VmRSS
        self.last: dict[str, MemoryReading] = {}
        self.gone: set[str] = set()
        self.samples = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peak-sampler", daemon=True)

    def __enter__(self) -> PeakSampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def phase(self, name: str) -> None:
        with self._lock:
            self.current = name
        self.sample()

    def sample(self) -> dict[str, MemoryReading]:
        readings = {}
        if self.discover is not None:
            found = self.discover()
            with self._lock:
                self.pids.update(found)
        with self._lock:
            pids = dict(self.pids)
        for name, pid in pids.items():
            try:
                readings[name] = read_memory(pid)
            except ProcessLookupError:
                self.gone.add(name)
        with self._lock:
            per_process = self.max_rss_kib.setdefault(self.current, {})
            for name, reading in readings.items():
                per_process[name] = max(per_process.get(name, 0), reading.rss_kib)
                self.last[name] = reading
            self.samples += 1
        return readings

    def peak_kib(self, name: str) -> int:
        """The peak of ``name``: its last VmHWM, or a larger sampled VmRSS (the kernel's RSS
        counters are per-thread caches synced now and then, so two readings can disagree by a
        few pages either way)."""
        with self._lock:
            sampled = max((per.get(name, 0) for per in self.max_rss_kib.values()), default=0)
            return max(self.last[name].hwm_kib if name in self.last else 0, sampled)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()
