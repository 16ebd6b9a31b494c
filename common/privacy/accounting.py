"""ε of a DpEvent at δ, and calibration of a noise multiplier to a target ε.

Two accountants from dp-accounting, chosen per event and named in every result:

* ``gaussian-exact``: when an event is a composition of Gaussian mechanisms (and
  no-ops), the composition is itself a Gaussian mechanism with
  σ_eff = (Σ_i n_i / z_i²)^(-1/2), and ε follows exactly from the analytic Gaussian
  mechanism (Balle & Wang 2018, eq. 6), via ``dp_accounting.get_epsilon_gaussian``.
  We re-check the returned ε against δ ourselves and move it up if the root finder
  landed a hair below the true value: ε is never rounded down.
* ``pld``: dp-accounting's privacy-loss-distribution accountant (pessimistic
  discretisation) for every other event.

A cross-check in the tests shows both agree where both apply.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import dp_accounting as dpa
from dp_accounting.pld import pld_privacy_accountant
from scipy.special import log_ndtr

from vesper.common.privacy.events import event_from_json, event_to_json


@dataclass(frozen=True)
class EpsilonResult:
    epsilon: float
    accountant: str


def _gaussian_log_delta(sigma: float, epsilon: float) -> float:
    """log δ(ε) of the Gaussian mechanism with sensitivity 1 and std σ (Balle & Wang 2018, eq. 6)."""
    t = epsilon * sigma + 1.0 / (2.0 * sigma)
    x = float(log_ndtr(1.0 / sigma - t))
    y = epsilon + float(log_ndtr(-t))
    if y >= x:
        return -math.inf
    return x + math.log1p(-math.exp(y - x))


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """Exact ε of one Gaussian mechanism (sensitivity 1, std σ) at δ, never below the truth."""
    if sigma == 0:
        return math.inf
    if math.isinf(sigma):
        return 0.0
    epsilon = float(dpa.get_epsilon_gaussian(sigma, delta))
    log_delta = math.log(delta)
    step = 1e-12 * max(1.0, epsilon)
    while epsilon > 0 and _gaussian_log_delta(sigma, epsilon) > log_delta:
        epsilon += step
        step *= 2
    return epsilon


def _gaussian_precision(event: dpa.DpEvent) -> float | None:
    """Σ n_i / z_i² if ``event`` is made only of Gaussian, no-op and composition events."""
    if isinstance(event, dpa.NoOpDpEvent):
        return 0.0
    if isinstance(event, dpa.GaussianDpEvent):
        z = event.noise_multiplier
        return math.inf if z == 0 else 1.0 / (z * z)
    if isinstance(event, dpa.SelfComposedDpEvent):
        inner = _gaussian_precision(event.event)
        if inner is None:
            return None
        return 0.0 if event.count == 0 else inner * event.count
    if isinstance(event, dpa.ComposedDpEvent):
        total = 0.0
        for part in event.events:
            inner = _gaussian_precision(part)
            if inner is None:
                return None
            total += inner
        return total
    return None


@lru_cache(maxsize=4096)
def _epsilon_cached(event_json: str, delta: float) -> EpsilonResult:
    event = event_from_json(event_json)
    precision = _gaussian_precision(event)
    if precision is not None:
        if precision == 0:
            return EpsilonResult(0.0, "gaussian-exact")
        if math.isinf(precision):
            return EpsilonResult(math.inf, "gaussian-exact")
        return EpsilonResult(gaussian_epsilon(1.0 / math.sqrt(precision), delta), "gaussian-exact")
    if _contains_non_private(event):
        return EpsilonResult(math.inf, "pld")
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(event)
    return EpsilonResult(float(accountant.get_epsilon(delta)), "pld")


def _contains_non_private(event: dpa.DpEvent) -> bool:
    if isinstance(event, dpa.NonPrivateDpEvent):
        return True
    if isinstance(event, (dpa.SelfComposedDpEvent, dpa.PoissonSampledDpEvent)):
        return _contains_non_private(event.event)
    if isinstance(event, dpa.ComposedDpEvent):
        return any(_contains_non_private(e) for e in event.events)
    return False


def epsilon_of(event: dpa.DpEvent, delta: float) -> EpsilonResult:
    """ε at δ of ``event``, with the name of the accountant that produced it."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return _epsilon_cached(event_to_json(event), float(delta))


def calibrate(
    make_event: Callable[[float], dpa.DpEvent],
    target_epsilon: float,
    delta: float,
    *,
    z_max: float = 1e6,
) -> tuple[float, EpsilonResult]:
    """Smallest noise multiplier z (to ~1e-9 relative) with ε(make_event(z)) ≤ target.

    Bisection in log z over :func:`epsilon_of`; returns the upper end of the final
    bracket, so the result always satisfies the target. Raises ValueError when even
    ``z_max`` does not.
    """
    if not target_epsilon > 0 or math.isinf(target_epsilon):
        raise ValueError(f"target epsilon must be finite and > 0, got {target_epsilon}")
    high = 1.0
    while epsilon_of(make_event(high), delta).epsilon > target_epsilon:
        high *= 2.0
        if high > z_max:
            raise ValueError(
                f"no noise multiplier up to {z_max:g} brings this plan to epsilon <= {target_epsilon}"
            )
    low = high / 2.0
    while low > 1e-6 and epsilon_of(make_event(low), delta).epsilon <= target_epsilon:
        high, low = low, low / 2.0
    for _ in range(100):
        if high / low - 1.0 < 1e-9:
            break
        mid = math.sqrt(low * high)
        if epsilon_of(make_event(mid), delta).epsilon <= target_epsilon:
            high = mid
        else:
            low = mid
    return high, epsilon_of(make_event(high), delta)
