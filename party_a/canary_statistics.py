"""White-box canary statistics over every release of the canary endpoints (docs/audit-canaries.md, §4).

The replay (auditor.canary_replay) sees one release per node; the accountant's ε composes
every epoch's. Here party A, in an audited run, computes at each release t of a canary
endpoint x, with its weights of that moment and nothing that depends on the coins S:

    a_out,t, a_in,t   the noiseless layer-1 aggregate of x on A's graph without canaries,
                      and with x's candidate pair added (the two hypotheses of S_i)
    h_out,t, h_in,t   the noiseless release built on them (PmpLayer, no noise)

and accumulates, per endpoint (Δ = in − out, μ = (in + out)/2),

    mechanism   Σ_t ⟨ǎ_t − μ^a_t, Δ^a_t⟩       ǎ_t: the noisy aggregate the mechanism released
    release     Σ_t Δ^h_t  and  Σ_t μ^h_t      B combines them with its sums of y_t.

For a Gaussian release ǎ_t ~ N(a_t, θ² I) the mechanism statistic is θ² times the log-
likelihood ratio of "inserted" against "not inserted" (Neyman-Pearson, the optimal test),
summed over the releases: under visible-batch accounting it sees exactly the Gaussian
events the accountant composes. Every y_t B receives is post-processing of ǎ_t (pmp.py), so
the DP claim is a claim about the ǎ_t, and the one-run theorem holds for any guess computed
from them and from S-free quantities: A's weights (post-processing of earlier releases), A's
graph without canaries (every candidate removed, whatever S), the candidate pair. The
release statistic gives the score B could compute from its own sums (received.npz):

    score_i = Σ_{x ∈ {u_i, v_i}} ⟨Σ_t y_t − Σ_t μ^h_t, Σ_t Δ^h_t⟩.

The references use the encoder without dropout (the release's dropout mask is A's internal
randomness, and which nodes it is drawn for depends on S): a mismatch that weakens the test
on training releases, never its validity. Supported: per-step PMP (pmp-gin, pmp-gcn) with
L = 1, no degree projection, no edge subsampling, and endpoints whose degree with the canary
stays ≤ the fanout (party_a.canaries selects such endpoints), so the neighbourhood a release
reads does not depend on A's secret sampling.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vesper.party_a.canaries import CanaryDraw, with_all_candidates, without_candidates
from vesper.party_a.extractors.base import Extractor
from vesper.party_a.extractors.pmp import PmpExtractor
from vesper.party_a.extractors.pmp_plugin import PmpPlugin
from vesper.party_a.sampler import NeighbourSampler

STATISTICS_FILE = "canary_statistics.npz"


def unsupported_reason(extractor: Extractor) -> str:
    """Why the per-release statistics cannot be computed for ``extractor`` ('' when they can)."""
    if not isinstance(extractor, PmpPlugin) or not extractor.aggregates:
        return f"{extractor.spec.name} is not a per-step PMP extractor (pmp-gin, pmp-gcn)"
    ex = extractor.setup.config.extractor
    if ex.layers != 1:
        return f"extractor.layers={ex.layers}: the statistics cover L = 1 (a canary moves 2-hop releases through noisy layers)"
    if ex.degree_bound:
        return "extractor.degree_bound: a canary can displace edges of the projection"
    if extractor.edge_rate:
        return "privacy.edge_sample_rate: each release reads a secret subsample of the edges"
    return ""


class CanaryStatistics:
    """The per-endpoint sums above, accumulated over a run's releases (party A, audited runs)."""

    def __init__(self, draw: CanaryDraw, num_nodes: int, dim: int, layers: int) -> None:
        self.draw = draw
        self.endpoints = np.sort(draw.pairs.reshape(-1))
        self.slot = torch.full((num_nodes,), -1, dtype=torch.int64)
        self.slot[torch.from_numpy(self.endpoints)] = torch.arange(self.endpoints.size)
        n = self.endpoints.size
        self.mechanism = torch.zeros(n, dtype=torch.float64)
        self.delta_sum = torch.zeros(n, dim, layers, dtype=torch.float64)
        self.mid_sum = torch.zeros(n, dim, layers, dtype=torch.float64)
        self.releases = torch.zeros(n, dtype=torch.int64)

    def add(self, slots: torch.Tensor, noisy: torch.Tensor, a_out: torch.Tensor, a_in: torch.Tensor,
            h_out: torch.Tensor, h_in: torch.Tensor) -> None:
        """One release of the endpoints at ``slots``: ǎ (n, d) and the references."""
        delta_a = (a_in - a_out).double()
        self.mechanism.index_add_(0, slots, ((noisy.double() - 0.5 * (a_in + a_out).double()) * delta_a).sum(1))
        self.delta_sum.index_add_(0, slots, (h_in - h_out).double()[..., None])
        self.mid_sum.index_add_(0, slots, (0.5 * (h_in + h_out)).double()[..., None])
        self.releases.index_add_(0, slots, torch.ones_like(slots))

    def save(self, path: Path) -> None:
        np.savez(
            path, endpoints=self.endpoints, mechanism=self.mechanism.numpy(), delta_sum=self.delta_sum.numpy(),
            mid_sum=self.mid_sum.numpy(), releases=self.releases.numpy(),
        )


class _References:
    """A's noiseless layer-1 aggregates and releases of canary endpoints under both hypotheses."""

    def __init__(self, extractor: PmpPlugin, draw: CanaryDraw) -> None:
        base = without_candidates(extractor.graph, draw)
        self.graphs = (base, with_all_candidates(base, draw))
        self.degrees = tuple(extractor.capped_degree(g) for g in self.graphs)
        self.model: PmpExtractor = extractor.model
        self.features = extractor.setup.features

    @torch.no_grad()
    def __call__(self, nodes: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(a_out, a_in, h_out, h_in) of ``nodes`` with the current weights, dropout off."""
        # fanout 0: the endpoints keep all their neighbours under both hypotheses (party_a.canaries)
        blocks = [NeighbourSampler(graph, 0, 1).sample(nodes, [(0, 0)]).blocks[0] for graph in self.graphs]
        reached = blocks[1].src_nodes  # with the pairs ⊇ without; the nodes themselves come first
        local = torch.empty(self.features.shape[0], dtype=torch.int64, device=reached.device)
        local[reached] = torch.arange(reached.numel(), device=reached.device)
        modules = (self.model.encoder, self.model.layers[0])
        modes = [m.training for m in modules]
        for m in modules:  # eval: no dropout mask drawn, no spectral-norm power step taken
            m.train(False)
        try:
            h = self.model.encoder(self.features[reached])  # one encoder pass for both hypotheses
            a_out, a_in = (
                self.model.aggregate(block, h[local[block.src_nodes]], degree)[: nodes.numel()]
                for block, degree in zip(blocks, self.degrees)
            )
            layer, h_own = self.model.layers[0], h[: nodes.numel()]
            return a_out, a_in, layer(h_own, a_out), layer(h_own, a_in)
        finally:
            for m, mode in zip(modules, modes):
                m.train(mode)


def observe_releases(extractor: Extractor, statistics: CanaryStatistics) -> None:
    """Make every release of ``extractor`` add its canary endpoints to ``statistics``.

    Wraps the model's ``noisy_aggregates`` (the mechanism, pmp.py) on this instance: the
    release itself, its noise, and what is charged and sent are unchanged.
    """
    reason = unsupported_reason(extractor)
    if reason:
        raise ValueError(f"canary statistics: {reason}")
    assert isinstance(extractor, PmpPlugin)
    references = _References(extractor, statistics.draw)
    mechanism = extractor.model.noisy_aggregates

    def observed(subgraph, features, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 (same signature)
        noisy = mechanism(subgraph, features, *args, **kwargs)
        slots = statistics.slot[subgraph.roots.cpu()]
        hit = slots >= 0
        if bool(hit.any()):
            nodes = subgraph.roots[hit.to(subgraph.roots.device)]
            refs = [r.detach().cpu() for r in references(nodes)]
            statistics.add(slots[hit], noisy[0][hit.to(noisy[0].device)].detach().cpu(), *refs)
        return noisy

    extractor.model.noisy_aggregates = observed
