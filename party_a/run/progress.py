"""What a run tells the coordinator while it runs, and how it learns the coordinator left."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


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


class Cancelled(RuntimeError):
    """The coordinator went away; the run stops after the current step."""
