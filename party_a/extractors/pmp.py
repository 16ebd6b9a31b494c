"""Perturbed message passing (PMP): VESPER's private representation extractor.

One layer l, for every node v the step computes ([VESPER, Alg. 1, steps 7-9]; [VESPER, Alg. 2]
for the truncated GCN; docs/privacy.md section 2 for why vesper's form differs):

    a_v    = Σ_{u ∈ N_s(v)} β_uv h_u^(l-1)            the edge-dependent aggregate
    ǎ_v    = a_v + N(0, θ² I)                          the Gaussian mechanism ([VESPER, eq. 34]'s noise)
    h_v^(l) = normalize(relu(W_self h_v^(l-1) + W_agg ǎ_v))

* PMP-GIN: β_uv = 1.
* PMP-GCN with truncated message passing: β_uv = 1[d̂_v ≥ D_min] / √((d̂_v+1)(d̂_u+1)),
  d̂ = min(degree, D); nodes below D_min receive no messages ([VESPER, Alg. 2, step 6]),
  only noise, and keep their own representation through W_self.
* MLP: no aggregate, no edges, nothing to charge.

Two deliberate differences from the paper, both needed for the guarantee to cover
A's training loop (docs/privacy.md, section 2): the noise is added to the aggregate
*before* the weight (W is post-processing, so the sensitivity does not depend on
‖W‖_op), and no gradient flows through a_v (A's parameters then depend on the graph
only through noisy aggregates, which the accountant has charged).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from vesper.common.config import ExtractorConfig
from vesper.party_a.encoder import MlpEncoder
from vesper.party_a.extractors.spectral_norm import normalised_weights, spectral_norm
from vesper.party_a.keyed_dropout import DropoutKey
from vesper.party_a.noise import NoiseKey, NoiseSource
from vesper.party_a.sampler import Block, SampledSubgraph

# torch warns once per process that sparse CSR is beta; _adjacency's use is tested against index_add_
warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state", category=UserWarning)
_SPARSE_FROM_MESSAGES = 1024  # below, gathering the messages costs less than building the CSR


def _adjacency(block: Block, weight: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The block's messages as a sparse CSR matrix [dst, src], one entry per message.

    Within a row the entries keep the block's message order; ``torch.sparse.mm`` adds up each
    destination's messages without materialising a [messages, d] tensor (faster on CPU from
    about a thousand messages: docs/performance.md), equal to ``index_add_``'s sums to float
    rounding (MKL's kernel may add them in another order: tests/test_perf_kernels.py).
    """
    edge_dst, edge_src = block.edge_dst, block.edge_src
    values = torch.ones(edge_dst.numel(), dtype=dtype, device=edge_dst.device) if weight is None else weight
    if edge_dst.numel() > 1 and not bool((edge_dst[1:] >= edge_dst[:-1]).all()):
        order = torch.sort(edge_dst, stable=True).indices  # the sampler's blocks are sorted already
        edge_dst, edge_src, values = edge_dst[order], edge_src[order], values[order]
    crow = torch.zeros(block.dst_count + 1, dtype=torch.int64, device=edge_dst.device)
    torch.cumsum(torch.bincount(edge_dst, minlength=block.dst_count), 0, out=crow[1:])
    return torch.sparse_csr_tensor(
        crow, edge_src, values, size=(block.dst_count, block.src_nodes.numel()), check_invariants=False
    )


@dataclass(frozen=True)
class BlockMessages:
    """A block's messages as the aggregation reads them, built from the graph alone (no
    feature, no parameter), so the prefetch can build them while B computes: the sparse
    [dst, src] matrix of the weights β_uv from ``_SPARSE_FROM_MESSAGES`` messages on,
    otherwise the weights alone (None: every β_uv = 1)."""

    adjacency: torch.Tensor | None
    weight: torch.Tensor | None


def block_messages(block: Block, weight: torch.Tensor | None, dtype: torch.dtype) -> BlockMessages:
    if block.edge_dst.numel() >= _SPARSE_FROM_MESSAGES:
        return BlockMessages(_adjacency(block, weight, dtype), None)
    return BlockMessages(None, weight)


def gcn_weights(block: Block, capped_degree: torch.Tensor, d_min: int, dtype: torch.dtype) -> torch.Tensor:
    """β_uv = 1[d̂_v ≥ D_min] / √((d̂_v+1)(d̂_u+1)) per message ([VESPER, eq. 33], neighbour part)."""
    # index_select: advanced indexing (x[i]) is several times slower on CPU
    degree_src = capped_degree.index_select(0, block.src_nodes).to(dtype)
    degree_dst = degree_src[: block.dst_count]  # the destinations are the first sources
    scale_dst = torch.rsqrt(degree_dst + 1) * (degree_dst >= d_min).to(dtype)
    scale_src = torch.rsqrt(degree_src + 1)
    return scale_dst.index_select(0, block.edge_dst) * scale_src.index_select(0, block.edge_src)


def _sum_messages(block: Block, h_src: torch.Tensor, messages: BlockMessages) -> torch.Tensor:
    """Per destination, the (weighted) sum of its messages h_u, added in message order.

    Small blocks gather the messages and ``index_add_`` them; from
    ``_SPARSE_FROM_MESSAGES`` on, the sparse product is faster (tests: the same sums to float rounding).
    """
    if messages.adjacency is not None:
        return torch.sparse.mm(messages.adjacency, h_src)
    gathered = h_src.index_select(0, block.edge_src)
    if messages.weight is not None:
        gathered = gathered.mul_(messages.weight[:, None])
    return h_src.new_zeros(block.dst_count, h_src.shape[1]).index_add_(0, block.edge_dst, gathered)


def gin_aggregate(block: Block, h_src: torch.Tensor) -> torch.Tensor:
    """a_v = Σ_{u ∈ N_s(v)} h_u for the block's destination nodes."""
    return _sum_messages(block, h_src, block_messages(block, None, h_src.dtype))


def gcn_aggregate(block: Block, h_src: torch.Tensor, capped_degree: torch.Tensor, d_min: int) -> torch.Tensor:
    """a_v = 1[d̂_v ≥ D_min] Σ_{u ∈ N_s(v)} h_u / √((d̂_v+1)(d̂_u+1))  ([VESPER, eq. 33], neighbour part)."""
    return _sum_messages(block, h_src, block_messages(block, gcn_weights(block, capped_degree, d_min, h_src.dtype), h_src.dtype))


@dataclass(frozen=True)
class LayerWeights:
    """One layer's weights as a step uses them: W_self, its bias, and gain · W_agg."""

    self_weight: torch.Tensor
    self_bias: torch.Tensor
    agg_weight: torch.Tensor | None


@dataclass(frozen=True)
class ReleaseInputs:
    """What one release reads that depends on no parameter: the features of its subgraph's
    input nodes (the roots first: every block's destinations are its first sources), their
    encoder dropout mask (None: the encoder applies none) and the mechanism's streamed N(0, 1)
    noise, one tensor per layer (None: drawn in the pass, or none). Party A's prefetch builds
    them while B computes (pmp_plugin.prefetch); they are the same whenever they are built."""

    features: torch.Tensor  # [len(input_nodes), F]
    keep: torch.Tensor | None  # [len(input_nodes), hidden]
    noise: list[torch.Tensor] | None = None  # layer l: [blocks[l].dst_count, d]

    def rows(self, start: int, stop: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rows ``start:stop`` of both."""
        return self.features[start:stop], None if self.keep is None else self.keep[start:stop]


class PmpLayer(nn.Module):
    """h_v^(l) = normalize(relu(W_self h_v^(l-1) + W_agg ǎ_v)); W_agg absent for MLP."""

    def __init__(self, dim: int, aggregates: bool, use_spectral_norm: bool) -> None:
        super().__init__()
        wrap = spectral_norm if use_spectral_norm else (lambda module: module)
        self.self_weight = wrap(nn.Linear(dim, dim))
        self.agg_weight = wrap(nn.Linear(dim, dim, bias=False)) if aggregates else None
        # with ‖W_agg‖_op pinned at 1, this gain lets training turn a noisy aggregate down
        self.agg_gain = nn.Parameter(torch.ones(())) if aggregates else None

    def weights(self, self_weight: torch.Tensor | None = None, agg_weight: torch.Tensor | None = None) -> LayerWeights:
        """The weights, spectrally normalised: each read of a normalised weight runs a power
        step, so a training step reads them once and hands them to both passes.
        ``self_weight``/``agg_weight``: the normalised weights, already read
        (``PmpExtractor.step_weights`` reads every layer's at once)."""
        w_self = self.self_weight.weight if self_weight is None else self_weight
        agg = None
        if self.agg_weight is not None and self.agg_gain is not None:
            # gain · (W_agg ǎ) as (gain · W_agg) ǎ: the gain scales d² numbers, not rows x d
            agg = self.agg_gain * (self.agg_weight.weight if agg_weight is None else agg_weight)
        return LayerWeights(w_self, self.self_weight.bias, agg)

    def forward(
        self, h_own: torch.Tensor, noisy_aggregate: torch.Tensor | None, weights: LayerWeights | None = None
    ) -> torch.Tensor:
        w = self.weights() if weights is None else weights
        pre = F.linear(h_own, w.self_weight, w.self_bias)
        if w.agg_weight is not None:
            pre = torch.addmm(pre, noisy_aggregate, w.agg_weight.t())  # one pass: + ǎ (gain · W_agg)ᵀ
        return F.normalize(F.relu(pre), dim=-1)


class PmpExtractor(nn.Module):
    """Encoder plus L PMP layers; returns the roots' embeddings of every layer, B x d x L."""

    def __init__(self, config: ExtractorConfig, in_features: int, capped_degree: torch.Tensor | None) -> None:
        super().__init__()
        self.name = config.name
        self.d_min = config.d_min
        self.aggregates = config.name != "mlp"
        if self.aggregates and capped_degree is None:
            raise ValueError("a PMP extractor needs the graph's capped degrees")
        self.register_buffer("capped_degree", capped_degree, persistent=False)
        self.encoder = MlpEncoder(in_features, config.encoder_hidden, config.dim, config.dropout)
        self.layers = nn.ModuleList(
            PmpLayer(config.dim, self.aggregates, config.spectral_norm) for _ in range(config.layers)
        )

    def step_weights(self) -> list[LayerWeights]:
        """Every layer's ``PmpLayer.weights()``, the spectral normalisations computed together
        (party_a.extractors.spectral_norm.normalised_weights: one power step for all)."""
        linears = [layer.self_weight for layer in self.layers]
        if self.aggregates:
            linears += [layer.agg_weight for layer in self.layers]
        normalised = normalised_weights(linears)
        count = len(self.layers)
        return [
            layer.weights(normalised[i], normalised[count + i] if self.aggregates else None)
            for i, layer in enumerate(self.layers)
        ]

    def aggregate(
        self, block: Block, h_src: torch.Tensor, capped_degree: torch.Tensor | None = None,
        messages: BlockMessages | None = None,
    ) -> torch.Tensor:
        """The pre-noise release a of one layer (what the sensitivity bounds).

        ``capped_degree`` overrides the graph's, for a release that reads a subsample
        of the edges (its GCN coefficients must come from the graph it read).
        ``messages``: the block's messages from :meth:`messages`, built ahead; the same
        as gin_aggregate / gcn_aggregate compute.
        """
        if messages is None:
            messages = self._block_messages(block, capped_degree, h_src.dtype)
        return _sum_messages(block, h_src, messages)

    def _block_messages(self, block: Block, capped_degree: torch.Tensor | None, dtype: torch.dtype) -> BlockMessages:
        if self.name == "pmp-gin":
            return block_messages(block, None, dtype)
        degree = self.capped_degree if capped_degree is None else capped_degree
        return block_messages(block, gcn_weights(block, degree, self.d_min, dtype), dtype)

    def messages(self, subgraph: SampledSubgraph, capped_degree: torch.Tensor | None = None) -> list[BlockMessages] | None:
        """Every block's messages and weights β_uv (as ``aggregate`` builds them itself when
        not given): graph structure only, so party A's prefetch builds them while B computes
        (pmp_plugin.prefetch). None for the MLP, which reads no edge."""
        if not self.aggregates:
            return None
        dtype = self.layers[0].self_weight.bias.dtype
        return [self._block_messages(block, capped_degree, dtype) for block in subgraph.blocks]

    def perturb(
        self, aggregate: torch.Tensor, block: Block, noise_std: float, noise: NoiseSource | None,
        noise_key: NoiseKey | None = None, layer: int = 0, drawn: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """ǎ_v = a_v + N(0, θ² I_d) for every destination v of the block [VESPER, eq. 34]: the
        Gaussian mechanism, drawn from A's secret noise (party_a.noise); in place, a is fresh.
        With the release's ``noise_key``, v's noise in ``layer`` is keyed by (key, layer, v)
        (party_a.noise.keyed_normal): the same wherever v is reached (docs/privacy.md, 2.6).
        ``drawn``: the layer's N(0, 1) values, drawn ahead (:meth:`release_inputs`)."""
        if noise is None or noise_std == 0:
            return aggregate
        return noise.gaussian(aggregate, noise_std, rows=block.dst_nodes, key=noise_key, layer=layer, drawn=drawn)

    def release_inputs(
        self, subgraph: SampledSubgraph, features: torch.Tensor, dropout_key: DropoutKey | None,
        noise_std: float = 0.0, noise: NoiseSource | None = None,
    ) -> ReleaseInputs:
        """The release's :class:`ReleaseInputs`: its input nodes' features and dropout mask, and,
        where the pass would stream its noise from ``noise``'s generator (θ = ``noise_std`` > 0,
        not keyed), each layer's N(0, 1) draws, in the order the pass would draw them."""
        inputs = subgraph.input_nodes  # the roots first (sampler.Block: a block's destinations lead its sources)
        with torch.no_grad():  # the mechanism's pass reads them without gradient
            rows = features.index_select(0, inputs.to(features.device))
        drawn = None
        if self.aggregates and noise is not None and not noise.keyed and noise_std > 0:
            dtype = self.layers[0].self_weight.bias.dtype
            width = self.layers[0].self_weight.in_features
            drawn = [noise.standard_normal((block.dst_count, width), dtype) for block in subgraph.blocks]
        return ReleaseInputs(rows, self.encoder.dropout_mask(inputs.to(features.device), dropout_key), drawn)

    @torch.no_grad()
    def noisy_aggregates(
        self,
        subgraph: SampledSubgraph,
        features: torch.Tensor,
        noise_std: float,
        noise: NoiseSource | None,
        capped_degree: torch.Tensor | None = None,
        weights: list[LayerWeights] | None = None,
        messages: list[BlockMessages] | None = None,
        dropout_key: DropoutKey | None = None,
        noise_key: NoiseKey | None = None,
        inputs: ReleaseInputs | None = None,
        encoded_roots: torch.Tensor | None = None,
    ) -> list[torch.Tensor | None]:
        """The mechanism: every read of the graph, each noised [VESPER, Alg. 1, steps 5-9].

        Runs all L layers over the sampled subgraph and returns, per layer, the roots'
        noisy aggregates ǎ. No gradient exists here, so nothing A learns later can
        depend on an un-noised aggregate. ``weights``: the layers' weights for this step
        (``PmpLayer.weights``), read here without gradient; ``messages``: the blocks'
        messages (:meth:`messages`), built ahead; ``dropout_key``: the release's secret
        dropout key (party_a.keyed_dropout), so each node's mask is its own, wherever the
        pass reaches it; ``noise_key``: the release's secret noise key (party_a.noise), drawn
        here when not given and ``noise`` is keyed (party A's workers), so each node's noise is
        its own in every layer; otherwise the noise is streamed from ``noise``'s generator.
        ``inputs``: :meth:`release_inputs`, built ahead; ``encoded_roots``: the roots' h^(0),
        already computed (the encoder reads no edge: the pass then encodes only the others).
        The MLP reads no edge and releases no aggregate: it runs no pass.
        """
        if not self.aggregates:
            return [None] * len(self.layers)
        if noise_key is None and noise is not None and noise.keyed and noise_std > 0:
            noise_key = noise.draw_key()
        num_roots = subgraph.roots.numel()
        if inputs is None:
            inputs = self.release_inputs(subgraph, features, dropout_key, noise_std, None if noise_key else noise)
        nodes = subgraph.input_nodes.to(features.device)
        if encoded_roots is None:
            h = self.encoder(inputs.features, nodes, dropout_key, inputs.keep)
        else:
            others, keep = inputs.rows(num_roots)
            h = torch.cat([encoded_roots.detach(), self.encoder(others, nodes[num_roots:], dropout_key, keep)])
        noisy_roots: list[torch.Tensor | None] = []
        last = len(subgraph.blocks) - 1
        for index, (layer, block) in enumerate(zip(self.layers, subgraph.blocks)):
            noisy = self.aggregate(block, h, capped_degree, None if messages is None else messages[index])
            drawn = None if inputs.noise is None else inputs.noise[index]
            noisy = self.perturb(noisy, block, noise_std, noise, noise_key, index, drawn)
            noisy_roots.append(noisy[:num_roots])
            if index < last:  # h^(L) of the pass is never read: the roots' chain recomputes it
                h = layer(h[: block.dst_count], noisy, None if weights is None else weights[index])
        return noisy_roots

    def forward(
        self,
        subgraph: SampledSubgraph,
        features: torch.Tensor,
        noise_std: float,
        noise: NoiseSource | None,
        capped_degree: torch.Tensor | None = None,
        messages: list[BlockMessages] | None = None,
        dropout_key: DropoutKey | None = None,
        inputs: ReleaseInputs | None = None,
    ) -> torch.Tensor:
        """B x d x L embeddings of the roots: post-processing of the noisy aggregates.

        Each root's own chain h_r^(0) -> h_r^(1) -> ... -> h_r^(L) is computed with gradient
        from its features and its noisy aggregates, so A's update [VESPER, eq. 39] flows into
        the encoder and both weights of every layer, never into the graph. The roots' h^(0) is
        encoded once, for both the chain and the mechanism's pass (which reads it detached),
        with the dropout mask of the release's key. ``inputs``: :meth:`release_inputs`, built
        ahead (computed here when not given).
        """
        weights = self.step_weights()  # with gradient, once for both passes
        if inputs is None:
            inputs = self.release_inputs(subgraph, features, dropout_key, noise_std, noise)
        roots = subgraph.roots.to(features.device)
        own, keep = inputs.rows(0, roots.numel())
        if features.requires_grad:  # h^(0) given as a leaf (measurements, tests): the chain's rows take its gradient
            own = features.index_select(0, roots)
        h = self.encoder(own, roots, dropout_key, keep)
        # an encoder without parameters gives h^(0) (measurements, tests): reading its rows again
        # costs less than joining the roots' to the others'
        shared = h if any(True for _ in self.encoder.parameters()) else None
        noisy = self.noisy_aggregates(
            subgraph, features, noise_std, noise, capped_degree, weights, messages, dropout_key,
            inputs=inputs, encoded_roots=shared,
        )
        per_layer = []
        for layer, aggregate, w in zip(self.layers, noisy, weights):
            h = layer(h, aggregate, w)
            per_layer.append(h)
        return torch.stack(per_layer, dim=-1)
