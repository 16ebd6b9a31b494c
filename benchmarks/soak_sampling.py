"""Sampling /proc for ``vesper bench soak``: each process's resident memory (``VmRSS``),
open file descriptors (``/proc/PID/fd``) and threads (``/proc/PID/task``), read by a sampler
thread of its own at the step thresholds the run crosses (:class:`StepSampler`)."""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


class ProcessGone(RuntimeError):
    """A sampled process no longer exists: a service died during the soak."""


class ProcessSample(BaseModel):
    rss_kib: int = Field(description="VmRSS of /proc/PID/status")
    fds: int = Field(description="entries of /proc/PID/fd")
    threads: int = Field(description="entries of /proc/PID/task")
    thread_names: dict[str, int] = Field(
        default_factory=dict,
        description="threads per name (/proc/PID/task/TID/comm): which kind of thread a change is "
        "(gRPC's own threads are named; Python's are not, and show as the process's name)",
    )
    fd_kinds: dict[str, int] = Field(
        default_factory=dict, description="open file descriptors per target: socket, pipe, anon_inode:..., or the file"
    )


class Sample(BaseModel):
    step: int = Field(description="training steps done when the sample was taken")
    seconds: float = Field(description="since the run's first training step")
    kind: Literal["warmup", "start", "periodic", "end"]
    processes: dict[str, ProcessSample]


def read_process(pid: int) -> ProcessSample:
    """One process's RSS, open file descriptors and threads, from /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds_listed = os.listdir(f"/proc/{pid}/fd")
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        raise ProcessGone(f"process {pid} has exited") from None
    kinds: Counter[str] = Counter()
    for fd in fds_listed:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except (FileNotFoundError, OSError):
            continue  # closed between the listing and the read
        kinds[target.split(":[", 1)[0] if ":[" in target else target] += 1
    names: Counter[str] = Counter()
    for task in tasks:
        try:
            names[Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()] += 1
        except FileNotFoundError:
            continue  # the thread ended between the listing and the read
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            if unit != "kB":
                raise ValueError(f"/proc/{pid}/status reports VmRSS in {unit!r}, expected kB")
            return ProcessSample(
                rss_kib=int(value), fds=len(fds_listed), threads=len(tasks), thread_names=dict(names), fd_kinds=dict(kinds),
            )
    raise ProcessGone(f"process {pid} has no VmRSS (a zombie: it has exited)")


def command_line(pid: int) -> str:
    """What the process runs, so the report shows that each PID was the service named."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        raise ProcessGone(f"process {pid} has exited") from None
    return shlex.join(part.decode(errors="replace") for part in raw.rstrip(b"\0").split(b"\0"))


class StepSampler:
    """Samples the processes from a thread of its own, at step thresholds the run crosses.

    The main thread follows the run's progress events and calls :meth:`advance`; the
    sampler wakes when the step reaches the next threshold and reads /proc at the step
    the run is then at: from step 1 every ``every`` steps during the warm-up (for the
    plot), the start sample at ``warmup_step``, then every ``every`` steps. :meth:`finish`
    takes the end sample and stops the thread.
    """

    def __init__(self, pids: dict[str, int], warmup_step: int, every: int) -> None:
        self.pids = pids
        self.warmup_step = max(1, warmup_step)
        self.every = max(1, every)
        self.samples: list[Sample] = []
        self.error: ProcessGone | None = None
        self._step = 0
        self._started_at: float | None = None
        self._final = False
        self._condition = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="soak-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def advance(self, step: int) -> None:
        with self._condition:
            if self._started_at is None:
                self._started_at = time.monotonic()
            self._step = step
            self._condition.notify()

    def finish(self) -> list[Sample]:
        """The end sample (at the current step), then the thread stops."""
        with self._condition:
            self._final = True
            self._condition.notify()
        self._thread.join()
        return self.samples

    def _take(self, step: int, kind: Literal["warmup", "start", "periodic", "end"]) -> None:
        elapsed = 0.0 if self._started_at is None else time.monotonic() - self._started_at
        processes = {name: read_process(pid) for name, pid in self.pids.items()}
        self.samples.append(Sample(step=step, seconds=elapsed, kind=kind, processes=processes))

    def _next_threshold(self, step: int, started: bool) -> int:
        if not started:
            return min(self.warmup_step, 1 + (step - 1) // self.every * self.every + self.every)
        # the next multiple of `every` after this step, counted from the start sample
        return self.warmup_step + (step - self.warmup_step) // self.every * self.every + self.every

    def _loop(self) -> None:
        threshold, started = min(1, self.warmup_step), False
        try:
            while True:
                with self._condition:
                    self._condition.wait_for(lambda: self._final or self._step >= threshold)  # noqa: B023 (called within this iteration)
                    step, final = self._step, self._final
                if final:
                    if started:
                        if self.samples[-1].kind == "periodic" and self.samples[-1].step == step:
                            self.samples.pop()  # the last step crossed a threshold too: one sample of it
                        self._take(step, "end")
                    return
                kind = "periodic" if started else ("start" if step >= self.warmup_step else "warmup")
                self._take(step, kind)
                started = started or kind == "start"
                threshold = self._next_threshold(step, started)
        except ProcessGone as exc:
            self.error = exc

    @property
    def judged(self) -> list[Sample]:
        """The start sample and what follows it: what the goals are judged on."""
        return [s for s in self.samples if s.kind != "warmup"]
