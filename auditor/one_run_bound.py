"""The one-run audit's statistics: an empirical lower bound on ε from canary guesses.

Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023) [SNJ23]:
m canaries are each inserted into the input with probability ½ (S_i ∈ {−1, +1}); an
adversary who sees only the algorithm's output makes r guesses T_i ∈ {−1, +1} and abstains
on the rest (T_i = 0). W, the number of right guesses, is a statistic of one run.

**[SNJ23, Thm. 3.1].** If the algorithm is (ε, δ)-DP with respect to each canary and ‖T‖₁ ≤ r
almost surely, then for every v

    P[W ≥ v] ≤ f_{ε,δ}(v) := P[W̃ ≥ v] + 2mδ · max_{i ∈ [m]} P[v > W̃ ≥ v − i] / i,
    W̃ ~ Binomial(r, e^ε / (e^ε + 1)).

For δ = 0 this is the paper's pure-DP statement: W is stochastically dominated by
Binomial(r, e^ε/(e^ε+1)), the accuracy of ε-randomised response. Observing W = v therefore
rejects "(ε, δ)-DP" at confidence c whenever f_{ε,δ}(v) ≤ 1 − c; the largest ε so rejected
is the lower bound ([SNJ23, Alg. 2], in its App. D, binary-searches it the same way).

Everything here is a statistic of one run, reported beside the accountant's ε and never
fed back into accounting (docs/audit-canaries.md).
"""

from __future__ import annotations

import functools
import math

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import special, stats

# A pre-registered grid of guess counts (k₊, k₋), as fractions of the canaries B can score.
# B guesses "inserted" for the k₊ highest scores and "not inserted" for the k₋ lowest. The
# grid is fixed before any outcome is seen; the bound of each point is taken at confidence
# 1 − (1 − c)/|grid| (Bonferroni), so the best point may be reported at confidence c.
GUESS_FRACTIONS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5)
NEGATIVE_GUESSES: tuple[bool, ...] = (False, True)  # k₋ = 0, or k₋ = k₊

_SEARCH_TOLERANCE = 1e-6
_SEARCH_CEILING = 1e3  # no (ε, δ) above this is ever rejected with float64 tails


class OneRunAudit(BaseModel):
    """One canary audit: B's guesses, how many were right, and the ε they rule out."""

    model_config = ConfigDict(frozen=True)

    m: int = Field(description="canaries drawn (each inserted with probability 1/2)")
    guesses: int = Field(description="r: guesses made at the reported grid point (the rest abstained)")
    correct: int = Field(description="W: right guesses among them")
    k_plus: int = Field(description="guesses 'inserted': the k+ highest scores")
    k_minus: int = Field(description="guesses 'not inserted': the k- lowest scores")
    epsilon_lower_bound: float = Field(description="largest ε whose (ε, δ)-DP the guesses reject (Theorem 3.1)")
    confidence: float = Field(description="confidence of the reported bound, after the grid correction")
    abstained: int = Field(description="canaries without a guess (not among the k+ + k-, or unscored)")
    scored: int = Field(description="canaries B could score (both nodes received)")
    grid_size: int = Field(description="pre-registered (k+, k-) pairs; each tested at 1 - (1 - confidence)/grid_size")
    delta: float
    scorer: str = Field("", description="what produced the scores B guessed from")

    @property
    def accuracy(self) -> float:
        return self.correct / self.guesses if self.guesses else math.nan


def guess_accuracy(epsilon: float) -> float:
    """e^ε / (e^ε + 1): the accuracy of ε-randomised response, the best an ε-DP guess can do."""
    return float(special.expit(epsilon))


def p_value(guesses: int, correct: int, epsilon: float, delta: float, m: int) -> float:
    """f_{ε,δ}(v) of [SNJ23, Thm. 3.1]: a bound on P[W ≥ v] for every (ε, δ)-DP algorithm.

    r = ``guesses``, v = ``correct``, m = ``m``. The max over i ∈ [m] is attained at
    i ≤ v (past it the numerator stops growing), so it runs over i = 1..v.
    """
    _check_counts(guesses, correct, m)
    q = guess_accuracy(epsilon)
    tail = float(stats.binom.sf(correct - 1, guesses, q))  # β = P[W̃ ≥ v]
    if delta <= 0 or correct == 0:
        return min(1.0, tail)
    below = stats.binom.pmf(np.arange(correct - 1, -1, -1), guesses, q)  # P[W̃ = v − i], i = 1..v
    alpha = float(np.max(np.cumsum(below) / np.arange(1, correct + 1)))  # max_i P[v > W̃ ≥ v − i] / i
    return min(1.0, tail + 2.0 * m * delta * alpha)


@functools.lru_cache(maxsize=4096)  # pure in its arguments; audits and simulations repeat (r, v)
def epsilon_lower_bound(
    guesses: int, correct: int, delta: float, confidence: float = 0.95, m: int | None = None
) -> float:
    """The largest ε such that every (ε, δ)-DP algorithm makes ≥ ``correct`` right guesses
    out of ``guesses`` with probability ≤ 1 − ``confidence`` [SNJ23, Thm. 3.1]; 0 when even ε = 0
    cannot be rejected.

    ``m``: canaries randomised in the run (the 2mδ term); default ``guesses``, which is
    right only when B guessed on every canary. The search keeps f(lo) ≤ 1 − c, so whatever
    it returns is a rejected ε, whether or not f is monotone in ε; and rejecting ε rejects
    every smaller ε, since (ε', δ)-DP implies (ε, δ)-DP for ε ≤ ε'.
    """
    m = guesses if m is None else m
    _check_counts(guesses, correct, m)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta}")
    level = 1.0 - confidence
    if guesses == 0 or p_value(guesses, correct, 0.0, delta, m) > level:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(guesses, correct, hi, delta, m) <= level:
        lo, hi = hi, 2.0 * hi
        if hi > _SEARCH_CEILING:
            return lo
    while hi - lo > _SEARCH_TOLERANCE:
        mid = 0.5 * (lo + hi)
        if p_value(guesses, correct, mid, delta, m) <= level:
            lo = mid
        else:
            hi = mid
    return lo


def guess_grid(scored: int) -> list[tuple[int, int]]:
    """The pre-registered (k₊, k₋) pairs for ``scored`` scorable canaries, distinct and non-empty."""
    grid: list[tuple[int, int]] = []
    for fraction in GUESS_FRACTIONS:
        k = max(1, int(fraction * scored))
        for negatives in NEGATIVE_GUESSES:
            pair = (k, k if negatives else 0)
            if sum(pair) <= scored and pair not in grid:
                grid.append(pair)
    return grid


def guess_from_scores(scores: np.ndarray, k_plus: int, k_minus: int) -> np.ndarray:
    """T ∈ {−1, 0, +1}^m: +1 for the k₊ highest finite scores, −1 for the k₋ lowest, 0 otherwise
    (NaN scores always abstain). Ties go by canary index, which does not depend on S."""
    finite = np.flatnonzero(np.isfinite(scores))
    order = finite[np.argsort(-scores[finite], kind="stable")]
    guesses = np.zeros(scores.shape[0], dtype=np.int8)
    guesses[order[:k_plus]] = 1
    if k_minus:
        guesses[order[-k_minus:]] = -1
    return guesses


def count_correct(guesses: np.ndarray, included: np.ndarray) -> int:
    """W = Σ_i max(0, T_i · S_i) with S_i = +1 for an inserted canary."""
    truth = np.where(included, 1, -1)
    return int(np.sum(guesses * truth > 0))


def canary_audit(
    scores: np.ndarray, included: np.ndarray, delta: float, confidence: float = 0.95, scorer: str = ""
) -> OneRunAudit:
    """B's guesses from its scores (higher = more likely inserted), scored against the truth.

    Picking k after seeing which guesses were right would overstate the bound, so the
    (k₊, k₋) pairs are fixed in advance (:func:`guess_grid`) and each is tested at
    confidence 1 − (1 − c)/|grid|: by the union bound, the largest of their bounds exceeds
    the truth with probability ≤ 1 − c. A split (choose k on half the canaries, bound on the
    other half) would halve m; the grid's price is only log |grid| in the tail, so Bonferroni.

    Which scores are NaN (B never received a node of the pair) must not depend on S; here it
    is fixed by B's split before the run.
    """
    scores = np.asarray(scores, dtype=np.float64)
    included = np.asarray(included, dtype=bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValueError(f"scores {scores.shape} and inclusion bits {included.shape} must be two vectors of length m")
    m = int(scores.shape[0])
    scored = int(np.isfinite(scores).sum())
    grid = guess_grid(scored)
    per_point = 1.0 - (1.0 - confidence) / max(1, len(grid))
    best = OneRunAudit(
        m=m, guesses=0, correct=0, k_plus=0, k_minus=0, epsilon_lower_bound=0.0, confidence=confidence,
        abstained=m, scored=scored, grid_size=len(grid), delta=delta, scorer=scorer,
    )
    for k_plus, k_minus in grid:
        guesses = guess_from_scores(scores, k_plus, k_minus)
        made = int(np.count_nonzero(guesses))
        correct = count_correct(guesses, included)
        bound = epsilon_lower_bound(made, correct, delta, per_point, m)
        # ties (e.g. nothing rejected anywhere) go to the most guesses: the overall accuracy
        if bound > best.epsilon_lower_bound or (bound == best.epsilon_lower_bound and made > best.guesses):
            best = best.model_copy(update={
                "guesses": made, "correct": correct, "k_plus": k_plus, "k_minus": k_minus,
                "epsilon_lower_bound": bound, "abstained": m - made,
            })
    return best


def _check_counts(guesses: int, correct: int, m: int) -> None:
    if not 0 <= correct <= guesses <= m:
        raise ValueError(f"need 0 <= correct <= guesses <= m, got correct={correct}, guesses={guesses}, m={m}")
