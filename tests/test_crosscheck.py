"""Independent cross-checks of the accountants (docs/accounting.md, "Cross-checks").

(a) single Gaussian events against the closed-form (ε, δ) curve, solved here;
(b) subsampled and composed events against two other libraries: Microsoft's
    prv-accountant (PLD numbers must lie inside its error bounds) and Opacus's RDP
    analysis (RDP numbers must agree to 1e-9 at the same orders);
(c) bound (6) against dp-accounting's RDP of the same Poisson-sampled Gaussian, where
    theory says bound (6) cannot be below it.
"""

import math

import dp_accounting as dpa
import mpmath
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants.analysis import rdp as opacus_rdp
from prv_accountant import GaussianMechanism, PoissonSubsampledGaussianMechanism, PRVAccountant
from scipy.optimize import brentq
from scipy.stats import norm

from vesper.common.privacy.accounting import RDP_ORDERS, _rdp, epsilon_of
from vesper.common.privacy.hidden_batch_reproduction import bound6_rdp

# -- (a) the Gaussian mechanism in closed form -----------------------------------------------


def _balle_wang_delta(sigma: float, epsilon: float) -> float:
    """δ(ε) = Φ(1/(2σ) − εσ) − e^ε Φ(−1/(2σ) − εσ) for sensitivity 1 (Balle & Wang 2018).

    Written as Φ(a)(1 − e^{ε + log Φ(b) − log Φ(a)}) so the difference keeps its digits
    when both terms are far larger than δ.
    """
    log_a = norm.logcdf(1 / (2 * sigma) - epsilon * sigma)
    log_b = norm.logcdf(-1 / (2 * sigma) - epsilon * sigma)
    return math.exp(log_a) * -math.expm1(epsilon + log_b - log_a)


def _closed_form_epsilon(sigma: float, delta: float) -> float:
    if _balle_wang_delta(sigma, 0.0) <= delta:
        return 0.0
    high = 1.0
    while _balle_wang_delta(sigma, high) > delta:
        high *= 2
    return brentq(lambda e: _balle_wang_delta(sigma, e) - delta, 0.0, high, xtol=1e-14, rtol=1e-15)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 2.0, 5.0, 20.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_gaussian_against_the_closed_form(sigma: float, delta: float) -> None:
    truth = _closed_form_epsilon(sigma, delta)
    exact = epsilon_of(dpa.GaussianDpEvent(sigma), delta)
    assert exact.accountant == "gaussian-exact"
    # two root finders on the same curve: 1e-9 relative (brentq's xtol 1e-14 plus the
    # library's own tolerance); "gaussian-exact" may only err upwards, by that much
    assert truth * (1 - 1e-9) - 1e-12 <= exact.epsilon <= truth * (1 + 1e-9) + 1e-12
    # the same curve as a PLD (Poisson rate 1 keeps it off the exact path): pessimistic,
    # never below the truth, and within 1 % (discretisation 1e-4 to 2e-3)
    as_pld = epsilon_of(dpa.PoissonSampledDpEvent(1.0, dpa.GaussianDpEvent(sigma)), delta)
    assert as_pld.accountant.startswith("pld")
    assert truth - 1e-12 <= as_pld.epsilon <= truth * 1.01 + 1e-3
    # RDP is an upper bound, looser than the truth
    assert epsilon_of(dpa.GaussianDpEvent(sigma), delta, accountant="rdp").epsilon >= truth


# -- (b) a second library for subsampled and composed events ---------------------------------

# prv-accountant 0.2.0 (Gopi, Lee & Wutschitz 2021): ε with a lower and an upper bound, its
# error budget being eps_error in ε and delta_error in δ.
PRV_EPS_ERROR, PRV_DELTA_ERROR = 0.01, 1e-10
# (q, z, T): both contract-like hidden-batch runs and a visible-batch edge subsample
SUBSAMPLED = [(0.01, 1.0, 500), (0.0034, 0.8, 1000), (0.1, 3.0, 300), (0.0034, 0.69, 2930)]


@pytest.mark.parametrize("q, z, steps", SUBSAMPLED)
def test_pld_is_within_prv_accountants_bounds(q: float, z: float, steps: int) -> None:
    prv = PRVAccountant(
        prvs=[PoissonSubsampledGaussianMechanism(noise_multiplier=z, sampling_probability=q)],
        max_self_compositions=[steps], eps_error=PRV_EPS_ERROR, delta_error=PRV_DELTA_ERROR,
    )
    low, estimate, high = prv.compute_epsilon(delta=1e-6, num_self_compositions=[steps])
    ours = epsilon_of(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps), 1e-6)
    assert ours.accountant in ("pld", "pld-coarse")
    # the true ε is in [low, high]; ours is an upper bound on it, pessimistic by less than
    # prv's error budget at the intervals chosen here
    assert low <= ours.epsilon <= high


def test_composed_pld_is_within_prv_accountants_bounds() -> None:
    # a training run (800 sampled steps) plus an evaluation sweep (3 unsampled releases)
    q, z, steps, z_eval, sweeps = 0.02, 1.2, 800, 8.0, 3
    prv = PRVAccountant(
        prvs=[PoissonSubsampledGaussianMechanism(noise_multiplier=z, sampling_probability=q),
              GaussianMechanism(noise_multiplier=z_eval)],
        max_self_compositions=[steps, sweeps], eps_error=PRV_EPS_ERROR, delta_error=PRV_DELTA_ERROR,
    )
    low, _, high = prv.compute_epsilon(delta=1e-6, num_self_compositions=[steps, sweeps])
    event = dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps),
        dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z_eval), sweeps),
    ])
    ours = epsilon_of(event, 1e-6)
    assert ours.accountant in ("pld", "pld-coarse") and low <= ours.epsilon <= high


OPACUS_CASES = [*SUBSAMPLED, (0.0034, 0.56, 2930), (0.1, 1.5, 1000), (0.5, 4.0, 20)]
INTEGER_ORDERS = list(range(2, 257))


def _opacus_epsilon(q: float, z: float, steps: int, orders: list) -> tuple[float, float]:
    rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=orders)
    epsilon, order = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=1e-6)
    return float(epsilon), float(order)


def _event(q: float, z: float, steps: int) -> dpa.DpEvent:
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)


@pytest.mark.parametrize("q, z, steps", OPACUS_CASES)
def test_rdp_at_integer_orders_agrees_with_opacus(q: float, z: float, steps: int) -> None:
    # Opacus 1.6.0 computes the same quantity (Mironov, Talwar & Zhang 2019) with its own
    # code and converts with the same eq. (10). At integer orders both sum α + 1 terms in
    # float64 log space (observed: 2e-12 apart): 1e-9 relative is rounding room only.
    theirs, their_order = _opacus_epsilon(q, z, steps, INTEGER_ORDERS)
    ours, our_order = _rdp(_event(q, z, steps), 1e-6, INTEGER_ORDERS)  # what epsilon_of(..., "rdp") runs
    assert ours == pytest.approx(theirs, rel=1e-9)
    assert our_order == their_order


@pytest.mark.parametrize("q, z, steps", OPACUS_CASES)
def test_rdp_at_all_orders_is_opacus_or_slightly_above(q: float, z: float, steps: int) -> None:
    # At fractional orders dp-accounting 0.6.0 is *above* Opacus (and above a quadrature
    # of the defining integral, which Opacus matches to 1e-7; see below): its series
    # takes log|C(α, i)| from gammaln and adds every term, while for i > α the binomial
    # coefficients alternate in sign (Opacus subtracts those). Adding them only makes
    # the RDP larger, so it stays an upper bound, by up to 9e-4 relative in ε here
    # (q = 0.1, z = 1.5) and 3e-5 at the contract's z = 0.69 (4.01059 vs 4.01047).
    theirs, _ = _opacus_epsilon(q, z, steps, list(RDP_ORDERS))
    ours = epsilon_of(_event(q, z, steps), 1e-6, "rdp")
    assert ours.accountant == "rdp"
    assert theirs * (1 - 1e-9) <= ours.epsilon <= theirs * (1 + 1e-3)


@pytest.mark.parametrize("q, z", [(0.01, 1.0), (0.1, 3.0), (0.0034, 0.69)])
def test_fractional_orders_are_never_below_opacus(q: float, z: float) -> None:
    fractional = [a for a in RDP_ORDERS if a != int(a)]
    theirs = opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=1, orders=fractional)
    ours = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(q, z, fractional)
    assert all(o >= t * (1 - 1e-9) for o, t in zip(ours, theirs))


def _rdp_by_quadrature(q: float, z: float, alpha: float) -> float:
    """log E_{x~N(0,z²)}[(1 − q + q e^{(2x−1)/(2z²)})^α] / (α − 1): the definition, integrated."""
    with mpmath.workdps(30):
        q_, z_, a_ = mpmath.mpf(q), mpmath.mpf(z), mpmath.mpf(alpha)
        integrand = lambda x: mpmath.npdf(x, 0, z_) * (1 - q_ + q_ * mpmath.exp((2 * x - 1) / (2 * z_**2))) ** a_  # noqa: E731
        return float(mpmath.log(mpmath.quad(integrand, [-mpmath.inf, -20 * z_, 0, 20 * z_, mpmath.inf])) / (a_ - 1))


@pytest.mark.parametrize("q, z, alpha", [(0.1, 3.0, 1.1), (0.01, 1.0, 4.7), (0.0034, 0.8, 2.5)])
def test_which_fractional_rdp_is_right(q: float, z: float, alpha: float) -> None:
    truth = _rdp_by_quadrature(q, z, alpha)
    opacus = opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=1, orders=[alpha])[0]
    ours = rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(q, z, [alpha])[0]
    assert opacus == pytest.approx(truth, rel=1e-7)  # its series stops at terms below e^-30
    assert ours > truth * (1 + 1e-6)  # too large, hence still an upper bound


# -- (c) bound (6) against the exact Poisson-subsampled Gaussian RDP ------------------------
#
# For integer α, dp-accounting computes the exact RDP of the Poisson-subsampled Gaussian,
#     ε(α) = log A_α / (α−1),  A_α = Σ_j C(α,j) γ^j (1−γ)^{α−j} e^{j(j−1)/(2z²)}
#          = 1 + Σ_{j≥2} C(α,j) γ^j (1−γ)^{α−j} (e^{j(j−1)/(2z²)} − 1).
# Bound (6) as printed is log(1 + B)/(α−1) with B = γ²C(α,2)·min(4(e^{1/z²}−1), 2/z²)
# + Σ_{j≥3} 2γ^j C(α,j) e^{j(j−1)/(2z²)}, and min(...) = 2/z² for every z > 0. Term by
# term, j ≥ 3 of B is at least twice A_α's; j = 2 is at least A_α's exactly when
# e^{1/z²} − 1 ≤ 2/z², i.e. z ≥ 1/√x* = 0.8921 with x* = 1.2564 the root of e^x − 1 = 2x.
# So bound (6) ≥ RDP for every γ and every integer α ≥ 2 when z ≥ 0.8921; for smaller z
# it can be below (the printed ε(2)·min(2, ·) is smaller than Theorem 9's second-order
# term), e.g. the contract's z = 0.56, where bound (6) gives ε = 7.92 < RDP's 7.94.
Z_STAR = 1 / math.sqrt(brentq(lambda x: math.expm1(x) - 2 * x, 1.0, 2.0))


def _exact_rdp(alpha: int, z: float, gamma: float) -> float:
    # dp-accounting 0.6.0 (pinned): its accountant exposes only the converted ε, so we
    # read the per-order RDP of one step from the function the accountant itself uses
    return float(rdp_privacy_accountant._compute_rdp_poisson_subsampled_gaussian(gamma, z, [alpha])[0])


def test_the_threshold() -> None:
    assert Z_STAR == pytest.approx(0.89214, abs=1e-5)


@given(
    z=st.floats(0.9, 30.0),  # just above Z_STAR: at Z_STAR itself α = 2 is an equality
    gamma=st.floats(1e-4, 1.0),
    alpha=st.integers(2, 256),
)
@settings(max_examples=300, deadline=None)
def test_bound6_is_not_below_the_exact_rdp_above_the_threshold(z: float, gamma: float, alpha: int) -> None:
    # margin at z = 0.9: (2/z²)/(e^{1/z²} − 1) − 1 = 1.3 % on the j = 2 term; both sides
    # are float64 log-space sums accurate to ~1e-12 relative, so 1e-9 is only rounding room
    assert bound6_rdp(alpha, z, gamma) >= _exact_rdp(alpha, z, gamma) * (1 - 1e-9)


@pytest.mark.parametrize("alpha", [2, 3])
def test_bound6_can_be_below_the_exact_rdp_below_the_threshold(alpha: int) -> None:
    # the contract's z = 0.56, γ = 0.0034, where bound (6)'s optimum is α = 3 (from α = 4 on
    # its j ≥ 3 terms, twice the exact ones, outweigh the smaller second-order term)
    assert bound6_rdp(alpha, 0.56, 0.0034) < _exact_rdp(alpha, 0.56, 0.0034)
