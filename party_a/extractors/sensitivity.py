"""Edge sensitivities and participation bounds of vesper's PMP, as derived in docs/privacy.md.

Setting (docs/privacy.md, section 3): layer l releases, for every node v it computes,
the noisy aggregate ǎ_v = a_v + N(0, θ² I) of the previous layer's representations,
which are non-negative with norm ≤ 1. Neighbours are sampled as in
:mod:`vesper.party_a.sampler` (top-D by a secret pair key; fanout 0 = all of them).
Adding one edge (u*, v*) changes the sample of each endpoint by at most one element.

These functions return the L2 sensitivity S of the collection {a_v} over all nodes
for one layer, and N_e, the number of roots whose released embedding can depend on
one edge. Nothing here computes ε: the accountant does, from the DpEvent.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

# Scan limit for fanout 0 (all neighbours): past the D_min boundary every term below
# decreases in the degree (docs/privacy.md, section 3.3), so the maximum lies inside.
_FULL_NEIGHBOURHOOD_SCAN = 1024


def gin_layer_sensitivity(fanout: int) -> float:
    """PMP-GIN, a_v = Σ_{u ∈ N_s(v)} h_u (docs/privacy.md, section 3.2; cf. Proposition 1).

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


def layer_sensitivity(name: str, fanout: int, d_min: int) -> float:
    if name == "pmp-gin":
        return gin_layer_sensitivity(fanout)
    if name == "pmp-gcn":
        return gcn_layer_sensitivity(fanout, d_min)
    if name == "mlp":
        return 0.0
    raise ValueError(f"unknown extractor {name!r}")


def step_sensitivity(name: str, layers: int, fanout: int, d_min: int) -> float:
    """Sensitivity of one step's L noisy layers together: √(Σ_l S_l²) = √L · S_layer.

    L Gaussian mechanisms with the same θ compose into one Gaussian mechanism of this
    sensitivity (docs/privacy.md, section 3.4).
    """
    return math.sqrt(layers) * layer_sensitivity(name, fanout, d_min)


def participation_bound(name: str, layers: int, fanout: int) -> int | None:
    """N_e: roots (hence releases per pass) whose embedding can depend on one edge.

    docs/privacy.md, section 4. ``None`` means every release, which is what vesper
    charges until a degree bound is enforced on the graph (L ≥ 2 reaches roots
    within L-1 hops in the *unsampled* graph, whose degree is not bounded).
    """
    if name == "mlp":
        return 0
    if layers > 1:
        return None
    if name == "pmp-gin":
        return 2
    if name == "pmp-gcn":
        # the endpoints, plus neighbours whose sender coefficient moves (only while the
        # endpoint's capped degree is below D, so fewer than D of them per endpoint)
        return 2 * fanout if fanout > 0 else None
    raise ValueError(f"unknown extractor {name!r}")
