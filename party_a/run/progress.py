"""What a run tells the coordinator while it runs, and how it learns the coordinator left."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# over gRPC, a training pass's progress at most this often (docs/performance-notes.md)
STEP_EVENTS_EVERY_S = 0.1


@dataclass(frozen=True)
class ProgressEvent:
    phase: str
    epoch: int = 0
    epochs: int = 0
    step: int = 0
    total_steps: int = 0
    loss: float = math.nan
    epsilon_spent: float = 0.0
    message: str = ""


Report = Callable[[ProgressEvent], None]


class Throttled:
    """``report``, passing a training pass's step events at most every ``every_s`` seconds.

    Always passed: every event that is not a step of a training pass, a pass's first step and
    its last (step = total_steps), an epoch's first, and a step after ``every_s`` without one.
    A dropped step's news (its loss, ε spent) arrives with the next one passed. For what party A
    sends the coordinator over gRPC: one event per step made A's gRPC thread take the GIL from
    the trainer and woke the coordinator 30 to 40 times a second, for a progress bar.
    """

    def __init__(self, report: Report, every_s: float = STEP_EVENTS_EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.report, self.every_s, self.clock = report, every_s, clock
        self._lock = threading.Lock()
        self._passed_at = -math.inf
        self._place: tuple[str, int, int, int] | None = None  # the pass and epoch of the last step passed

    def __call__(self, event: ProgressEvent) -> None:
        if event.phase == "train" and event.total_steps:
            place = (event.message, event.epochs, event.total_steps, event.epoch)
            with self._lock:
                now = self.clock()
                routine = place == self._place and event.step < event.total_steps
                if routine and now - self._passed_at < self.every_s:
                    return
                self._passed_at, self._place = now, place
        self.report(event)


class Cancelled(RuntimeError):
    """The coordinator went away; the run stops after the current step."""
