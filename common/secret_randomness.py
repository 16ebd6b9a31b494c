"""Where each party's secret randomness starts (A's sampling and noise, B's label mechanisms)."""

from __future__ import annotations

import os


def secret_base(secret_seed: int | None, run_seed: int) -> int:
    """A seed the other party cannot know: fresh OS randomness, or (tests only) one derived
    from the party's configured ``secret_seed`` and the run's seed, so runs are repeatable."""
    if secret_seed is None:
        return int.from_bytes(os.urandom(8), "little") >> 1
    return (secret_seed * 1_000_003 + run_seed) % (1 << 62)
