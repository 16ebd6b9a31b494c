"""A run has one trainer: the lease of the trainer that may charge it, kept by the accountant.

Party A's trainer draws a random lease id and announces it with the run's id before it sets
the run up with party B; it renews it while it lives (every third of its time to live). The
accountant refuses to create, reopen, charge or close a run under another lease that is still
live, so a second trainer of one run — a resume started while the run still trains, or two
resumes at once — is refused before it touches party B or the ledger. A trainer killed with
its run still active leaves a lease that expires after its time to live; a resume then takes
the run over. Calls without a lease (older clients, party B's label ledgers) are not checked.

Leases live in the accountant's memory: after a restart of the accountant the first trainer
that calls with a lease holds the run again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

MIN_TTL_S, MAX_TTL_S = 1.0, 3600.0


class LeaseHeld(Exception):
    """Another trainer's lease on the run is live."""

    def __init__(self, run_id: str, renewed_s_ago: float, expires_in_s: float) -> None:
        super().__init__(
            f"run {run_id!r} has a live trainer (its lease was renewed {renewed_s_ago:.1f} s ago and expires in "
            f"{expires_in_s:.1f} s without renewal): a run has one trainer, so it can be resumed only once that "
            "trainer has stopped"
        )
        self.expires_in_s = expires_in_s


@dataclass
class _Lease:
    holder: str
    renewed: float  # time.monotonic()
    ttl_s: float

    def live(self, now: float) -> bool:
        return now - self.renewed < self.ttl_s


class Leases:
    def __init__(self, clock=time.monotonic) -> None:
        self._leases: dict[str, _Lease] = {}
        self._announced: set[str] = set()
        self._clock = clock
        self._lock = threading.Lock()

    def acquire(self, run_id: str, holder: str, ttl_s: float, *, announce: bool = False) -> float:
        """``holder`` now holds ``run_id`` (LeaseHeld if another live lease does); its expiry in seconds."""
        if not holder:
            return 0.0
        with self._lock:
            lease = self._take(run_id, holder, ttl_s)
            if announce:
                self._announced.add(run_id)
            return lease.ttl_s

    def renew(self, run_id: str, holder: str, ttl_s: float | None = None) -> None:
        """A call of ``holder`` on ``run_id``: refused (LeaseHeld) under another live lease; renews its own,
        and takes the run back if no live lease is held (after an accountant restart)."""
        if not holder:
            return
        with self._lock:
            current = self._leases.get(run_id)
            self._take(run_id, holder, ttl_s if ttl_s else (current.ttl_s if current else MAX_TTL_S / 60))

    def release(self, run_id: str, holder: str) -> None:
        """The run closed: its lease ends (LeaseHeld if another trainer's lease is live)."""
        with self._lock:
            if holder:
                self._check(run_id, holder, self._clock())
            self._leases.pop(run_id, None)

    def announced(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._announced

    def created(self, run_id: str) -> None:
        """The announced run now exists in the ledger: existence answers from here on."""
        with self._lock:
            self._announced.discard(run_id)

    def _take(self, run_id: str, holder: str, ttl_s: float) -> _Lease:
        now = self._clock()
        self._check(run_id, holder, now)
        lease = _Lease(holder, now, min(max(float(ttl_s), MIN_TTL_S), MAX_TTL_S))
        self._leases[run_id] = lease
        return lease

    def _check(self, run_id: str, holder: str, now: float) -> None:
        current = self._leases.get(run_id)
        if current is not None and current.holder != holder and current.live(now):
            raise LeaseHeld(run_id, now - current.renewed, current.ttl_s - (now - current.renewed))
