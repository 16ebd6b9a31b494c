"""ε of a DpEvent at δ, and calibration of a noise multiplier to a target ε.

Two accountants can be asked for (``accountant=``); every :class:`EpsilonResult`
names the one that actually produced its number (docs/accounting.md):

``"pld"`` (the default)
    * ``gaussian-exact``: an event made only of Gaussian mechanisms and no-ops is one
      Gaussian mechanism with σ_eff = (Σ_i n_i / z_i²)^(-1/2) — that is also what its
      privacy loss distribution is — so ε comes exactly from the analytic Gaussian
      mechanism (Balle & Wang 2018, eq. 6) via ``dp_accounting.get_epsilon_gaussian``,
      re-checked against δ and moved up if the root finder landed a hair low.
    * ``pld``: dp-accounting's privacy-loss distributions with pessimistic
      (connect-the-dots) discretisation at interval 1e-4.
    * ``pld-coarse``: the same at a coarser interval (2e-4, 5e-4, 1e-3 or 2e-3), the
      finest within :data:`PLD_MAX_SINGLE_POINTS` and :data:`PLD_MAX_COMPOSED_POINTS`
      when 1e-4 is not; still pessimistic, so still an upper bound.
    * ``rdp-fallback``: when even 2e-3 is too large, dp-accounting's RDP accountant.
    * ``pld`` also covers ``MixtureOfGaussiansDpEvent`` (a Gaussian whose sensitivity is
      random, docs/extractors/heterpoisson.md) with dp-accounting's mixture PLD; there is
      no RDP of a mixture here, so such an event has no ``rdp-fallback``: the PLD ladder
      ends at its coarsest interval, and the ``rdp`` accountant refuses it.
    * ``rdp-zcdp``: an event containing a ``ZCDpEvent`` (exponential-mechanism rounds,
      docs/extractors/dpar.md) has no privacy loss distribution here, so the whole
      composition is accounted by dp-accounting's RDP accountant (ρα + ξ at each order).
    * ``rr-exact``: an event that is exactly one k-ary randomised response
      (``RandomizedResponseDpEvent(p, k)``, party B's labels, docs/label-privacy.md) is
      pure ε-DP with ε = ln((1 − p + p/k) / (p/k)) (:func:`randomized_response_epsilon`),
      whatever δ; rounded up to the next float, never down. Any other composition holding
      randomised response goes through the PLD ladder (dp-accounting's
      ``from_randomized_response``) like every other mechanism.

``"rdp"``
    * ``rdp``: dp-accounting's ``RdpAccountant`` for every event, over
      :data:`RDP_ORDERS`, converted to (ε, δ) with its Proposition-12 bound (the
      VESPER paper's Lemma 2, eq. (10)). Randomised response is accounted under the
      replace-one relation, the only one dp-accounting has for it (see
      :func:`_rdp_accountant_for`).
    * ``rr-exact``: a lone randomised response also under ``rdp``, when its exact pure ε
      is below the RDP conversion (always, in practice: the conversion adds
      log(1/δ)/(α − 1) to an RDP that tends to the pure ε as α grows). Both are upper
      bounds, so the smaller one is; a run budgeted at the ε its RR was calibrated to
      would otherwise be refused its one charge.

ε is never rounded down: the analytic Gaussian is re-checked, the PLD rounding is
pessimistic and RDP is itself an upper bound.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from functools import lru_cache
from typing import Literal, get_args

import dp_accounting as dpa
import numpy as np
import scipy.optimize
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as loss_lib
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.special import log_ndtr

from vesper.common.privacy.events import event_from_json, event_to_json

Accountant = Literal["pld", "rdp"]

# Fractional orders 1.1, 1.2, ..., 10.9 (dp-accounting's default grid without the
# integers) plus every integer 2..256. The fractional orders matter: for the privacy
# contract's hidden-batch run the optimum is α = 4.7 (z = 0.69) and 3.1 (z = 0.56), and
# integers alone give ε = 4.17 instead of 4.01 at z = 0.69.
RDP_FRACTIONAL_ORDERS: tuple[float, ...] = tuple(1 + k / 10 for k in range(1, 100) if k % 10)
RDP_ORDERS: tuple[float, ...] = tuple(sorted(RDP_FRACTIONAL_ORDERS + tuple(float(a) for a in range(2, 257))))
# A sparse subset of RDP_ORDERS used only to *search* during calibration: the RDP of a
# Poisson-sampled Gaussian costs ~10 µs per term at integer α (α + 1 terms) and up to
# ~3 ms per fractional order near 1 (a slowly converging series), so the full set costs
# ~0.3 s per evaluation and this one ~15 ms. Final numbers always use RDP_ORDERS.
_RDP_SKELETON_ORDERS: tuple[float, ...] = (
    1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0,
)


class _ExcludedOrderFilter(logging.Filter):
    """Hide dp-accounting's warning that it dropped a fractional Rényi order.

    Its series for a fractional order can fail to converge (e.g. q = 0.1, z = 1, α < 2);
    it then logs a warning and gives that order ε = ∞, so the minimum over the other
    orders is still an upper bound. Calibration walks through such z on purpose.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "_compute_log_a_frac failed to converge" not in record.getMessage()


logging.getLogger("absl").addFilter(_ExcludedOrderFilter())

PLD_FINE_INTERVAL = 1e-4
# Coarser pessimistic intervals, tried in order. Measured on 10,000 steps of
# PoissonSampled(0.0034, Gaussian(z)) at δ = 1e-6, relative to interval 5e-5: at z = 1.15
# (ε = 1.63) +0.02 % at 2e-4, +0.15 % at 5e-4, +0.63 % at 1e-3, +2.5 % at 2e-3; at
# z = 0.54 (ε = 12.2) +0.02 % at 1e-3, +0.08 % at 2e-3. Small z has a wide loss range
# and so gets the coarse intervals, but also a large ε, so the relative error stays small.
PLD_COARSE_INTERVALS: tuple[float, ...] = (2e-4, 5e-4, 1e-3, 2e-3)
# Size limits that keep one PLD evaluation near 0.2 s on this project's 2-core machine:
# building a Poisson-sampled Gaussian PLD costs ~5 µs per point (summed over the REMOVE
# and ADD adjacencies), self-composition and the ε search ~1 µs per composed point.
PLD_MAX_SINGLE_POINTS = 30_000
PLD_MAX_COMPOSED_POINTS = 300_000
# Mixtures of Gaussians: dp-accounting 0.6.0 builds their PLD one grid point at a time
# (~0.5 ms per point, a Python bisection per point), so their single-run PLD is kept small
# and may use coarser intervals. The interval barely moves a mixture's ε: HeterPoisson's
# Cora plan (30 steps, 2 chunks) gives 10.2423 at 5e-4, 10.2424 at 5e-3, 10.2429 at 1e-2,
# each pessimistic (an upper bound). Measured on this project's 2-core machine.
MIXTURE_MAX_SINGLE_POINTS = 4_000
MIXTURE_MAX_SCOUT_POINTS = 1_000  # the calibration scout only guides the search
MIXTURE_EXTRA_INTERVALS: tuple[float, ...] = (5e-3, 1e-2, 2e-2)
# dp-accounting's default: tail mass dropped by the FFT self-composition, counted into δ.
_TAIL_MASS_TRUNCATION = 1e-15


@dataclass(frozen=True)
class EpsilonResult:
    """ε and the accountant that produced it (see the module docstring for the names).

    ``discretization`` is the PLD value-discretisation interval that was used, and
    ``order`` the optimal Rényi order, when they apply.
    """

    epsilon: float
    accountant: str
    discretization: float | None = None
    order: float | None = None


# -- exact Gaussian --------------------------------------------------------------------------


def _gaussian_log_delta(sigma: float, epsilon: float) -> float:
    """log δ(ε) of the Gaussian mechanism with sensitivity 1 and std σ (Balle & Wang 2018, eq. 6)."""
    t = epsilon * sigma + 1.0 / (2.0 * sigma)
    x = float(log_ndtr(1.0 / sigma - t))
    y = epsilon + float(log_ndtr(-t))
    if y >= x:
        return -math.inf
    return x + math.log1p(-math.exp(y - x))


def _dpa_log_delta(sigma: float, eps: float) -> float:
    """``dp_accounting.gaussian_mechanism._get_log_delta`` (Balle & Wang 2018, eq. 6) with
    ``scipy.special.log_ndtr`` where it calls ``scipy.stats.norm.logcdf``: logcdf computes
    log_ndtr behind about 0.2 ms of argument checks, so these are the same floating-point
    operations and the same bits."""
    t_star = eps * sigma + 1 / (2 * sigma)
    x = log_ndtr(1 / sigma - t_star)
    y = eps + log_ndtr(-t_star)
    return x + np.log1p(-np.exp(y - x)) if y <= x else -np.inf


def _search_gaussian_epsilon(sigma: float, delta: float, tol: float = 1.0e-12) -> float:
    """``dp_accounting.get_epsilon_gaussian(sigma, delta)`` step for step, bit-identical
    (tests/test_accounting_fast_gaussian.py) and about 50x faster: the accountant computes
    one for every counted charge, while party A waits (docs/performance.md)."""
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


def _contains(event: dpa.DpEvent, leaf: type[dpa.DpEvent]) -> bool:
    """Whether ``event`` has a leaf of type ``leaf`` anywhere in its composition tree."""
    if isinstance(event, leaf):
        return True
    if isinstance(event, (dpa.SelfComposedDpEvent, dpa.PoissonSampledDpEvent)):
        return _contains(event.event, leaf)
    if isinstance(event, dpa.ComposedDpEvent):
        return any(_contains(e, leaf) for e in event.events)
    return False


def _contains_zcdp(event: dpa.DpEvent) -> bool:
    """Whether ``event`` has a ZCDpEvent leaf (the PLD accountant cannot represent one)."""
    return _contains(event, dpa.ZCDpEvent)


def _contains_non_private(event: dpa.DpEvent) -> bool:
    return _contains(event, dpa.NonPrivateDpEvent)


# -- randomised response --------------------------------------------------------------------

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


# -- RDP -----------------------------------------------------------------------------------


def _rdp(event: dpa.DpEvent, delta: float, orders: Sequence[float]) -> tuple[float, float]:
    """(ε, optimal order) from dp-accounting's RDP of ``event`` over ``orders``.

    RDP composes additively, so the curve of SelfComposed(e, n) is n times e's curve:
    each distinct mechanism's curve is computed once (:func:`_mechanism_rdp`) and a
    ledger charge at count k costs a multiplication, not a new series evaluation.
    Raises ValueError for events the RDP accountant cannot account for (Laplace).
    """
    curve = _rdp_curve(event, tuple(orders))
    epsilon, order = rdp_privacy_accountant.compute_epsilon(list(orders), curve, delta)
    return float(epsilon), float(order)


def _rdp_curve(event: dpa.DpEvent, orders: tuple[float, ...]) -> np.ndarray:
    if isinstance(event, dpa.SelfComposedDpEvent):
        return event.count * _rdp_curve(event.event, orders) if event.count else np.zeros(len(orders))
    if isinstance(event, dpa.ComposedDpEvent):
        return sum((_rdp_curve(part, orders) for part in event.events), np.zeros(len(orders)))
    return _mechanism_rdp(event_to_json(event), orders)


def _rdp_accountant_for(mechanism: dpa.DpEvent, orders: Sequence[float]) -> rdp_privacy_accountant.RdpAccountant:
    """dp-accounting's RDP accountant for one mechanism, under the relation it can account it in.

    dp-accounting has randomised response only under REPLACE_ONE (and REPLACE_SPECIAL), and
    everything else vesper uses under ADD_OR_REMOVE_ONE. Adding the curves of both is still
    one correct composition: an unsampled Gaussian's (and Laplace's, and a zCDP event's) RDP
    curve is a function of its noise multiplier alone, the same under either relation, and
    every event of a label ledger states its noise multiplier for the sensitivity under
    "replace one label" (docs/label-privacy.md). Sampled events are refused in label ledgers
    (ledger.check_label_events), because Poisson amplification is an add-or-remove result.
    """
    relation = (
        NeighboringRelation.REPLACE_ONE
        if isinstance(mechanism, dpa.RandomizedResponseDpEvent)
        else NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    return rdp_privacy_accountant.RdpAccountant(orders=list(orders), neighboring_relation=relation)


@lru_cache(maxsize=1024)
def _mechanism_rdp(event_json: str, orders: tuple[float, ...]) -> np.ndarray:
    mechanism = event_from_json(event_json)
    accountant = _rdp_accountant_for(mechanism, orders)
    try:
        accountant.compose(mechanism)
    except dpa.UnsupportedEventError as exc:
        raise ValueError(f"the RDP accountant cannot account for this event: {exc}") from None
    curve = np.array(accountant._rdp, dtype=np.float64)  # dp-accounting 0.6.0 keeps the curve here
    curve.setflags(write=False)
    return curve


def _rdp_supports(event: dpa.DpEvent) -> bool:
    """Whether :func:`_rdp` can account ``event``, each mechanism under its own relation."""
    if isinstance(event, dpa.SelfComposedDpEvent):
        return _rdp_supports(event.event)
    if isinstance(event, dpa.ComposedDpEvent):
        return all(_rdp_supports(part) for part in event.events)
    return _rdp_accountant_for(event, _RDP_SKELETON_ORDERS).supports(event)


# -- PLD -----------------------------------------------------------------------------------


class _TooLarge(Exception):
    """The PLD at this discretisation would exceed a size limit."""


@dataclass(frozen=True)
class _Leaf:
    """One mechanism of a composition: ``count`` runs of ``kind`` sampled with probability ``q``.

    A ``mixture`` leaf is a Gaussian of std ``parameter`` whose sensitivity is
    ``sensitivities[i]`` with probability ``probabilities[i]``. A ``randomized-response``
    leaf is k-ary randomised response with noise parameter p = ``parameter`` over
    k = ``buckets`` (replace-one relation; never sampled).
    """

    kind: Literal["gaussian", "laplace", "mixture", "randomized-response"]
    parameter: float
    q: float
    count: int
    sensitivities: tuple[float, ...] = ()
    probabilities: tuple[float, ...] = ()
    buckets: int = 0


def _leaves(event: dpa.DpEvent, count: int = 1) -> list[_Leaf]:
    """Flatten ``event`` into mechanisms with multiplicities (no NonPrivate inside)."""
    if isinstance(event, dpa.NoOpDpEvent) or count == 0:
        return []
    if isinstance(event, dpa.SelfComposedDpEvent):
        return _leaves(event.event, count * event.count)
    if isinstance(event, dpa.ComposedDpEvent):
        return [leaf for part in event.events for leaf in _leaves(part, count)]
    if isinstance(event, dpa.GaussianDpEvent):
        return [_Leaf("gaussian", event.noise_multiplier, 1.0, count)]
    if isinstance(event, dpa.LaplaceDpEvent):
        return [_Leaf("laplace", event.noise_multiplier, 1.0, count)]
    if isinstance(event, dpa.RandomizedResponseDpEvent):
        if event.noise_parameter == 1:
            return []  # the output is uniform whatever the input
        return [_Leaf("randomized-response", event.noise_parameter, 1.0, count, buckets=event.num_buckets)]
    if isinstance(event, MixtureOfGaussiansDpEvent):
        if all(s == 0 for s in event.sensitivities):
            return []
        return [_Leaf(
            "mixture", event.standard_deviation, 1.0, count,
            tuple(float(s) for s in event.sensitivities), tuple(float(p) for p in event.sampling_probs),
        )]
    if isinstance(event, dpa.PoissonSampledDpEvent):
        inner = event.event
        if event.sampling_probability == 0:
            return []
        if isinstance(inner, dpa.GaussianDpEvent):
            return [_Leaf("gaussian", inner.noise_multiplier, event.sampling_probability, count)]
        if isinstance(inner, dpa.LaplaceDpEvent):
            return [_Leaf("laplace", inner.noise_multiplier, event.sampling_probability, count)]
    raise ValueError(f"the PLD accountant cannot account for {type(event).__name__} here: {event}")


def _single_run(leaf: _Leaf) -> _Leaf:
    return _Leaf(leaf.kind, leaf.parameter, leaf.q, 1, leaf.sensitivities, leaf.probabilities, leaf.buckets)


def _merge_unsampled_gaussians(leaves: list[_Leaf]) -> list[_Leaf]:
    """n runs of Gaussian(z) are one Gaussian(z/√n), and Gaussians add precisions: merge them.

    dp-accounting does the first step too; the second saves one PLD convolution per part.
    """
    precision = sum(leaf.count / leaf.parameter**2 for leaf in leaves if leaf.kind == "gaussian" and leaf.q == 1.0)
    rest = [leaf for leaf in leaves if not (leaf.kind == "gaussian" and leaf.q == 1.0)]
    if precision > 0:
        rest.append(_Leaf("gaussian", 1.0 / math.sqrt(precision), 1.0, 1))
    return rest


def _single_points(leaf: _Leaf, interval: float) -> int:
    """Points of the connect-the-dots PLD of one run of ``leaf``, summed over its adjacencies.

    Computed from the loss bounds alone, before anything is built.
    """
    if leaf.kind == "randomized-response":
        # symmetric losses −ε, 0, +ε (RR1), rounded outwards to the grid: one dense pmf
        return 2 * math.ceil(randomized_response_epsilon(leaf.parameter, leaf.buckets) / interval) + 1
    adjacencies = [loss_lib.AdjacencyType.REMOVE]
    if leaf.q < 1.0 or leaf.kind == "mixture":
        adjacencies.append(loss_lib.AdjacencyType.ADD)  # sampling (or a mixture) makes the PLD asymmetric
    points = 0
    for adjacency in adjacencies:
        if leaf.kind == "mixture":
            loss = loss_lib.MixtureGaussianPrivacyLoss(
                leaf.parameter, leaf.sensitivities, leaf.probabilities, adjacency_type=adjacency
            )
        elif leaf.kind == "gaussian":
            loss = loss_lib.GaussianPrivacyLoss(leaf.parameter, sampling_prob=leaf.q, adjacency_type=adjacency)
        else:
            loss = loss_lib.LaplacePrivacyLoss(leaf.parameter, sampling_prob=leaf.q, adjacency_type=adjacency)
        bounds = loss.connect_dots_bounds()
        points += math.ceil(bounds.epsilon_upper / interval) - math.floor(bounds.epsilon_lower / interval) + 1
    return points


def _pmfs(pld: pld_lib.PrivacyLossDistribution) -> list:
    # dp-accounting 0.6.0 (pinned in pyproject.toml) keeps the two pmfs private; we only
    # read their probabilities to size a composition before running it.
    pmfs = [pld._pmf_remove]  # noqa: SLF001
    if not pld._symmetric:  # noqa: SLF001
        pmfs.append(pld._pmf_add)  # noqa: SLF001
    return pmfs


def _composed_points(pld: pld_lib.PrivacyLossDistribution, count: int) -> int:
    """Points of ``pld`` self-composed ``count`` times, without running the FFT.

    dp-accounting's ``self_compose`` truncates to a Chernoff bound minimised over 40
    orders; we take the same bound over 10 of them, 4× cheaper and never narrower, so
    the estimate is an upper bound on the real size.
    """
    total = 0
    for pmf in _pmfs(pld):
        probs = pmf.to_dense_pmf()._probs  # noqa: SLF001
        orders = np.concatenate((np.arange(-20, 0, 4), np.arange(4, 21, 4))) / len(probs)
        low, high = pld_common.compute_self_convolve_bounds(probs, count, _TAIL_MASS_TRUNCATION, orders=orders)
        total += high - low + 1
    return total


@dataclass(frozen=True)
class _Limits:
    """Largest PLD sizes (points, summed over adjacencies) one evaluation may build."""

    single: float
    composed: float


_FULL = _Limits(PLD_MAX_SINGLE_POINTS, PLD_MAX_COMPOSED_POINTS)
_UNLIMITED = _Limits(math.inf, math.inf)


@lru_cache(maxsize=64)
def _single_pld(leaf: _Leaf, interval: float) -> pld_lib.PrivacyLossDistribution:
    """One run's PLD; cached because a per-step ledger re-composes the same mechanism."""
    if leaf.kind == "randomized-response":
        # dp-accounting's default relation here is REPLACE_ONE, the label ledger's
        return pld_lib.from_randomized_response(leaf.parameter, leaf.buckets, value_discretization_interval=interval)
    if leaf.kind == "mixture":
        return pld_lib.from_mixture_gaussian_mechanism(
            leaf.parameter, leaf.sensitivities, leaf.probabilities, value_discretization_interval=interval
        )
    make = pld_lib.from_gaussian_mechanism if leaf.kind == "gaussian" else pld_lib.from_laplace_mechanism
    return make(leaf.parameter, value_discretization_interval=interval, sampling_prob=leaf.q)


def _leaf_pld(leaf: _Leaf, interval: float, limits: _Limits) -> pld_lib.PrivacyLossDistribution:
    single_limit = limits.single
    if leaf.kind == "mixture" and limits is not _UNLIMITED:
        cap = MIXTURE_MAX_SCOUT_POINTS if limits is _SCOUT_LIMITS else MIXTURE_MAX_SINGLE_POINTS
        single_limit = min(single_limit, cap)
    if _single_points(_single_run(leaf), interval) > single_limit:
        raise _TooLarge
    single = _single_pld(_single_run(leaf), interval)
    if leaf.count == 1:
        return single
    if _composed_points(single, leaf.count) > limits.composed:
        raise _TooLarge
    return single.self_compose(leaf.count, tail_mass_truncation=_TAIL_MASS_TRUNCATION)


def _pld_epsilon_at(leaves: list[_Leaf], delta: float, interval: float, limits: _Limits) -> float:
    """ε at δ of the composition of ``leaves`` (all with noise) with pessimistic PLDs at ``interval``."""
    total = pld_lib.identity(value_discretization_interval=interval)
    size = 1
    for leaf in leaves:
        part = _leaf_pld(leaf, interval, limits)
        size += sum(pmf.size for pmf in _pmfs(part))
        if size > limits.composed:
            raise _TooLarge
        total = total.compose(part, tail_mass_truncation=_TAIL_MASS_TRUNCATION)
    return float(total.get_epsilon_for_delta(delta))


def _pld_ladder(leaves: list[_Leaf], delta: float, intervals: Sequence[float], limits: _Limits) -> tuple[float, float]:
    """(ε, interval) at the finest of ``intervals`` within ``limits``; raises _TooLarge if none."""
    for interval in intervals:
        try:
            return _pld_epsilon_at(leaves, delta, interval, limits), interval
        except _TooLarge:
            continue
    raise _TooLarge


def _pld_epsilon(event: dpa.DpEvent, delta: float) -> EpsilonResult:
    """The ``pld`` ladder: interval 1e-4, then coarser ones, then RDP (module docstring)."""
    leaves = _leaves(event)
    if any(leaf.parameter == 0 for leaf in leaves):
        return EpsilonResult(math.inf, "pld")  # a mechanism without noise
    leaves = _merge_unsampled_gaussians(leaves)
    intervals = (PLD_FINE_INTERVAL, *PLD_COARSE_INTERVALS)
    if any(leaf.kind == "mixture" for leaf in leaves):
        intervals += MIXTURE_EXTRA_INTERVALS  # no RDP to fall back on, and every point is costly
    try:
        epsilon, interval = _pld_ladder(leaves, delta, intervals, _FULL)
        name = "pld" if interval == PLD_FINE_INTERVAL else "pld-coarse"
        return EpsilonResult(epsilon, name, discretization=interval)
    except _TooLarge:
        pass
    if _rdp_supports(event):
        epsilon, order = _rdp(event, delta, RDP_ORDERS)
        return EpsilonResult(epsilon, "rdp-fallback", order=order)
    # Poisson-sampled Laplace and mixtures have no RDP here: the coarsest PLD, whatever its size
    interval = intervals[-1]
    return EpsilonResult(_pld_epsilon_at(leaves, delta, interval, _UNLIMITED), "pld-coarse", discretization=interval)


# A small, coarse PLD that only guides calibration (~0.05 s): it has the PLD's shape,
# which RDP does not, and lies within a few per cent of the final PLD curve.
_SCOUT_INTERVALS: tuple[float, ...] = (2e-3, 5e-3, 1e-2, 2e-2)
_SCOUT_LIMITS = _Limits(6_000, 60_000)


def _pld_scout(event: dpa.DpEvent, delta: float) -> float:
    leaves = _leaves(event) if not _contains_non_private(event) else []
    if _contains_non_private(event) or any(leaf.parameter == 0 for leaf in leaves):
        return math.inf
    leaves = _merge_unsampled_gaussians(leaves)
    try:
        return _pld_ladder(leaves, delta, _SCOUT_INTERVALS, _SCOUT_LIMITS)[0]
    except _TooLarge:
        return _pld_epsilon_at(leaves, delta, _SCOUT_INTERVALS[-1], _UNLIMITED)


# -- public API ----------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _epsilon_cached(event_json: str, delta: float, accountant: Accountant) -> EpsilonResult:
    event = event_from_json(event_json)
    lone_rr = _lone_randomized_response(event)
    if accountant == "rdp":
        epsilon, order = _rdp(event, delta, RDP_ORDERS)
        if lone_rr is not None:
            pure = randomized_response_epsilon(lone_rr.noise_parameter, lone_rr.num_buckets)
            if pure <= epsilon:
                return EpsilonResult(pure, "rr-exact")
        return EpsilonResult(epsilon, "rdp", order=order)
    if lone_rr is not None:
        return EpsilonResult(randomized_response_epsilon(lone_rr.noise_parameter, lone_rr.num_buckets), "rr-exact")
    precision = _gaussian_precision(event)
    if precision is not None:
        if precision == 0:
            return EpsilonResult(0.0, "gaussian-exact")
        if math.isinf(precision):
            return EpsilonResult(math.inf, "gaussian-exact")
        return EpsilonResult(gaussian_epsilon(1.0 / math.sqrt(precision), delta), "gaussian-exact")
    if _contains_non_private(event):
        return EpsilonResult(math.inf, "pld")
    if _contains_zcdp(event):
        epsilon, order = _rdp(event, delta, RDP_ORDERS)
        return EpsilonResult(epsilon, "rdp-zcdp", order=order)
    return _pld_epsilon(event, delta)


def _check_accountant(accountant: str) -> Accountant:
    if accountant not in get_args(Accountant):
        raise ValueError(f"accountant must be one of {get_args(Accountant)}, got {accountant!r}")
    return accountant  # type: ignore[return-value]


def epsilon_of(event: dpa.DpEvent, delta: float, accountant: Accountant = "pld") -> EpsilonResult:
    """ε at δ of ``event``, with the name of the accountant that produced it."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return _epsilon_cached(event_to_json(event), float(delta), _check_accountant(accountant))


def clear_cache() -> None:
    """Forget memoised ε values and RDP curves (benchmarks time cold evaluations)."""
    _epsilon_cached.cache_clear()
    _mechanism_rdp.cache_clear()
    _single_pld.cache_clear()


# -- calibration ---------------------------------------------------------------------------

_Curve = Callable[[float], float]
# one secant step moves z by at most 1.5×: a bad slope costs an evaluation, not a detour
_MAX_LOG_STEP = math.log(1.5)
_Z_MIN = 1e-6


def calibrate(
    make_event: Callable[[float], dpa.DpEvent],
    target_epsilon: float,
    delta: float,
    *,
    accountant: Accountant = "pld",
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
    evaluation costs ~0.2 s, so a tighter window would buy digits that are not there.

    Search (docs/accounting.md): an exact-Gaussian curve costs ~1 ms and is searched
    directly. Otherwise RDP on a sparse set of orders brackets z in ~15 ms per step;
    ``rdp`` then refines on growing subsets of orders and checks once with all of them,
    and ``pld`` runs secant steps on a small coarse PLD, then on the real one from there
    (typically 2-4 real evaluations). Raises ValueError when ``z_max`` misses the target.
    """
    if not target_epsilon > 0 or math.isinf(target_epsilon):
        raise ValueError(f"target epsilon must be finite and > 0, got {target_epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    accountant = _check_accountant(accountant)

    def tolerance(default: float) -> float:
        return default if rtol is None else rtol

    def final(z: float) -> EpsilonResult:
        return epsilon_of(make_event(z), delta, accountant)

    def final_curve(z: float) -> float:
        return final(z).epsilon

    probe = make_event(1.0)
    if accountant == "pld" and _gaussian_precision(probe) is not None:
        z = _search(final_curve, target_epsilon, 1.0, z_max, z_rtol=1e-9, eps_rtol=tolerance(0.0))
        return z, final(z)
    if _contains(probe, MixtureOfGaussiansDpEvent):
        # each final evaluation builds mixture PLDs (seconds): search the coarse scout
        # curve first, then take the few final steps of the PLD path below
        scouted_mixture: dict[float, float] = {}

        def mixture_scout(z: float) -> float:
            if z not in scouted_mixture:
                scouted_mixture[z] = _pld_scout(make_event(z), delta)
            return scouted_mixture[z]

        z_scout = _search(mixture_scout, target_epsilon, 1.0, z_max, z_rtol=1e-3, eps_rtol=1e-2)
        z = _calibrate_pld(mixture_scout, final_curve, target_epsilon, z_scout, -1.0, z_max, eps_rtol=tolerance(1e-3))
        return z, final(z)
    if not _rdp_supports(probe):
        z = _search(final_curve, target_epsilon, 1.0, z_max, z_rtol=1e-6, eps_rtol=tolerance(1e-4))
        return z, final(z)

    def skeleton(z: float) -> float:
        return _rdp(make_event(z), delta, _RDP_SKELETON_ORDERS)[0]

    z_rdp = _search(skeleton, target_epsilon, 1.0, z_max, z_rtol=1e-3, eps_rtol=1e-3)
    if accountant == "rdp" or _contains_zcdp(probe):  # pld charges zCDP plans by RDP too ("rdp-zcdp")
        z = _refine_rdp(make_event, final, target_epsilon, delta, z_rdp, z_max, eps_rtol=tolerance(1e-6))
        return z, final(z)
    # The PLD root lies below RDP's (by 1-30 %). RDP's ε is dominated by log(1/δ)/(α−1)
    # and falls more slowly in z than the PLD's (slope −0.5 against −3 for 1,000 steps
    # of q = 0.0034); the PLD's slope is about −1 for large z and steeper below, so the
    # first step takes the steeper of −2 and RDP's slope over the last 10 % of z.
    slope = min(_slope(z_rdp / 1.1, skeleton(z_rdp / 1.1), z_rdp, skeleton(z_rdp)), -2.0)
    scouted: dict[float, float] = {}

    def scout(z: float) -> float:
        if z not in scouted:
            scouted[z] = _pld_scout(make_event(z), delta)
        return scouted[z]

    z = _calibrate_pld(scout, final_curve, target_epsilon, z_rdp, slope, z_max, eps_rtol=tolerance(1e-3))
    return z, final(z)


def _calibrate_pld(
    scout: _Curve, final: _Curve, target: float, z0: float, slope: float, z_max: float, *, eps_rtol: float
) -> float:
    """Find the PLD's z mostly on the cheap scout curve (one step of "space mapping").

    1. Solve scout = target and evaluate the final curve there.
    2. The two curves differ near the root by a slowly varying ratio: solve
       scout = target / ratio and evaluate the final curve again.
    3. If neither landed in the window, secant steps on the final curve from those two
       points (its own slope, which the scout's only approximates).

    Usually two or three final evaluations (~0.2 s each) where a secant on the final
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
