"""DP-APPR: differentially private top-K personalised-PageRank neighbourhoods [DPAR, §3.1].

The core shared by the ``dpar-edge`` and ``dpar-node`` extractors. For a set of source
nodes s it computes, in batches of sources (memory O(batch x N), never an N x N matrix):

1. the APPR vector p_s of every source with ISTA ([DPAR, Alg. 1, line 4], i.e.
   Fountoulakis et al. [FRS+19, Alg. 3]; docs/extractors/dpar.md eq. I1),
2. the clipped utility scores u_sj = min(p_sj, C), the source itself excluded
   ([DPAR, Alg. 1, line 6]; eq. C1),
3. a private top-K of each row, either
   * ``exponential``: the exponential mechanism run K times without replacement, drawn
     as one-shot Gumbel noise of scale b on every score ([DPAR, Alg. 1, lines 8-10]; Durfee &
     Rogers [DR19], which also prove the K-round / one-shot equivalence), or
   * ``gaussian``: report-noisy-top-K, Gaussian noise N(0, σ²) on every clipped score and
     the K largest noisy scores ([DPAR, Alg. 3, lines 8-10], on the element-clipped scores).

plus column clipping of the released sparse matrix ([DPAR, Alg. 2, line 3]), the
post-processing that bounds each node's total weight over all neighbourhoods.

The sensitivities the accountant is charged are derived in docs/extractors/dpar.md
(section 3) and implemented at the end of this module: :func:`edge_level_sensitivity`
(adding or removing one undirected edge) and :func:`node_level_sensitivity` (removing
every edge of one node). Nothing here computes ε; the accountant does, from the DpEvent.

Conventions: P = D⁻¹A is the random-walk matrix, with P_vv = 1 for an isolated node v
(a walker there stays), so every row of P sums to 1. Vectors are rows: p_s P is one walk
step from the distribution p_s, and a batch of B sources is a [B, N] matrix, sparse
while its iterates are (the first hops) and dense afterwards.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch

from vesper.party_a.graph_store import Graph
from vesper.party_a.noise import NoiseSource

Mechanism = Literal["gaussian", "exponential"]

# Sources per batch are chosen so one dense [B, N] float tensor has about this many
# elements (64 MB in float32); a batch holds a few of them at once.
DEFAULT_BATCH_ELEMENTS = 1 << 24
# While a batch's ISTA iterate has fewer non-zeros than this fraction, it is kept sparse
# and a walk step multiplies two sparse matrices (work Σ_j d_j over the non-zeros);
# above it, sparse x dense (work nnz(P)·B). From a one-hot start the first iterates are
# very sparse even on dense graphs (Tolokers: 1 and ~90 non-zeros per source).
_SPARSE_DENSITY = 0.05


# -- the walk ------------------------------------------------------------------------------
@contextmanager
def _sparse_quiet() -> Iterator[None]:
    """torch's notices that sparse CSR is beta and that invariant checks are off."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        yield


@dataclass(frozen=True)
class WalkOperator:
    """The random walk P = D⁻¹A (P_vv = 1 if d_v = 0), as sparse CSR P and Pᵀ.

    Row s of P lists s's neighbours with value 1/d_s; row k of Pᵀ lists k's neighbours
    j with value 1/d_j. An isolated node has the single entry (v, v) = 1 in both.
    """

    forward: torch.Tensor  # sparse CSR [N, N], P
    transposed: torch.Tensor  # sparse CSR [N, N], Pᵀ
    degree: torch.Tensor  # float [N], d_v (0 for isolated nodes)
    num_nodes: int

    @property
    def device(self) -> torch.device:
        return self.degree.device


def _csr(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A sparse CSR matrix from (row, col, value) triples without repeats."""
    order = torch.argsort(rows * max(shape[1], 1) + cols)
    crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=rows.device)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=shape[0]), 0)
    with _sparse_quiet():
        return torch.sparse_csr_tensor(crow, cols[order], values[order], shape)


def walk_operator(graph: Graph, dtype: torch.dtype = torch.float32) -> WalkOperator:
    """P and Pᵀ for ``graph``'s symmetric CSR (isolated nodes get a self-loop, see the module doc)."""
    n, device = graph.num_nodes, graph.device
    degree = graph.degree
    isolated = torch.nonzero(degree == 0).flatten()
    rows = torch.cat([torch.repeat_interleave(torch.arange(n, device=device), degree), isolated])
    cols = torch.cat([graph.indices, isolated])
    inv_degree = 1.0 / degree.clamp(min=1).to(dtype)  # 1 for isolated nodes: P_vv = 1
    forward = _csr(rows, cols, inv_degree[rows], (n, n))
    transposed = _csr(rows, cols, inv_degree[cols], (n, n))  # A symmetric: Pᵀ[k, j] = A[k, j] / d_j
    return WalkOperator(forward, transposed, degree.to(dtype), n)


def walk_step(op: WalkOperator, x: torch.Tensor) -> torch.Tensor:
    """x P: one random-walk step of every row (source) of x [B, N], sparse CSR or dense.

    Sparse x is multiplied sparse x sparse (result sparse CSR), dense x as (Pᵀ xᵀ)ᵀ.
    Both compute the same product; which one runs depends only on x's support, which is
    never released.
    """
    with _sparse_quiet():
        if x.layout == torch.sparse_csr:
            return torch.sparse.mm(x, op.forward)
        return torch.sparse.mm(op.transposed, x.t()).t()


# -- ISTA APPR (eq. I1) ---------------------------------------------------------------------
def soft_threshold(x: torch.Tensor, theta: torch.Tensor | None) -> torch.Tensor:
    """S_θ(x) = max(x − θ_j, 0) per column j of a dense x (in place): the prox of ρα‖D^½q‖₁.

    1-Lipschitz in x and in θ, which is all the sensitivity proof uses (dpar.md, Lemma 3).
    θ = None (ρ = 0): the identity on the non-negative iterates.
    """
    return x if theta is None else x.sub_(theta).clamp_(min=0.0)


def _sparse_threshold(x: torch.Tensor, theta: torch.Tensor | None) -> torch.Tensor:
    """S_θ on a coalesced sparse COO x (entries at θ or below become explicit zeros)."""
    if theta is None:
        return x
    values = (x.values() - theta[x.indices()[1]]).clamp_(min=0.0)
    return torch.sparse_coo_tensor(x.indices(), values, x.shape, is_coalesced=True)


def _csr_to_dense(x: torch.Tensor) -> torch.Tensor:
    """A sparse CSR matrix as a dense one: one scatter (torch's to_dense is slower here: docs/performance-notes.md)."""
    crow = x.crow_indices()
    rows = torch.repeat_interleave(torch.arange(x.shape[0], device=x.device), crow[1:] - crow[:-1])
    out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    out.index_put_((rows, x.col_indices()), x.values())  # CSR has no repeated (row, col)
    return out


def ista_step(
    op: WalkOperator, x: torch.Tensor, sources: torch.Tensor, alpha: float, theta: torch.Tensor | None
) -> torch.Tensor:
    """One ISTA iteration in p-coordinates (eq. I1): p ← S_θ((1 − α) p P + α e_s), θ_j = ραd_j.

    This is Fountoulakis et al.'s [FRS+19, Alg. 3] (proximal gradient, step 1) for
    min_q ½ qᵀ(I − (1−α)D^{-½}AD^{-½})q − α⟨D^{-½}e_s, q⟩ + ρα‖D^{½}q‖₁ written for
    p = D^{½}q; with ρ = 0 it is the power series of PPR, α Σ_t (1−α)^t e_s P^t.
    The result stays sparse CSR while it has few non-zeros, otherwise it is dense.
    """
    stepped = walk_step(op, x)
    batch = torch.arange(sources.numel(), device=op.device)
    if stepped.layout == torch.sparse_csr:
        if stepped._nnz() < _SPARSE_DENSITY * stepped.shape[0] * stepped.shape[1]:
            start = torch.sparse_coo_tensor(
                torch.stack([batch, sources]), torch.full((sources.numel(),), alpha, dtype=op.degree.dtype, device=op.device),
                stepped.shape,
            )
            moved = (stepped.to_sparse_coo() * (1.0 - alpha) + start).coalesce()
            return _sparse_threshold(moved, theta).to_sparse_csr()
        stepped = _csr_to_dense(stepped)
    else:
        stepped = stepped.contiguous()
    stepped.mul_(1.0 - alpha)
    stepped[batch, sources] += alpha
    return soft_threshold(stepped, theta)


def ista_appr(op: WalkOperator, sources: torch.Tensor, alpha: float, rho: float, iterations: int) -> torch.Tensor:
    """p_s = p^T of ISTA from p^0 = 0 for every source [DPAR, Alg. 1, line 4], dense rows [B, N].

    The number of iterations T is fixed in advance, never a data-dependent tolerance:
    the sensitivity bound (dpar.md, Lemma 3) holds for every T, but a stopping rule that
    reads the graph would make T itself depend on the edge. p^T has support within T − 1
    hops of s; with ρ = 0 its ℓ1 distance to the exact PPR vector is (1 − α)^T.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if rho < 0.0 or iterations < 1:
        raise ValueError(f"need rho >= 0 and iterations >= 1, got {rho}, {iterations}")
    sources = sources.to(op.device)
    theta = rho * alpha * op.degree if rho > 0 else None
    b, n = sources.numel(), op.num_nodes
    # p^1 = S_θ(α e_s) (p^0 = 0 contributes no walk step): one entry per row
    first = torch.full((b,), alpha, dtype=op.degree.dtype, device=op.device)
    if theta is not None:
        first = (first - theta[sources]).clamp_(min=0.0)
    crow = torch.arange(b + 1, device=op.device)
    with _sparse_quiet():
        x = torch.sparse_csr_tensor(crow, sources, first, (b, n))
    for _ in range(iterations - 1):
        x = ista_step(op, x, sources, alpha, theta)
    return _csr_to_dense(x) if x.layout == torch.sparse_csr else x.contiguous()


# -- clipping (eq. C1) and the private top-K ------------------------------------------------
def clip_scores(p: torch.Tensor, sources: torch.Tensor, clip: float) -> torch.Tensor:
    """u_sj = min(p_sj, C) [DPAR, Alg. 1, line 6], and u_ss = −∞: s is never its own candidate.

    Excluding s is data-independent; the root's own representation reaches B separately.
    In place on ``p``.
    """
    if clip <= 0:
        raise ValueError(f"the clipping bound C must be > 0, got {clip}")
    u = p.clamp_(max=clip)
    u[torch.arange(sources.numel(), device=u.device), sources.to(u.device)] = -math.inf
    return u


def top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K largest (noisy) scores of each row, in decreasing order: (indices, values)."""
    values, indices = torch.topk(scores, k, dim=1, largest=True, sorted=True)
    return indices, values


def gaussian_top_k(
    u: torch.Tensor, k: int, sigma: float, source: NoiseSource | None, rows: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Report-noisy-top-K: the K largest of u + N(0, σ²) per row, with their noisy values
    [DPAR, Alg. 3, lines 8-10].

    Releasing the whole noisy matrix is one Gaussian mechanism (dpar.md eq. G); the
    indices and noisy values of the K largest are post-processing of it. σ = 0: exact.
    The noise comes from A's NoiseSource (``rows``: the source node of each row of u);
    it is added to ``u`` in place.
    """
    if sigma > 0:
        u = _noise_source(source).gaussian(u, sigma, rows=rows)
    return top_k(u, k)


def gumbel_top_k(
    u: torch.Tensor, k: int, scale: float, source: NoiseSource | None, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """K rounds of the exponential mechanism, Pr[j] ∝ exp(u_sj / b), without replacement.

    Drawn as the K largest of u + Gumbel(b) (one-shot Gumbel; Durfee & Rogers
    [DR19, Lemma 4.2]: the same distribution over ordered K-tuples as K peeling rounds). Only the
    indices are released. b = 0: exact top-K. Adds the noise to ``u`` in place.
    """
    if scale > 0:
        u = _noise_source(source).gumbel(u, scale, rows=rows)
    return top_k(u, k)[0]


def _noise_source(source: NoiseSource | None) -> NoiseSource:
    if source is None:
        raise ValueError("a noisy top-K needs party A's NoiseSource (party_a.noise)")
    return source


def clip_columns(indices: torch.Tensor, weights: torch.Tensor, num_nodes: int, tau: float) -> torch.Tensor:
    """Π_{:,j} ← Π_{:,j} / max(1, ‖Π_{:,j}‖₁ / τ) on the sparse top-K matrix [DPAR, Alg. 2, line 3].

    ``indices``/``weights`` [S, K] are row s's selected nodes and their non-negative
    weights. Afterwards every node j carries total weight ≤ τ over all neighbourhoods,
    which bounds its features' reach in a forward release (node level). Post-processing
    of the released selection: it costs nothing and is not needed at edge level.
    """
    if tau <= 0:
        raise ValueError(f"the column clipping bound τ must be > 0, got {tau}")
    column_mass = torch.zeros(num_nodes, dtype=weights.dtype, device=weights.device)
    column_mass.index_add_(0, indices.reshape(-1), weights.reshape(-1))
    scale = 1.0 / torch.clamp(column_mass / tau, min=1.0)
    return weights * scale[indices]


@dataclass(frozen=True)
class TopK:
    """The released neighbourhoods of ``sources``: indices [S, K'] and values [S, K'].

    ``values`` are the noisy scores (Gaussian) or empty (exponential: indices only).
    """

    sources: torch.Tensor
    indices: torch.Tensor
    values: torch.Tensor | None


def batch_size_for(num_nodes: int, batch_elements: int = DEFAULT_BATCH_ELEMENTS) -> int:
    """Sources per batch so a dense [N, B] tensor has about ``batch_elements`` entries."""
    return max(1, batch_elements // max(num_nodes, 1))


def private_top_k(
    graph: Graph,
    sources: torch.Tensor,
    *,
    alpha: float,
    rho: float,
    iterations: int,
    clip: float,
    k: int,
    mechanism: Mechanism,
    noise: float,
    source: NoiseSource | None,
    batch_elements: int = DEFAULT_BATCH_ELEMENTS,
) -> TopK:
    """DP-APPR over ``sources`` ([DPAR, Algs. 1 and 3] on element-clipped scores), batched.

    ``noise`` is σ of the Gaussian (mechanism "gaussian") or the Gumbel scale b
    ("exponential"); 0 releases the exact top-K (ε = ∞). K is capped at N − 1, the
    number of candidates. Every batch draws its noise from ``source`` (A's NoiseSource) in
    order, so a run is reproducible from A's secret seed. The caller charges the release first.
    """
    if mechanism not in ("gaussian", "exponential"):
        raise ValueError(f"unknown mechanism {mechanism!r}; expected gaussian or exponential")
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    op = walk_operator(graph)
    k_eff = min(k, graph.num_nodes - 1)
    sources = sources.to(op.device)
    indices, values = [], []
    for batch in sources.split(batch_size_for(graph.num_nodes, batch_elements)):
        u = clip_scores(ista_appr(op, batch, alpha, rho, iterations), batch, clip)
        if mechanism == "gaussian":
            chosen, noisy = gaussian_top_k(u, k_eff, noise, source, batch)
            values.append(noisy)
        else:
            chosen = gumbel_top_k(u, k_eff, noise, source, batch)
        indices.append(chosen)
    cat_values = torch.cat(values) if values else None
    return TopK(sources, torch.cat(indices), cat_values)


# -- sensitivities (docs/extractors/dpar.md, section 3) -------------------------------------
@dataclass(frozen=True)
class ApprChange:
    """How much the APPR matrix {p_s} over the sources can change (dpar.md, Theorem 1).

    ``l1`` bounds Σ_s ‖Δp_s‖₁ (eq. D1), ``linf`` bounds Σ_s ‖Δp_s‖_∞ (eq. D2).
    """

    l1: float
    linf: float


def appr_change(alpha: float, rho: float, num_sources: int, edges_changed: int = 1) -> ApprChange:
    """Bounds on the total change of {p_s} when ``edges_changed`` undirected edges differ.

    One edge (dpar.md, Theorem 1): Σ_s ‖Δp_s‖₁ ≤ 4(1−α)/α + 2ρ·|S| (D1) and, for ρ = 0,
    Σ_s ‖Δp_s‖_∞ ≤ 2(1−α)/α (D2); for ρ > 0 the ℓ1 bound is used for both. m edges:
    m times each, by the triangle inequality along a path of single-edge changes (each
    step's bound holds for whatever graph it starts from).
    """
    if not 0.0 < alpha < 1.0 or rho < 0 or num_sources < 0 or edges_changed < 0:
        raise ValueError("need 0 < alpha < 1, rho >= 0, num_sources >= 0, edges_changed >= 0")
    walk = (1.0 - alpha) / alpha
    l1 = 4.0 * walk + 2.0 * rho * num_sources
    linf = 2.0 * walk if rho == 0 else l1
    return ApprChange(edges_changed * l1, edges_changed * linf)


@dataclass(frozen=True)
class Sensitivity:
    """What each selection variant is charged for (dpar.md, eqs. G and E).

    ``gaussian``: L2 sensitivity of the whole clipped score matrix {u_sj}.
    ``exponential``: √(Σ_s ‖Δu_s‖_∞²), the per-round zCDP "range" of K-round EM.
    """

    gaussian: float
    exponential: float
    change: ApprChange


def edge_level_sensitivity(alpha: float, rho: float, clip: float, num_sources: int, edges_changed: int = 1) -> Sensitivity:
    """Add or remove one undirected edge (dpar.md, Theorem 2).

    With |Δu_sj| ≤ min(C, |Δp_sj|) (clipping is 1-Lipschitz and u ∈ [0, C]):

        S_G²  = Σ_s ‖Δu_s‖₂²  ≤ max_s‖Δu_s‖_∞ · Σ_s ‖Δu_s‖₁  ≤ min(C, A_∞) · A₁     (G)
        S_EM² = Σ_s ‖Δu_s‖_∞² ≤ max_s‖Δu_s‖_∞ · Σ_s ‖Δu_s‖_∞ ≤ min(C, A_∞) · A_∞    (E)

    with A₁, A_∞ of :func:`appr_change`.
    """
    if clip <= 0:
        raise ValueError(f"the clipping bound C must be > 0, got {clip}")
    change = appr_change(alpha, rho, num_sources, edges_changed)
    cap = min(clip, change.linf)
    return Sensitivity(math.sqrt(cap * change.l1), math.sqrt(cap * change.linf), change)


def node_level_sensitivity(
    alpha: float, rho: float, clip: float, num_sources: int, edges_changed: int | None = None
) -> Sensitivity:
    """Remove every edge of one node w (w stays, isolated; dpar.md, section 3.6).

    Every source's scores can change, each by at most C per entry (u ∈ [0, C]), so the
    paper's sequential composition over the sources gives S_EM² ≤ |S|·C². When the graph
    read has bounded degree, ``edges_changed`` = m (the number of edges of that graph in
    which the two neighbours differ, derived for the projection used) gives the
    structural bounds of :func:`edge_level_sensitivity` with m edges; the smaller of the
    two applies. Without a row ℓ2 clip the Gaussian variant has only the structural bound,
    so it needs ``edges_changed``.
    """
    per_source = math.sqrt(num_sources) * clip
    if edges_changed is None:
        return Sensitivity(math.inf, per_source, ApprChange(math.inf, math.inf))
    structural = edge_level_sensitivity(alpha, rho, clip, num_sources, edges_changed)
    return Sensitivity(structural.gaussian, min(per_source, structural.exponential), structural.change)
