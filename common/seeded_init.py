"""Initial parameters under the run's public seed, one build at a time per process.

torch initialises parameters from its process-wide CPU generator. The parties build their
models under ``fork_rng`` + ``manual_seed(run seed)``, so that a run's initial parameters
depend on its seed alone: two runs of one seed start alike, and an extractor's edge-free path
starts as the MLP run does (docs/utility.md, section 7). Two builds at once in one process
(the in-process cluster's jobs, coordinator/in_process.py; a service setting up two runs)
would seed that one generator in turn and each take draws meant for the other, so
:func:`seeded` holds a process-wide lock around the fork, the seed and the build. Nothing of a
run draws from the process-wide generator outside such a build: A's dropout is keyed
(party_a/keyed_dropout.py), B's has a generator of its own (party_b/seeded_dropout.py).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_BUILDING = threading.RLock()  # re-entrant: a build may build another (an extractor and its path)


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """torch's CPU generator seeded with ``seed`` for the block, restored after it, and no other
    thread's ``seeded`` block in between."""
    with _BUILDING, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
