"""Edge sensitivities and participation bounds of vesper's PMP, as derived in docs/privacy.md.

Setting (docs/privacy.md, section 3): layer l releases, for every node v it computes,
the noisy aggregate ǎ_v = a_v + N(0, θ² I) of the previous layer's representations,
which are non-negative with norm ≤ 1. The extractor reads either

* the raw graph with neighbour sampling (``sampler``: top-D by a secret pair key,
  fanout 0 = all neighbours; sections 3.1–3.4), where adding one edge (u*, v*) changes
  the sample of each endpoint by at most one element, or
* the stable degree-D projection P(G) (``degree_projection``), read whole (sections
  3.5–3.6), where adding one edge changes P by at most three edges on four nodes.

These functions return the L2 sensitivity S of the collection {a_v} over all nodes for
one layer (``layer_sensitivity``) and one step (``step_sensitivity``), N_e, the number
of roots whose release one edge can change (``participation_bound``), the sensitivity
of a whole pass (``pass_sensitivity``, section 4.3), and the rule the trainer charges
(``charge_rule``). Nothing here computes ε: the accountant does, from the DpEvent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

EXTRACTORS = ("mlp", "pmp-gin", "pmp-gcn")

# Scan limit for fanout 0 (all neighbours): past the D_min boundary every term below
# decreases in the degree (docs/privacy.md, section 3.3), so the maximum lies inside.
_FULL_NEIGHBOURHOOD_SCAN = 1024


def gin_layer_sensitivity(fanout: int) -> float:
    """PMP-GIN, a_v = Σ_{u ∈ N_s(v)} h_u (docs/privacy.md, section 3.2; cf. [VESPER, Prop. 1]).

    At each endpoint the new edge either adds one message (‖h_u*‖ ≤ 1) or, when the
    endpoint already has ≥ D neighbours, swaps one (‖h_u* − h_w‖ ≤ √2 for non-negative
    vectors of norm ≤ 1). Two endpoints: S = √(2·2) = 2 with sampling, √2 without.
    """
    per_endpoint_squared = 2.0 if fanout > 0 else 1.0
    return math.sqrt(2.0 * per_endpoint_squared)


def _c(k: np.ndarray | float) -> np.ndarray | float:
    """GCN normalisation 1/√(k+1) for a capped degree k."""
    return 1.0 / np.sqrt(np.asarray(k, dtype=np.float64) + 1.0)


def gcn_endpoint_terms(fanout: int, d_min: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For an endpoint of degree k (without the new edge), k = 0..K: (k, R(k), Δ(k)).

    R(k) bounds the change of the endpoint's own aggregate (docs/privacy.md, eqs. G1–G4);
    Δ(k) is the change of the endpoint's sender coefficient c(d̂) seen by each neighbour
    that samples it (eq. G5), non-zero only while the capped degree still grows (k < D).
    """
    capped = fanout > 0
    top = fanout if capped else max(_FULL_NEIGHBOURHOOD_SCAN, 2 * d_min + 64)
    k = np.arange(0, top + 1, dtype=np.float64)
    c1 = float(_c(1))  # every sender has capped degree ≥ 1
    crossing = (k + 1) * _c(k + 1) * c1  # eq. G2: 0 -> a full aggregate of k+1 messages
    active = np.sqrt(((_c(k) - _c(k + 1)) * k * c1) ** 2 + (_c(k + 1) * c1) ** 2)  # eq. G3
    receiver = np.where(k + 1 < d_min, 0.0, np.where(k + 1 == d_min, crossing, active))
    delta = _c(k) - _c(k + 1)
    if capped:
        swap = k >= fanout
        receiver = np.where(swap, float(_c(fanout)), receiver)  # eq. G4
        delta = np.where(swap, 0.0, delta)
    return k, receiver, delta


@lru_cache(maxsize=256)
def gcn_layer_sensitivity(fanout: int, d_min: int) -> float:
    """Truncated PMP-GCN, a_v = 1[d̂_v ≥ D_min] Σ_{u ∈ N_s(v)} h_u / √((d̂_v+1)(d̂_u+1)).

    docs/privacy.md, section 3.3: maximise over both endpoints' degrees (k, m)
    S² = R(k)² + R(m)² + c*² (k Δ(k)² + m Δ(m)² + 2 min(k, m) Δ(k) Δ(m)),
    c* = 1/√(max(D_min, 1) + 1); the last term counts common neighbours once.
    """
    k, receiver, delta = gcn_endpoint_terms(fanout, d_min)
    c_star = float(_c(max(d_min, 1)))
    own = receiver**2 + c_star**2 * k * delta**2
    cross = 2.0 * c_star**2 * np.minimum.outer(k, k) * np.outer(delta, delta)
    total = own[:, None] + own[None, :] + cross
    return float(math.sqrt(total.max()))


# ---------------------------------------------------------------------------------------
# Reading the stable degree-D projection P(G) whole (docs/privacy.md, sections 3.5-3.6, 4.2-4.3)
# ---------------------------------------------------------------------------------------
#
# Adding e = (u*, v*) to G' changes P by e (added or not) and at most one displaced edge
# (u*, u'), (v*, v') per endpoint (docs/privacy.md, Lemma 4), in one of four configurations:
#   T1  e added, both endpoints displace an edge, u' ≠ v'
#   T2  e added, both endpoints displace an edge to the same w = u' = v'
#   T3  e added, only u* displaces an edge
#   T4  e added, nothing displaced (also covers e not added but (u*, u') displaced,
#       which is a single-edge removal between degree-bounded graphs)
# Each configuration below lists, for every node whose aggregate can change, a bound on
# ‖Δa_w‖² over a grid of the degrees that matter, and w's degree in P(G) ∪ P(G').
# PMP-GIN and PMP-GCN differ only in the sender coefficient s(j) and receiver gain g(j)
# of a node of projected degree j (eqs. A1, A2): a_v = g(d_v) Σ_{x ∈ N_P(v)} s(d_x) h_x.


@dataclass(frozen=True)
class _Coefficients:
    """s(j), g(j) for j = 0..D, and their maxima over possible degrees j ∈ [1, D] (s̄, ḡ)."""

    sender: np.ndarray
    gain: np.ndarray
    max_sender: float
    max_gain: float


def _coefficients(name: str, degree_bound: int, d_min: int) -> _Coefficients:
    """PMP-GIN: s ≡ g ≡ 1 (eq. A1). Truncated PMP-GCN: s = c, g = c · 1[j ≥ D_min] (eq. A2)."""
    j = np.arange(degree_bound + 1, dtype=np.float64)
    if name == "pmp-gin":
        ones = np.ones_like(j)
        return _Coefficients(ones, ones, 1.0, 1.0)
    sender = np.asarray(_c(j))
    gain = np.where(j >= d_min, sender, 0.0)
    return _Coefficients(sender, gain, float(sender[1:].max()), float(gain[1:].max()))


@dataclass(frozen=True)
class _NodeTerm:
    """A bound on Σ ‖Δa_w‖² for one changed node w (or all changed nodes outside the core).

    Fixed form: ``squared`` over the degree grid, with w's degree in P(G) ∪ P(G')
    ``union_degree`` (how many roots w reaches). Free-gain form (``free_extra`` set): the
    bound is g(j)² · ``squared`` for w's own degree j ∈ [1, D], which no other term
    depends on, and w's union degree is j + ``free_extra``; the maximum over j is taken
    when the terms are weighted (eq. R3), and is ḡ² · ``squared`` for one layer.
    """

    squared: np.ndarray
    union_degree: np.ndarray | int = 0
    free_extra: int | None = None


def _split_squared(*coefficients: np.ndarray | float) -> np.ndarray:
    """docs/privacy.md's Lemma 1 on one receiver (eq. J1): with non-negative inputs of norm ≤ 1,
    ‖Σ_x κ_x h_x‖² ≤ (Σ_x κ_x⁺)² + (Σ_x κ_x⁻)², attained by aligned positive and
    aligned negative senders orthogonal to each other."""
    positive = sum(np.maximum(np.asarray(k, dtype=np.float64), 0.0) for k in coefficients)
    negative = sum(np.maximum(-np.asarray(k, dtype=np.float64), 0.0) for k in coefficients)
    return positive**2 + negative**2


def _outside(senders: list[tuple[np.ndarray | int, np.ndarray]]) -> _NodeTerm:
    """Eq. J2: nodes outside the core see only sender coefficients move.

    An outside node y gets Δa_y = g(d_y) Σ_x δ_x h_x over its core neighbours x whose
    coefficient moved by δ_x. Summed over y, with n_x outside neighbours of x and at
    most min(n_x, n_x') of them shared, docs/privacy.md's Lemma 1 gives
    g(d_y)² (Σ_x n_x δ_x² + 2 Σ_{x<x'} min(n_x, n_x') max(δ_x δ_x', 0)): opposite
    moves land in different halves of the split and do not add up. y's degree is its
    union degree (y is neither u* nor v*).
    """
    total = sum(np.asarray(n) * delta**2 for n, delta in senders)
    for i, (n_i, delta_i) in enumerate(senders):
        for n_j, delta_j in senders[i + 1 :]:
            total = total + 2.0 * np.minimum(n_i, n_j) * np.maximum(delta_i * delta_j, 0.0)
    return _NodeTerm(total, free_extra=0)


def _swapping_endpoint(*coefficients: np.ndarray | float) -> _NodeTerm:
    """u* (or v*) of unchanged degree j: e in, (u*, u') out. Its coefficients are
    g(j) · κ, and its union degree is j + 1 (both e and (u*, u'))."""
    return _NodeTerm(_split_squared(*coefficients), free_extra=1)


def _t1(co: _Coefficients, degree_bound: int, alpha: int, beta: int, gamma: int) -> list[_NodeTerm]:
    """Eq. T1: u*, v* swap u' → v*, v' → u* (degrees unchanged); u', v' drop p → p−1, q → q−1.

    Optional stable edges among the core: α = u*~v', β = v*~u', γ = u'~v'.
    Grid: p, q ∈ [1, D] (degrees of u', v' in P(G')).
    """
    s, g, s_max = co.sender, co.gain, co.max_sender
    p = np.arange(1, degree_bound + 1)[:, None]
    q = np.arange(1, degree_bound + 1)[None, :]
    rho_u, rho_v = g[p - 1] - g[p], g[q - 1] - g[q]  # receiver gain moves at u', v'
    delta_u, delta_v = s[p - 1] - s[p], s[q - 1] - s[q]  # their sender coefficients move
    n_u, n_v = p - 1 - beta - gamma, q - 1 - alpha - gamma  # outside neighbours of u', v'
    feasible = (n_u >= 0) & (n_v >= 0)
    terms = [
        _swapping_endpoint(s_max, -s[p], alpha * delta_v),
        _swapping_endpoint(s_max, -s[q], beta * delta_u),
        _NodeTerm(
            _split_squared(-g[p] * s_max, beta * rho_u * s_max, gamma * (g[p - 1] * s[q - 1] - g[p] * s[q]), n_u * rho_u * s_max),
            p,
        ),
        _NodeTerm(
            _split_squared(-g[q] * s_max, alpha * rho_v * s_max, gamma * (g[q - 1] * s[p - 1] - g[q] * s[p]), n_v * rho_v * s_max),
            q,
        ),
        _outside([(n_u, delta_u), (n_v, delta_v)]),
    ]
    return [_NodeTerm(np.where(feasible, t.squared, 0.0), t.union_degree, t.free_extra) for t in terms]


def _t2(co: _Coefficients, degree_bound: int) -> list[_NodeTerm]:
    """Eq. T2: u*, v* both swap w → the other endpoint; w drops r → r−2. Grid: r ∈ [2, D]."""
    s, g, s_max = co.sender, co.gain, co.max_sender
    r = np.arange(2, degree_bound + 1)
    return [
        _swapping_endpoint(s_max, -s[r]),
        _swapping_endpoint(s_max, -s[r]),
        _NodeTerm(_split_squared(-2.0 * g[r] * s_max, (r - 2) * (g[r - 2] - g[r]) * s_max), r),
        _outside([(r - 2, s[r - 2] - s[r])]),
    ]


def _t3(co: _Coefficients, degree_bound: int, beta: int) -> list[_NodeTerm]:
    """Eq. T3: u* swaps u' → v*; v* grows k → k+1; u' drops p → p−1; β = v*~u'.

    Grid: k ∈ [0, D−1] (v*'s degree in P(G')), p ∈ [1, D].
    """
    s, g, s_max = co.sender, co.gain, co.max_sender
    k = np.arange(0, degree_bound)[:, None]
    p = np.arange(1, degree_bound + 1)[None, :]
    n_v, n_u = k - beta, p - 1 - beta
    feasible = (n_v >= 0) & (n_u >= 0)
    terms = [
        _swapping_endpoint(s[k + 1], -s[p]),
        _NodeTerm(
            _split_squared(g[k + 1] * s_max, beta * (g[k + 1] * s[p - 1] - g[k] * s[p]), n_v * (g[k + 1] - g[k]) * s_max),
            k + 1,
        ),
        _NodeTerm(
            _split_squared(-g[p] * s_max, beta * (g[p - 1] * s[k + 1] - g[p] * s[k]), n_u * (g[p - 1] - g[p]) * s_max),
            p,
        ),
        _outside([(n_v, s[k + 1] - s[k]), (n_u, s[p - 1] - s[p])]),
    ]
    return [_NodeTerm(np.where(feasible, t.squared, 0.0), t.union_degree, t.free_extra) for t in terms]


def _t4(co: _Coefficients, degree_bound: int) -> list[_NodeTerm]:
    """Eq. T4: e joins u*, v* of degrees m, k ∈ [0, D−1] (both grow by one), nothing displaced."""
    s, g, s_max = co.sender, co.gain, co.max_sender
    m = np.arange(0, degree_bound)[:, None]
    k = np.arange(0, degree_bound)[None, :]
    return [
        _NodeTerm(_split_squared(g[m + 1] * s[k + 1], m * (g[m + 1] - g[m]) * s_max), m + 1),
        _NodeTerm(_split_squared(g[k + 1] * s[m + 1], k * (g[k + 1] - g[k]) * s_max), k + 1),
        _outside([(m, s[m + 1] - s[m]), (k, s[k + 1] - s[k])]),
    ]


@lru_cache(maxsize=64)
def _projected_configurations(name: str, degree_bound: int, d_min: int) -> tuple[tuple[str, tuple[_NodeTerm, ...]], ...]:
    """Every configuration of docs/privacy.md's Lemma 4 with its per-node bounds (eqs. T1–T4)."""
    co = _coefficients(name, degree_bound, d_min)
    flags = [(a, b, c) for a in (0, 1) for b in (0, 1) for c in (0, 1)]
    configurations = [(f"T1{f}", tuple(_t1(co, degree_bound, *f))) for f in flags]
    if degree_bound >= 2:  # w = u' = v' needs two edges
        configurations.append(("T2", tuple(_t2(co, degree_bound))))
    configurations += [(f"T3({beta})", tuple(_t3(co, degree_bound, beta))) for beta in (0, 1)]
    configurations.append(("T4", tuple(_t4(co, degree_bound))))
    return tuple(configurations)


def _max_weighted(name: str, degree_bound: int, d_min: int, weight: Callable[[np.ndarray | int], np.ndarray | float]) -> float:
    """max over configurations and degree grids of Σ_w weight(d_∪(w)) · ‖Δa_w‖²."""
    gain = _coefficients(name, degree_bound, d_min).gain
    own = np.arange(1, degree_bound + 1)
    best = 0.0
    for _, terms in _projected_configurations(name, degree_bound, d_min):
        total = 0.0
        for t in terms:
            if t.free_extra is None:
                total = total + t.squared * weight(t.union_degree)
            else:  # the node's own degree j is free: max_j g(j)² weight(j + extra)
                total = total + t.squared * float(np.max(gain[own] ** 2 * weight(own + t.free_extra)))
        best = max(best, float(np.max(total)))
    return best


def projected_layer_sensitivity(name: str, degree_bound: int, d_min: int) -> float:
    """One layer's sensitivity when the extractor reads P(G) whole (eq. J3).

    S² = max over T1–T4 of Σ_w ‖Δa_w‖². PMP-GIN: S = 2√2, attained by T2 (eq. J4).
    """
    return math.sqrt(_max_weighted(name, degree_bound, d_min, lambda degree: np.ones_like(degree, dtype=np.float64)))


def roots_within(union_degree: np.ndarray | int, hops: int, degree_bound: int) -> np.ndarray | int:
    """n_h(w) ≤ 1 + d_∪(w) Σ_{j<h} D^j: nodes within h hops of w in P(G) ∪ P(G') (eq. R3).

    Every node of the union has degree ≤ D + 1 (only u*, v* exceed D, by e), so each
    node after w adds at most D new neighbours.
    """
    return 1 + union_degree * sum(degree_bound**j for j in range(hops))


def projected_pass_sensitivity(name: str, layers: int, degree_bound: int, d_min: int) -> float:
    """Eq. R3: S_pass² = max Σ_l Σ_w ‖Δa_w^(l)‖² · n_{L−l}(w) over one pass on P(G).

    Node w's layer-l aggregate is computed (and noised afresh) in every step with a
    root within L − l hops of w, hence at most n_{L−l}(w) times per pass.
    """

    def weight(union_degree: np.ndarray | int) -> np.ndarray:
        return np.asarray(sum(roots_within(union_degree, hops, degree_bound) for hops in range(layers)), dtype=np.float64)

    return math.sqrt(_max_weighted(name, degree_bound, d_min, weight))


def projected_edge_reach(name: str, layers: int, degree_bound: int) -> int:
    """N_e on P(G) (eqs. N2, N3): roots within L−1 hops of a node whose aggregate can change.

    The changed nodes W: the core of the configuration (GIN), plus the neighbours of
    core nodes whose degree changed (GCN's sender coefficients). With F edges leaving
    W in P(G) ∪ P(G') and every node outside W of degree ≤ D (one edge back):
    N_e ≤ |W| + F Σ_{j < L−1} (D − 1)^j, maximised by T1 (computed per configuration
    in docs/privacy.md, section 4.2).
    """
    d = degree_bound
    if name == "pmp-gin":  # (|W|, F) of T1, T2, T3, T4: W is the core
        cases = [(4, 4 * (d - 1)), (3, 3 * d - 4), (3, 3 * (d - 1)), (2, 2 * (d - 1))]
    else:  # W adds the other neighbours of the core nodes whose degree moved
        cases = [(2 * d + 2, 2 * d * (d - 1)), (d + 1, d * (d - 1)), (2 * d + 1, (2 * d - 1) * (d - 1)), (2 * d, 2 * (d - 1) ** 2)]
    growth = sum((d - 1) ** j for j in range(layers - 1))
    return max(size + max(frontier, 0) * growth for size, frontier in cases)


# ---------------------------------------------------------------------------------------
# What the trainer and the accountant use
# ---------------------------------------------------------------------------------------


def layer_sensitivity(name: str, fanout: int, d_min: int, degree_bound: int = 0) -> float:
    """S of one layer's aggregates {a_v}_{v ∈ V}: eqs. G0/G6 (sampling) or J3 (projection)."""
    _check_name(name)
    if name == "mlp":
        return 0.0
    if degree_bound > 0:
        return projected_layer_sensitivity(name, degree_bound, d_min)
    if name == "pmp-gin":
        return gin_layer_sensitivity(fanout)
    return gcn_layer_sensitivity(fanout, d_min)


def step_sensitivity(name: str, layers: int, fanout: int, d_min: int, degree_bound: int = 0) -> float:
    """Sensitivity of one step's L noisy layers together: √(Σ_l S_l²) = √L · S_layer.

    L Gaussian mechanisms with the same θ compose into one Gaussian mechanism of this
    sensitivity (docs/privacy.md, section 3.4). [VESPER, Thm. 2.1] needs this S.
    """
    return math.sqrt(layers) * layer_sensitivity(name, fanout, d_min, degree_bound)


def participation_bound(name: str, layers: int, fanout: int, degree_bound: int = 0) -> int | None:
    """N_e: roots (hence releases per pass) whose embedding can depend on one edge.

    docs/privacy.md, eqs. N1-N3. ``None`` means every release: without a projection,
    L ≥ 2 reaches roots within L−1 hops in the *unsampled* graph, whose degree is not
    bounded. With ``degree_bound`` D > 0 the extractor reads P(G) whole (eqs. N2, N3).
    """
    _check_name(name)
    if name == "mlp":
        return 0
    if degree_bound > 0:
        return projected_edge_reach(name, layers, degree_bound)
    if layers > 1:
        return None
    if name == "pmp-gin":
        return 2
    # the endpoints, plus neighbours whose sender coefficient moves (only while the
    # endpoint's capped degree is below D, so fewer than D of them per endpoint)
    return 2 * fanout if fanout > 0 else None


def pass_sensitivity(name: str, layers: int, fanout: int, d_min: int, degree_bound: int = 0) -> float | None:
    """Sensitivity of a whole pass (every node a root at most once; section 4.3, eq. R1).

    L = 1 without a projection: each node's aggregate is computed once per pass, and the
    per-node bounds behind G0/G6 hold for every sampling seed, so S_pass = S_layer.
    With a projection: eq. R3. L ≥ 2 without a projection: ``None`` (a node's aggregate
    is recomputed for each of its unboundedly many neighbours that are roots).
    """
    _check_name(name)
    if name == "mlp":
        return 0.0
    if degree_bound > 0:
        return projected_pass_sensitivity(name, layers, degree_bound, d_min)
    if layers == 1:
        return layer_sensitivity(name, fanout, d_min)
    return None


@dataclass(frozen=True)
class ChargeRule:
    """How one run is charged per pass (docs/privacy.md, section 4.3).

    Each counted release is a Gaussian mechanism with noise std θ = z · ``sensitivity``;
    the first ``participation_bound`` releases of each pass are counted (None: all).
    μ² per pass = participation_bound · sensitivity² / θ².
    """

    sensitivity: float  # of each counted release: S_step (per-step form) or S_pass (per-pass form)
    participation_bound: int | None  # counted releases per pass; None = every release counts
    form: str  # "per-step" or "per-pass"
    step_sensitivity: float  # √(Σ_l S_l²) of one step, what [VESPER, Thm. 2.1] needs
    derivation: str  # the docs/privacy.md equations behind the numbers
    edge_reach: int | None  # N_e: roots per pass whose release one edge can change (None = unbounded)

    @property
    def pass_cost(self) -> float:
        """μ²θ² charged per pass (∞ when every release counts)."""
        if self.participation_bound is None:
            return math.inf
        return self.participation_bound * self.sensitivity**2


def _check_name(name: str) -> None:
    if name not in EXTRACTORS:
        raise ValueError(f"unknown extractor {name!r}; expected one of {', '.join(EXTRACTORS)}")


def _check_arguments(name: str, layers: int, fanout: int, d_min: int, degree_bound: int) -> None:
    _check_name(name)
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    if fanout < 0 or d_min < 0 or degree_bound < 0:
        raise ValueError(f"fanout, d_min and degree_bound must be >= 0, got {fanout}, {d_min}, {degree_bound}")
    if name == "mlp" or degree_bound == 0:
        return
    if 0 < fanout < degree_bound:
        raise ValueError(
            f"fanout {fanout} below the degree bound {degree_bound} is not supported: the projection "
            "is the degree bound and the extractor reads every projected neighbour (use fanout 0); "
            "sampling below D on top of the projection has no derived sensitivity"
        )
    if name == "pmp-gcn" and d_min > degree_bound:
        raise ValueError(
            f"d_min {d_min} above the degree bound {degree_bound}: no node of the projected graph "
            "would receive a message"
        )


_DERIVATIONS = {
    ("per-step", False): "docs/privacy.md: per-layer S eqs. G0/G6, step S section 3.4, N_e eq. N1",
    ("per-pass", False): "docs/privacy.md: per-node bounds of eqs. G0/G6, pass form eqs. R1-R2 (L = 1)",
    ("per-step", True): "docs/privacy.md: Lemma 4, per-layer S eqs. T1-T4, J1-J3, step S section 3.4, N_e eqs. N2-N3",
    ("per-pass", True): "docs/privacy.md: Lemma 4, eqs. T1-T4, J1-J2, pass form eqs. R1-R3",
}


def charge_rule(
    name: str, layers: int, fanout: int, d_min: int, degree_bound: int, *, allow_per_pass: bool = True
) -> ChargeRule:
    """The cheaper valid way to charge one pass (docs/privacy.md, section 4.3, eq. R4).

    Per-step form: N_e counted releases of sensitivity S_step (μ²θ² = N_e S_step²).
    Per-pass form: one counted release of sensitivity S_pass (μ²θ² = S_pass²).
    ``degree_bound`` 0 means the extractor reads the raw graph with neighbour sampling
    at ``fanout`` (0 = all neighbours); D > 0 means it reads P(G) whole.
    ``allow_per_pass=False`` forces the per-step form, for accounting that must see one
    event per release (amplification by a per-release edge sample applies to a release,
    not to the composition of a pass: section 4.3).
    """
    _check_arguments(name, layers, fanout, d_min, degree_bound)
    projected = degree_bound > 0
    if name == "mlp":
        return ChargeRule(0.0, 0, "per-step", 0.0, "docs/privacy.md, eq. N1: mlp reads no edges", 0)
    step = step_sensitivity(name, layers, fanout, d_min, degree_bound)
    reach = participation_bound(name, layers, fanout, degree_bound)
    per_step = ChargeRule(step, reach, "per-step", step, _DERIVATIONS["per-step", projected], reach)
    whole_pass = pass_sensitivity(name, layers, fanout, d_min, degree_bound)
    if whole_pass is None or not allow_per_pass:
        return per_step
    per_pass = ChargeRule(whole_pass, 1, "per-pass", step, _DERIVATIONS["per-pass", projected], reach)
    return per_pass if per_pass.pass_cost < per_step.pass_cost else per_step
