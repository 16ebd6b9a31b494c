"""The typed errors of party A's worker group."""

from __future__ import annotations

from vesper.party_a.peers import PeerLost


class WorkersUnsupported(ValueError):
    """A run asks for W > 1 workers with something they do not support; nothing was charged."""


class WorkerLost(PeerLost):
    """A worker process stopped (killed, crashed, or silent past ``party_a.step_timeout_s``): the
    run is interrupted, not failed, and resumes from its last checkpoint (``vesper train --resume``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, peer="worker pool of party A")
