"""Calibration: the smallest noise multiplier z that brings a plan to a target ε.

:func:`calibrate` searches a cheap curve first (the exact Gaussian, RDP on a sparse set of
orders, or a small coarse PLD, the "scout") and the accountant's own curve last, so that
the z it returns is charged exactly the ε it reports (docs/accounting.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import dp_accounting as dpa
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent

from vesper.common.privacy.accounting.dispatch import _check_accountant, epsilon_of
from vesper.common.privacy.accounting.gaussian import _gaussian_precision
from vesper.common.privacy.accounting.pld import _pld_scout
from vesper.common.privacy.accounting.rdp import _RDP_SKELETON_ORDERS, RDP_ORDERS, _rdp, _rdp_supports
from vesper.common.privacy.accounting.result import EpsilonResult
from vesper.common.privacy.accounting.structure import _contains, _contains_zcdp
from vesper.common.privacy.names import AccountantName

_Curve = Callable[[float], float]
# one secant step moves z by at most 1.5×: a bad slope costs an evaluation, not a detour
_MAX_LOG_STEP = math.log(1.5)
_Z_MIN = 1e-6


def calibrate(
    make_event: Callable[[float], dpa.DpEvent],
    target_epsilon: float,
    delta: float,
    *,
    accountant: AccountantName = "pld",
    z_max: float = 1e6,
    rtol: float | None = None,
) -> tuple[float, EpsilonResult]:
    """Smallest noise multiplier z with ε(make_event(z)) ≤ target under ``accountant``.

    The returned result is exactly ``epsilon_of(make_event(z), delta, accountant)``, so a
    later charge or ledger replay sees the same number, and it always meets the target.
    It is also close to it: normally target·(1 − ``rtol``) ≤ ε, or z is within 1e-9
    (exact Gaussian) / 1e-6 (others) of a z that misses the target. ``rtol`` defaults to
    0 for ``gaussian-exact`` (so z is exact to 1e-9), 1e-6 for ``rdp``, and 1e-3 for the PLD
    family: its own pessimism is 1e-4 to 6e-3 (interval 1e-4 to 1e-3), and each PLD
    evaluation is costly (docs/accounting.md), so a tighter window would buy digits that are not there.

    Search (docs/accounting.md, with the measured costs): an exact-Gaussian curve is cheap and is
    searched directly. Otherwise RDP on a sparse set of orders brackets z;
    ``rdp`` then refines on growing subsets of orders and checks once with all of them,
    and ``pld`` runs secant steps on a small coarse PLD, then on the real one from there
    (typically 2-4 real evaluations). Raises ValueError when ``z_max`` misses the target.
    """
    if not target_epsilon > 0 or math.isinf(target_epsilon):
        raise ValueError(f"target epsilon must be finite and > 0, got {target_epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    accountant = _check_accountant(accountant)

    def final(z: float) -> EpsilonResult:
        return epsilon_of(make_event(z), delta, accountant)

    def final_curve(z: float) -> float:
        return final(z).epsilon

    probe = make_event(1.0)
    if accountant == "pld" and _gaussian_precision(probe) is not None:
        z = _search(final_curve, target_epsilon, 1.0, z_max, z_rtol=1e-9, eps_rtol=_tolerance(rtol, 0.0))
    elif _contains(probe, MixtureOfGaussiansDpEvent):
        # each final evaluation builds mixture PLDs (slow: docs/accounting.md): search the coarse scout
        # curve first, then take the few final steps of the PLD path (_calibrate_pld)
        scout = _scout_curve(make_event, delta)
        z_scout = _search(scout, target_epsilon, 1.0, z_max, z_rtol=1e-3, eps_rtol=1e-2)
        z = _calibrate_pld(scout, final_curve, target_epsilon, z_scout, -1.0, z_max, eps_rtol=_tolerance(rtol, 1e-3))
    elif not _rdp_supports(probe):
        z = _search(final_curve, target_epsilon, 1.0, z_max, z_rtol=1e-6, eps_rtol=_tolerance(rtol, 1e-4))
    else:
        # pld charges zCDP plans by RDP too ("rdp-zcdp")
        by_rdp = accountant == "rdp" or _contains_zcdp(probe)
        z = _calibrate_via_rdp(make_event, final, target_epsilon, delta, z_max, by_rdp=by_rdp, rtol=rtol)
    return z, final(z)


def _tolerance(rtol: float | None, default: float) -> float:
    """:func:`calibrate`'s ``rtol``, or the default of the path it takes."""
    return default if rtol is None else rtol


def _scout_curve(make_event: Callable[[float], dpa.DpEvent], delta: float) -> _Curve:
    """The scout PLD's ε as a function of z, memoised (searches come back to a z)."""
    scouted: dict[float, float] = {}

    def scout(z: float) -> float:
        if z not in scouted:
            scouted[z] = _pld_scout(make_event(z), delta)
        return scouted[z]

    return scout


def _calibrate_via_rdp(
    make_event: Callable[[float], dpa.DpEvent],
    final: Callable[[float], EpsilonResult],
    target: float,
    delta: float,
    z_max: float,
    *,
    by_rdp: bool,
    rtol: float | None,
) -> float:
    """:func:`calibrate` for RDP-supported plans: bracket z on the sparse RDP orders, then
    refine it on RDP (``by_rdp``: the final ε comes from RDP) or on the PLD."""

    def skeleton(z: float) -> float:
        return _rdp(make_event(z), delta, _RDP_SKELETON_ORDERS)[0]

    z_rdp = _search(skeleton, target, 1.0, z_max, z_rtol=1e-3, eps_rtol=1e-3)
    if by_rdp:
        return _refine_rdp(make_event, final, target, delta, z_rdp, z_max, eps_rtol=_tolerance(rtol, 1e-6))
    # The PLD root lies below RDP's (by 1-30 %). RDP's ε is dominated by log(1/δ)/(α−1)
    # and falls more slowly in z than the PLD's (slope −0.5 against −3 for 1,000 steps
    # of q = 0.0034); the PLD's slope is about −1 for large z and steeper below, so the
    # first step takes the steeper of −2 and RDP's slope over the last 10 % of z.
    slope = min(_slope(z_rdp / 1.1, skeleton(z_rdp / 1.1), z_rdp, skeleton(z_rdp)), -2.0)

    def final_curve(z: float) -> float:
        return final(z).epsilon

    scout = _scout_curve(make_event, delta)
    return _calibrate_pld(scout, final_curve, target, z_rdp, slope, z_max, eps_rtol=_tolerance(rtol, 1e-3))


def _calibrate_pld(
    scout: _Curve, final: _Curve, target: float, z0: float, slope: float, z_max: float, *, eps_rtol: float
) -> float:
    """Find the PLD's z mostly on the cheap scout curve (one step of "space mapping").

    1. Solve scout = target and evaluate the final curve there.
    2. The two curves differ near the root by a slowly varying ratio: solve
       scout = target / ratio and evaluate the final curve again.
    3. If neither landed in the window, secant steps on the final curve from those two
       points (its own slope, which the scout's only approximates).

    Usually two or three final evaluations where a secant on the final
    curve alone needs three to five.
    """
    low_end, middle = target * (1.0 - eps_rtol), target * (1.0 - eps_rtol / 2.0)
    # the scout window is a quarter of the final one, so a steady ratio lands inside it
    z1, slope = _secant(scout, target, z0, slope, z_max, eps_rtol=eps_rtol / 4.0)
    v1 = final(z1)
    if low_end <= v1 <= target:
        return z1
    reference = scout(z1)
    if not (0 < v1 < math.inf and 0 < reference < math.inf):
        return _secant(final, target, z1, slope, z_max, eps_rtol=eps_rtol)[0]
    z2, slope = _secant(scout, middle * reference / v1, z1, slope, z_max, eps_rtol=eps_rtol / 4.0)
    v2 = final(z2)
    if low_end <= v2 <= target:
        return z2
    return _secant(final, target, z2, _slope(z1, v1, z2, v2), z_max, eps_rtol=eps_rtol)[0]


def _slope(z0: float, e0: float, z1: float, e1: float) -> float:
    """d log ε / d log z between two points; −1 when it is not a finite negative number."""
    if not (0 < e0 < math.inf and 0 < e1 < math.inf) or z0 == z1 or e0 == e1:
        return -1.0
    slope = (math.log(e1) - math.log(e0)) / (math.log(z1) - math.log(z0))
    return slope if slope < 0 else -1.0


def _bracket(
    curve: _Curve, target: float, z: float, *, factor: float = 2.0, z_max: float
) -> tuple[float, float, float, float] | None:
    """(lo, ε(lo), hi, ε(hi)) with ε(lo) > target ≥ ε(hi), walking from ``z``.

    The step factor squares after each miss. None when even :data:`_Z_MIN` meets the target.
    """
    value = curve(z)
    if value > target:
        while True:
            if z >= z_max:
                raise ValueError(f"no noise multiplier up to {z_max:g} brings this plan to epsilon <= {target}")
            step = min(z * factor, z_max)
            upper = curve(step)
            if upper <= target:
                return z, value, step, upper
            z, value, factor = step, upper, factor * factor
    while True:
        if z <= _Z_MIN:
            return None
        step = max(z / factor, _Z_MIN)
        lower = curve(step)
        if lower > target:
            return step, lower, z, value
        z, value, factor = step, lower, factor * factor


def _solve(
    curve: _Curve,
    target: float,
    bracket: tuple[float, float, float, float],
    *,
    z_rtol: float,
    eps_rtol: float,
    max_evaluations: int = 100,
) -> tuple[float, float, float, float]:
    """Shrink a bracket of ``curve`` = target by regula falsi on (log z, log ε), Illinois variant.

    ε(z) is close to a power law, so log-log secant steps converge in a few evaluations;
    the Illinois halving keeps both ends moving. Stops once hi/lo − 1 ≤ ``z_rtol`` or
    ε(hi) ≥ target · (1 − ``eps_rtol``). The bracket is kept throughout, so ``hi``
    always meets the target.
    """
    lo, f_lo, hi, f_hi = bracket
    g_lo = math.log(f_lo / target) if math.isfinite(f_lo) else math.inf
    g_hi = math.log(f_hi / target) if f_hi > 0 else -math.inf
    side = 0
    for _ in range(max_evaluations):
        if hi / lo - 1.0 <= z_rtol or f_hi >= target * (1.0 - eps_rtol):
            break
        a, b = math.log(lo), math.log(hi)
        x = (a + b) / 2.0
        if math.isfinite(g_lo) and math.isfinite(g_hi) and g_lo != g_hi:
            secant = b - g_hi * (b - a) / (g_hi - g_lo)
            margin = 1e-3 * (b - a)  # stay strictly inside so the bracket always shrinks
            x = min(max(secant, a + margin), b - margin)
        z = math.exp(x)
        value = curve(z)
        g = math.log(value / target) if 0 < value < math.inf else (math.inf if value > 0 else -math.inf)
        if value <= target:
            hi, f_hi, g_hi = z, value, g
            if side == 1:
                g_lo /= 2.0
            side = 1
        else:
            lo, f_lo, g_lo = z, value, g
            if side == -1:
                g_hi /= 2.0
            side = -1
    return lo, f_lo, hi, f_hi


def _search(curve: _Curve, target: float, z0: float, z_max: float, *, z_rtol: float, eps_rtol: float) -> float:
    """Bracket from ``z0``, then :func:`_solve`; the returned z meets the target on ``curve``."""
    bracket = _bracket(curve, target, z0, z_max=z_max)
    if bracket is None:
        return _Z_MIN
    return _solve(curve, target, bracket, z_rtol=z_rtol, eps_rtol=eps_rtol)[2]


def _secant(
    curve: _Curve, target: float, z0: float, slope: float, z_max: float, *, eps_rtol: float
) -> tuple[float, float]:
    """(z, slope) with target·(1 − eps_rtol) ≤ curve(z) ≤ target, by secant steps on (log z, log ε).

    Each step aims at the middle of that window through the local power law ε ∝ z^slope:
    first ``slope``, then the secant of the last two evaluations. Once the root is
    bracketed, a step that would leave the bracket is replaced by its geometric midpoint,
    so the search cannot diverge; after 12 steps it returns the best z meeting the target
    (or falls back to :func:`_search` if none did).
    """
    low_end, aim = target * (1.0 - eps_rtol), target * (1.0 - eps_rtol / 2.0)
    lo, hi = 0.0, math.inf  # largest z seen missing the target, smallest z seen meeting it
    z, value = z0, curve(z0)
    for _ in range(12):
        if value <= target:
            hi = min(hi, z)
            if value >= low_end:
                break
        else:
            lo = max(lo, z)
        if 0 < value < math.inf:
            log_step = (math.log(aim) - math.log(value)) / slope
            step = z * math.exp(max(min(log_step, _MAX_LOG_STEP), -_MAX_LOG_STEP))
        else:
            step = z * 1.5 if value > target else z / 1.5
        if not lo < step < hi:
            if lo == 0 or math.isinf(hi):
                break  # cannot happen with a negative slope; stay safe
            step = math.sqrt(lo * hi)
        if step > z_max or hi / max(lo, _Z_MIN) - 1.0 < 1e-9:
            break
        stepped = curve(step)
        slope = _slope(z, value, step, stepped) if 0 < stepped < math.inf and stepped != value else slope
        z, value = step, stepped
    if math.isinf(hi):
        hi = _search(curve, target, z, z_max, z_rtol=1e-6, eps_rtol=eps_rtol)
    return hi, slope


def _refine_rdp(
    make_event: Callable[[float], dpa.DpEvent],
    final: Callable[[float], EpsilonResult],
    target: float,
    delta: float,
    z0: float,
    z_max: float,
    *,
    eps_rtol: float,
) -> float:
    """Solve on a subset of RDP_ORDERS, then check the optimum with all of them.

    RDP at each order is computed independently, so a subset's ε is ≥ the full set's, and
    equal when the full set's optimum is in the subset. The subset is the skeleton plus
    every order within 20 % of the current optimum; if the full set's optimum at the
    solution lies outside it, its neighbourhood is added and the search repeated.
    ``z0`` meets the target on the skeleton, hence on every superset.
    """
    orders = set(_RDP_SKELETON_ORDERS)
    optimum = _rdp(make_event(z0), delta, _RDP_SKELETON_ORDERS)[1]
    z = z0
    for _ in range(3):
        orders |= {a for a in RDP_ORDERS if optimum / 1.2 <= a <= optimum * 1.2}
        subset = tuple(sorted(orders))

        def curve(x: float, subset: tuple[float, ...] = subset) -> float:
            return _rdp(make_event(x), delta, subset)[0]

        # more orders can only lower ε: the root is at or below z, usually within a few per cent
        bracket = _bracket(curve, target, z, factor=1.02, z_max=z_max)
        if bracket is None:
            return _Z_MIN
        z = _solve(curve, target, bracket, z_rtol=1e-9, eps_rtol=eps_rtol)[2]
        full_optimum = final(z).order  # memoised: calibrate's own final(z) reuses it
        if full_optimum in orders:
            break
        optimum = full_optimum
    return z
