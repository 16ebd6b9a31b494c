"""Privacy loss distributions: the ``pld`` accountant's ladder of discretisation intervals.

An event is flattened into mechanisms with multiplicities (:class:`_Leaf`), each one's
pessimistic (connect-the-dots) PLD is built and self-composed, and the parts composed,
at the finest interval whose sizes stay within :data:`PLD_MAX_SINGLE_POINTS` and
:data:`PLD_MAX_COMPOSED_POINTS`; RDP when none does (package docstring).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import dp_accounting as dpa
import numpy as np
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as loss_lib

from vesper.common.privacy.accounting.randomized_response import randomized_response_epsilon
from vesper.common.privacy.accounting.rdp import RDP_ORDERS, _rdp, _rdp_supports
from vesper.common.privacy.accounting.result import EpsilonResult
from vesper.common.privacy.accounting.structure import _contains_non_private

PLD_FINE_INTERVAL = 1e-4
# Coarser pessimistic intervals, tried in order. Measured on 10,000 steps of
# PoissonSampled(0.0034, Gaussian(z)) at δ = 1e-6, relative to interval 5e-5: at z = 1.15
# (ε = 1.63) +0.02 % at 2e-4, +0.15 % at 5e-4, +0.63 % at 1e-3, +2.5 % at 2e-3; at
# z = 0.54 (ε = 12.2) +0.02 % at 1e-3, +0.08 % at 2e-3. Small z has a wide loss range
# and so gets the coarse intervals, but also a large ε, so the relative error stays small.
PLD_COARSE_INTERVALS: tuple[float, ...] = (2e-4, 5e-4, 1e-3, 2e-3)
# Size limits that bound the time of one PLD evaluation: building a Poisson-sampled
# Gaussian PLD takes time linear in its points (summed over the REMOVE and ADD adjacencies),
# self-composition and the ε search in the composed points (measured costs: docs/accounting.md).
PLD_MAX_SINGLE_POINTS = 30_000
PLD_MAX_COMPOSED_POINTS = 300_000
# Mixtures of Gaussians: dp-accounting 0.6.0 builds their PLD one grid point at a time
# (a Python bisection per point: docs/performance-notes.md), so their single-run PLD is kept small
# and may use coarser intervals. The interval barely moves a mixture's ε: HeterPoisson's
# Cora plan (30 steps, 2 chunks) gives 10.2423 at 5e-4, 10.2424 at 5e-3, 10.2429 at 1e-2,
# each pessimistic (an upper bound).
MIXTURE_MAX_SINGLE_POINTS = 4_000
MIXTURE_MAX_SCOUT_POINTS = 1_000  # the calibration scout only guides the search
MIXTURE_EXTRA_INTERVALS: tuple[float, ...] = (5e-3, 1e-2, 2e-2)
# dp-accounting's default: tail mass dropped by the FFT self-composition, counted into δ.
_TAIL_MASS_TRUNCATION = 1e-15


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
    """The ``pld`` ladder: interval 1e-4, then coarser ones, then RDP (package docstring)."""
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


# A small, coarse PLD that only guides calibration (cheap: docs/accounting.md): it has the PLD's shape,
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
