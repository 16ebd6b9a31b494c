"""The pure ε of k-ary randomised response (party B's labels, docs/label-privacy.md)."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import dp_accounting as dpa

# 60 significant digits for ln: far below a float's 17, so the rounding decision below is safe
_RR_DIGITS = 60


def randomized_response_epsilon(noise_parameter: float, num_buckets: int) -> float:
    """Pure ε of k-ary randomised response with noise parameter p, never below the truth.

    With probability p the output is uniform over the k buckets, else the input (dp-accounting's
    ``RandomizedResponseDpEvent``). Under "replace one input" the largest likelihood ratio is
    Pr[o = x | x] / Pr[o = x | x'] = (1 − p + p/k) / (p/k), so

        (RR1)  ε = ln((1 − p + p/k) / (p/k)) = ln(1 + k(1 − p)/p),

    ∞ at p = 0 and 0 at p = 1. ln is evaluated in 60-digit decimal arithmetic (p as a float is
    an exact binary fraction) and returned as the smallest float at or above it, so a
    mechanism calibrated to exactly ε is charged exactly ε.
    """
    p, k = float(noise_parameter), int(num_buckets)
    if not 0.0 <= p <= 1.0 or k < 2:
        raise ValueError(f"randomised response needs p in [0, 1] and k >= 2, got p={p}, k={k}")
    if p == 0.0:
        return math.inf
    if p == 1.0:
        return 0.0
    with localcontext() as context:
        context.prec = _RR_DIGITS
        exact_p = Decimal(p)  # exact: a float is a binary fraction
        log_ratio = (1 + k * (1 - exact_p) / exact_p).ln()
        epsilon = float(log_ratio)
        # the decimal ln is within ~1e-59 of the truth: demand that much headroom
        if Decimal(epsilon) < log_ratio * (1 + Decimal(10) ** (8 - _RR_DIGITS)):
            epsilon = math.nextafter(epsilon, math.inf)
    return epsilon


def _lone_randomized_response(event: dpa.DpEvent) -> dpa.RandomizedResponseDpEvent | None:
    """The one RandomizedResponseDpEvent ``event`` runs exactly once, if that is all it does.

    No-ops and empty compositions around it are allowed; anything else, or two runs, is None.
    """
    found: list[dpa.DpEvent] = []

    def walk(part: dpa.DpEvent, count: int) -> bool:
        if isinstance(part, dpa.NoOpDpEvent) or count == 0:
            return True
        if isinstance(part, dpa.SelfComposedDpEvent):
            return walk(part.event, count * part.count)
        if isinstance(part, dpa.ComposedDpEvent):
            return all(walk(inner, count) for inner in part.events)
        if isinstance(part, dpa.RandomizedResponseDpEvent) and count == 1:
            found.append(part)
            return True
        return False

    if walk(event, 1) and len(found) == 1:
        return found[0]  # type: ignore[return-value]
    return None
