"""[VESPER, Thm. 2.1] "as published": γ, [VESPER, bound (6)] and [VESPER, Lemma 2, eq. (10)].

This is the ``hidden-batch`` accounting of shared/design/privacy.md. It assumes the
adversary cannot tell which edges a step used, which is false for party B in vesper's
protocol; it exists to reproduce the paper's numbers (docs/accounting.md).

* γ ([VESPER, Thm. 2.1]): the probability that one edge falls in a batch's sampled subgraph,
  γ = 1 − C(N_T − N_e, B) / C(N_T, B), with N_e = 2(D^L − 1)/(D − 1) ([VESPER, eq. (11)] and below).
* [VESPER, bound (6)]: the RDP ε_γ(α) of one subsampled step, from Wang, Balle &
  Kasiviswanathan [WBK19, Thm. 9], which the paper's proof cites; for the Gaussian, ε(α) = α/(2z²).
* [VESPER, Lemma 2, eq. (10)]: RDP to (ε, δ)-DP.

Everything is computed in log space, so z down to 0.3 and α up to 256 do not overflow.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import dp_accounting as dpa
import numpy as np
from scipy.special import gammaln, logsumexp

DEFAULT_ORDERS: tuple[int, ...] = tuple(range(2, 257))


def participation_count(degree: int, layers: int) -> int:
    """N_e = 2 Σ_{l=0}^{L−1} D^l = 2(D^L − 1)/(D − 1) (= 2L when D = 1), proof of [VESPER, Thm. 2.1].

    Summed in integers, so it is exact for every D ≥ 1, L ≥ 1; the paper's closed form is
    always an integer too, since D^L − 1 = (D − 1) Σ_{l<L} D^l.
    """
    _check_int("degree", degree, 1)
    _check_int("layers", layers, 1)
    return 2 * sum(degree**level for level in range(layers))


def theorem21_gamma(num_train_nodes: int, batch_size: int, degree: int, layers: int) -> float:
    """γ = 1 − C(N_T − N_e, B) / C(N_T, B) of [VESPER, Thm. 2.1] (the bound [VESPER, eq. (11)] on P[e ∈ E_B]).

    The ratio is Π_{i<B} (1 − N_e/(N_T − i)) = Π_{k<N_e} (1 − B/(N_T − k)); we sum
    log1p over the shorter product (math.fsum), which keeps full precision for millions
    of nodes where a difference of lgamma values (~10^7 each) would lose ~8 digits.
    γ = 1 when N_T − N_e < B (every batch then holds the edge).
    """
    _check_int("num_train_nodes", num_train_nodes, 1)
    _check_int("batch_size", batch_size, 1)
    if batch_size > num_train_nodes:
        raise ValueError(f"batch_size B={batch_size} is larger than num_train_nodes N_T={num_train_nodes}")
    n_e = participation_count(degree, layers)
    if num_train_nodes - n_e < batch_size:
        return 1.0
    if batch_size <= n_e:
        terms = np.log1p(-n_e / (num_train_nodes - np.arange(batch_size, dtype=np.float64)))
    else:
        terms = np.log1p(-batch_size / (num_train_nodes - np.arange(n_e, dtype=np.float64)))
    return -math.expm1(math.fsum(terms.tolist()))


def _log_expm1(x: float) -> float:
    """log(e^x − 1) for x > 0 without overflow."""
    return x + math.log(-math.expm1(-x)) if x > 1.0 else math.log(math.expm1(x))


def bound6_rdp(alpha: int, z: float, gamma: float, eps_inf: float = math.inf) -> float:
    """ε_γ(α) of [VESPER, bound (6)] for the Gaussian mechanism with noise multiplier z, integer α ≥ 2.

    With ε(α) = α/(2z²) (the Gaussian's RDP; z = θ/√Σ S_l², so Σ S_l²/θ² = 1/z²):

        ε_γ(α) = 1/(α−1) · log( 1 + γ² C(α,2) min(4(e^{ε(2)} − 1), ε(2) min(2, (e^{ε(∞)−1})²))
                               + Σ_{j=3}^{α} γ^j C(α,j) e^{(j−1)ε(j)} min(2, (e^{ε(∞)−1})^j) )

    The sum is *inside* the log, with the 1/(α−1): that is Wang et al. [WBK19, Thm. 9],
    which the paper's proof cites, and only this reading reproduces the contract's
    numbers (4.39 at z = 0.69, 7.92 at z = 0.56; docs/accounting.md). As typeset, the
    paper closes the log before the sum. The factor e^{ε(∞)−1} is coded as printed
    ([WBK19, Thm. 9] has e^{ε(∞)} − 1); with ε(∞) = ∞ for the Gaussian both give
    min(2, ∞) = 2. C(α, j) = 0 for j > α, so the sum stops at α.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, np.integer)) or alpha < 2:
        raise ValueError(f"bound (6) is for integer orders alpha >= 2, got {alpha!r}")
    return float(_bound6_rdp_orders(np.array([alpha]), z, gamma, eps_inf)[0])


def _bound6_rdp_orders(alphas: np.ndarray, z: float, gamma: float, eps_inf: float = math.inf) -> np.ndarray:
    """[VESPER, bound (6)] at every order of ``alphas`` at once (rows: orders, columns: j)."""
    if not z > 0 or math.isinf(z):
        raise ValueError(f"noise multiplier z must be finite and > 0, got {z}")
    if not 0 <= gamma <= 1:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    alphas = np.asarray(alphas, dtype=np.float64)
    if gamma == 0:
        return np.zeros_like(alphas)
    log_gamma = math.log(gamma)
    eps2 = 1.0 / z**2  # ε(2) = 2/(2z²)

    def log_cap(j: np.ndarray | float) -> np.ndarray | float:
        # log min(2, (e^{ε(∞)−1})^j), as printed
        return math.log(2.0) if math.isinf(eps_inf) else np.minimum(math.log(2.0), np.multiply(j, eps_inf - 1.0))

    # second order: γ² C(α,2) min(4(e^{ε(2)} − 1), ε(2) min(2, (e^{ε(∞)−1})²))
    log_second = (
        2 * log_gamma
        + np.log(alphas * (alphas - 1) / 2)
        + min(math.log(4.0) + _log_expm1(eps2), math.log(eps2) + float(log_cap(2.0)))
    )
    j = np.arange(3, int(alphas.max()) + 1, dtype=np.float64)[None, :]
    a = alphas[:, None]
    with np.errstate(invalid="ignore"):
        log_comb = gammaln(a + 1.0) - gammaln(j + 1.0) - gammaln(np.maximum(a - j, 0.0) + 1.0)
    # (j − 1)ε(j) = (j − 1) j / (2z²)
    log_terms = j * log_gamma + log_comb + (j - 1.0) * j / (2.0 * z**2) + log_cap(j)
    log_terms = np.where(j <= a, log_terms, -np.inf)  # C(α, j) = 0 beyond α
    log_sum = logsumexp(np.concatenate((log_second[:, None], log_terms), axis=1), axis=1)
    # log(1 + S) as logaddexp(0, log S): keeps full relative precision when S is tiny
    return np.logaddexp(0.0, log_sum) / (alphas - 1.0)


def lemma2_epsilon(rdp: float, alpha: float, delta: float) -> float:
    """[VESPER, Lemma 2, eq. (10)]: (α, ε)-RDP gives (ε', δ)-DP with ε' = ε − log(δα)/(α−1) + log(1 − 1/α)."""
    if not alpha > 1:
        raise ValueError(f"Lemma 2 needs alpha > 1, got {alpha}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return rdp - math.log(delta * alpha) / (alpha - 1) + math.log1p(-1.0 / alpha)


def hidden_batch_bound6_epsilon(
    z: float,
    gamma: float,
    steps: int,
    delta: float,
    *,
    unsampled_gaussian_precision: float = 0.0,
    orders: Iterable[int] = DEFAULT_ORDERS,
) -> tuple[float, int]:
    """(ε, best α) of ``steps`` subsampled steps under [VESPER, bound (6)], converted by
    [VESPER, Lemma 2].

    RDP composes additively ([VESPER, Lemma 1]): T·ε_γ(α), plus α/2 · Σ n_i/z_i² for
    extra unsampled Gaussian releases such as an evaluation sweep
    (``unsampled_gaussian_precision`` = Σ n_i/z_i²), then minimised over integer orders.
    """
    _check_int("steps", steps, 0)
    if unsampled_gaussian_precision < 0:
        raise ValueError(f"unsampled_gaussian_precision must be >= 0, got {unsampled_gaussian_precision}")
    alphas = np.array(sorted(set(orders)), dtype=np.int64)
    if alphas.size == 0 or alphas.min() < 2:
        raise ValueError(f"orders must be integers >= 2, got {alphas.tolist()}")
    rdp = steps * _bound6_rdp_orders(alphas, z, gamma) if steps else np.zeros(alphas.size)
    rdp = rdp + alphas / 2 * unsampled_gaussian_precision
    epsilons = [lemma2_epsilon(float(r), int(a), delta) for r, a in zip(rdp, alphas)]
    best = int(np.argmin(epsilons))
    return epsilons[best], int(alphas[best])


def hidden_batch_event(z: float, gamma: float, steps: int) -> dpa.DpEvent:
    """The same run as dp-accounting events: SelfComposed(PoissonSampled(γ, Gaussian(z)), T).

    The paper says it used dp-accounting's RDP accountant "with an adjusted sampling
    probability": this is that event, with γ as the sampling probability.
    """
    return dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(gamma, dpa.GaussianDpEvent(z)), steps)


def calibrate_bound6(
    target_epsilon: float,
    gamma: float,
    steps: int,
    delta: float,
    *,
    unsampled_releases: float = 0.0,
    orders: Iterable[int] = DEFAULT_ORDERS,
    z_max: float = 1e6,
    rtol: float = 1e-9,
) -> tuple[float, float, int]:
    """Smallest z whose ε under [VESPER, bound (6)] is ≤ target: (z, ε, α).

    ``unsampled_releases`` unsampled Gaussian releases with the same z (an evaluation
    sweep) add precision n/z²; releases at noise multiplier s·z count n/s² each, so the
    argument is Σ n_i/s_i² and need not be an integer. Bisection in log z to ``rtol``; returns the upper end of
    the bracket, so the result always meets the target.
    """
    if not target_epsilon > 0 or math.isinf(target_epsilon):
        raise ValueError(f"target epsilon must be finite and > 0, got {target_epsilon}")
    orders = tuple(orders)

    def epsilon_at(z: float) -> tuple[float, int]:
        return hidden_batch_bound6_epsilon(
            z, gamma, steps, delta, unsampled_gaussian_precision=unsampled_releases / z**2, orders=orders
        )

    high = 1.0
    while epsilon_at(high)[0] > target_epsilon:
        high *= 2.0
        if high > z_max:
            raise ValueError(f"no noise multiplier up to {z_max:g} brings bound (6) to epsilon <= {target_epsilon}")
    low = high / 2.0
    while low > 1e-3 and epsilon_at(low)[0] <= target_epsilon:
        high, low = low, low / 2.0
    while high / low - 1.0 > rtol:
        mid = math.sqrt(low * high)
        if epsilon_at(mid)[0] <= target_epsilon:
            high = mid
        else:
            low = mid
    epsilon, alpha = epsilon_at(high)
    return high, epsilon, alpha


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
