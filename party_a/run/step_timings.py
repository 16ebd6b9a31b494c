"""Where party A's training steps spend their time, phase by phase, saved as
``runs/<id>/step_timings.json``; ``vesper bench perf`` (coordinator.perf.throughput) reads it."""

from __future__ import annotations

import json
import time
from array import array
from pathlib import Path

STEP_TIMINGS_FILE = "step_timings.json"


class StepTimings:
    """Where each training step's time goes at party A, in seconds per phase:

    release   the extractor's release (sampling unless prefetched, encoder, PMP, noise)
    charge    the write-ahead charge (the accountant's RPC, its SQLite commit)
    encode    the release as a wire tensor
    journal   its digest appended to releases.jsonl and synced
    send      handing the step to gRPC's thread
    prefetch  sampling the next step, gathering its features and dropout masks, while B computes (pipelining)
    wait      until B's answer arrived (B's decode, loss, update, encode; transport both ways)
    update    the gradient checked, back-propagated, the optimiser stepped
    other     checkpoint, progress report

    ``ends`` holds each step's end on A's monotonic clock, for steady-state rates. The first
    ``MAX_RECORDED`` steps are kept one by one (a flat array: a long run's memory stays flat),
    and every step adds to the per-phase totals.
    """

    PHASES = ("release", "charge", "encode", "journal", "send", "prefetch", "wait", "update", "other")
    MAX_RECORDED = 5000

    def __init__(self) -> None:
        self.rows = array("d")  # MAX_RECORDED x len(PHASES) at most, row-major
        self.ends = array("d")
        self.totals = [0.0] * len(self.PHASES)
        self.count = 0
        self._row: list[float] | None = None
        self._last = 0.0

    def begin(self) -> None:
        self._row = [0.0] * len(self.PHASES)
        self._last = time.perf_counter()

    def mark(self, phase: str) -> None:
        if self._row is None:
            return
        now = time.perf_counter()
        self._row[self.PHASES.index(phase)] += now - self._last
        self._last = now

    def end(self) -> None:
        if self._row is None:
            return
        self.mark("other")
        if self.count < self.MAX_RECORDED:
            self.rows.extend(self._row)
            self.ends.append(self._last)
        self.totals = [total + value for total, value in zip(self.totals, self._row, strict=True)]
        self.count += 1
        self._row = None

    @property
    def steps(self) -> list[list[float]]:
        width = len(self.PHASES)
        return [list(self.rows[i : i + width]) for i in range(0, len(self.rows), width)]

    def save(self, path: Path) -> None:
        path.write_text(json.dumps({
            "phases": list(self.PHASES), "steps": [[round(v, 7) for v in row] for row in self.steps],
            "ends": [round(t, 7) for t in self.ends], "count": self.count,
            "totals": [round(t, 6) for t in self.totals],
        }))


class _NoTimer(StepTimings):
    def mark(self, phase: str) -> None:
        return None


_NO_TIMER = _NoTimer()
