"""The exact ε of the Gaussian mechanism (Balle & Wang [BW18, eq. 6]).

An event made only of Gaussian mechanisms and no-ops is one Gaussian mechanism with
σ_eff = (Σ_i n_i / z_i²)^(-1/2) (:func:`_gaussian_precision`), so the ``pld`` accountant
charges it :func:`gaussian_epsilon` of σ_eff (``gaussian-exact``).
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import scipy.optimize
from scipy.special import log_ndtr


def _gaussian_log_delta(sigma: float, epsilon: float) -> float:
    """log δ(ε) of the Gaussian mechanism with sensitivity 1 and std σ [BW18, eq. 6]."""
    t = epsilon * sigma + 1.0 / (2.0 * sigma)
    x = float(log_ndtr(1.0 / sigma - t))
    y = epsilon + float(log_ndtr(-t))
    if y >= x:
        return -math.inf
    return x + math.log1p(-math.exp(y - x))


def _dpa_log_delta(sigma: float, eps: float) -> float:
    """``dp_accounting.gaussian_mechanism._get_log_delta`` [BW18, eq. 6] with
    ``scipy.special.log_ndtr`` where it calls ``scipy.stats.norm.logcdf``: logcdf computes
    log_ndtr behind costly argument checks (docs/performance-notes.md), so these are the same floating-point
    operations and the same bits."""
    t_star = eps * sigma + 1 / (2 * sigma)
    x = log_ndtr(1 / sigma - t_star)
    y = eps + log_ndtr(-t_star)
    return x + np.log1p(-np.exp(y - x)) if y <= x else -np.inf


def _search_gaussian_epsilon(sigma: float, delta: float, tol: float = 1.0e-12) -> float:
    """``dp_accounting.get_epsilon_gaussian(sigma, delta)`` step for step, bit-identical
    (tests/test_accounting_fast_gaussian.py) and much faster (docs/performance-notes.md): the accountant
    computes one for every counted charge, while party A waits."""
    if delta >= 1:
        return 0.0
    if delta <= 0:
        return math.inf
    log_delta = np.log(delta)
    if _dpa_log_delta(sigma, 0) < log_delta:
        return 0.0  # (0, δ)-DP
    eps_lo, eps_hi = 0.0, 1.0
    while _dpa_log_delta(sigma, eps_hi) > log_delta:
        eps_lo, eps_hi = eps_hi, eps_hi * 10
    return scipy.optimize.brentq(lambda eps: _dpa_log_delta(sigma, eps) - log_delta, eps_lo, eps_hi, xtol=tol)


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """Exact ε of one Gaussian mechanism (sensitivity 1, std σ) at δ, never below the truth."""
    if sigma == 0:
        return math.inf
    if math.isinf(sigma):
        return 0.0
    epsilon = float(_search_gaussian_epsilon(sigma, delta))
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
        square = z * z  # 0 for z below ~1e-162 as well: no noise to speak of
        return math.inf if square == 0 else 1.0 / square
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
