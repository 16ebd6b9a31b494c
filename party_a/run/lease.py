"""The lease of a run's one trainer, kept alive at the accountant while the trainer runs.

The accountant refuses a second trainer of a run — a resume started while the run still
trains, or two resumes at once — while the first one's lease is live (accountant/leases.py).
A trainer renews its lease every third of its time to live from a thread of its own, so a
step that waits long on party B does not let it lapse. If the accountant answers that another
trainer now holds the run, this one has lost it (it stalled past its lease and a resume took
over): ``lost`` is set, and the trainer stops without touching the run again.
"""

from __future__ import annotations

import threading

from vesper.common.accountant_client import AccountantClient, LeaseRefused, PeerError


class LeaseKeeper:
    def __init__(self, accountant: AccountantClient, run_id: str, ttl_s: float) -> None:
        self.accountant = accountant
        self.run_id = run_id
        self.period_s = max(ttl_s / 3.0, 0.1)
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"lease-{run_id}", daemon=True)

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _renew(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.accountant.renew_lease(self.run_id)
            except LeaseRefused:
                self.lost.set()
                return
            except PeerError:
                continue  # the accountant may be restarting: the next charge retries, the next renewal too
