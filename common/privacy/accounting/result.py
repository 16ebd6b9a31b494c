"""What every accountant returns: ε and the name of the accountant that produced it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EpsilonResult:
    """ε and the accountant that produced it (see the package docstring for the names).

    ``discretization`` is the PLD value-discretisation interval that was used, and
    ``order`` the optimal Rényi order, when they apply.
    """

    epsilon: float
    accountant: str
    discretization: float | None = None
    order: float | None = None
