"""VESPER's per-step extractors as plugins: MLP, PMP-GIN and truncated PMP-GCN.

Each training step and evaluation chunk is one release: PMP over the roots' sampled
subgraphs (party_a.extractors.pmp) with noise θ = z · S, charged by the rule of
party_a.extractors.sensitivity (docs/privacy.md, sections 3-5). The graph the
releases read is A's graph, optionally projected to degree D (degree_projection) and,
per release, Poisson-subsampled at rate q (edge_sampling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from vesper.common.privacy.hidden_batch_reproduction import theorem21_gamma
from vesper.common.privacy.ledger import PlanRule
from vesper.common.seeded_init import seeded
from vesper.party_a.degree_projection import project_degree
from vesper.party_a.edge_sampling import EdgeSubsampler
from vesper.party_a.extractors.base import (
    ChargePlan,
    ExtractorBase,
    ExtractorSetup,
    ExtractorSpec,
    ReleaseKind,
    RootPlan,
)
from vesper.party_a.extractors.pmp import BlockMessages, PmpExtractor, ReleaseInputs
from vesper.party_a.extractors.sensitivity import charge_rule
from vesper.party_a.graph_store import Graph
from vesper.party_a.keyed_dropout import DropoutKey, counter_key
from vesper.party_a.sampler import NeighbourSampler, SampledSubgraph, draw_order_key, edgeless_subgraph

_SHARED = ("layers", "dim", "encoder_hidden", "dropout", "spectral_norm", "noise_multiplier")
_GRAPH = ("fanout", "degree_bound")


@dataclass(frozen=True)
class _Sample:
    """What one release reads before its parameters: its blocks, the capped degrees of the
    graph they were sampled from (None: A's graph), their messages (pmp.BlockMessages), and
    its input nodes' features, their dropout mask and the noise's draws (pmp.ReleaseInputs)."""

    subgraph: SampledSubgraph
    capped_degree: torch.Tensor | None
    messages: list[BlockMessages] | None
    dropout_key: DropoutKey  # the release's secret dropout key (party_a.keyed_dropout)
    inputs: ReleaseInputs


class PmpPlugin(ExtractorBase):
    """Per-step release: every step's B x d x L is PMP over the batch's subgraphs."""

    def __init__(self, setup: ExtractorSetup) -> None:
        super().__init__(setup)
        ex = setup.config.extractor
        self.graph = setup.graph
        self.aggregates = self.spec.name != "mlp"
        if self.aggregates and ex.degree_bound > 0:
            # the stable degree-D projection, under a seed only A knows (docs/privacy.md, 3.5)
            seed = torch.randint(0, 1 << 32, (2,), generator=setup.sampling_generator, dtype=torch.int64).tolist()
            self.graph = project_degree(setup.graph, ex.degree_bound, (seed[0], seed[1]))
        self.fanout = 0 if ex.degree_bound > 0 else ex.fanout  # a projection is read whole
        self.sampler = (
            NeighbourSampler(self.graph, self.fanout, ex.layers, draw_order_key(setup.sampling_generator, self.fanout))
            if self.aggregates else None
        )
        self.edge_rate = setup.config.privacy.edge_sample_rate if self.aggregates else 0.0
        self._edge_subsampler: EdgeSubsampler | None = None
        with seeded(setup.config.seed):
            self.model = PmpExtractor(
                ex.model_copy(update={"name": self.spec.name}), setup.features.shape[1],
                self.capped_degree(self.graph) if self.aggregates else None,
            ).to(setup.device)
        self.noise_std = 0.0
        self.sensitivity = 0.0
        # the next release's sample, drawn ahead by ``prefetch``: (its roots, its sample)
        self._prefetched: tuple[torch.Tensor, _Sample] | None = None

    def capped_degree(self, graph: Graph) -> torch.Tensor:
        """d̂ = min(degree, D) of the graph a release reads (GCN's coefficients)."""
        return graph.degree.clamp(max=self.fanout) if self.fanout else graph.degree

    # -- what it costs ----------------------------------------------------------------------
    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        """Each kind's charge as a function of z, and the sensitivity θ = z · S refers to.

        visible-batch: both kinds are charged the extractor's rule (docs/privacy.md,
        section 4). hidden-batch: training steps are PoissonSampled(γ, Gaussian(θ/S_step))
        with γ of [VESPER, Thm. 2.1], every step counted; the evaluation sweep has no
        sampling to hide behind and is charged as under visible-batch.
        """
        cfg, ex = self.setup.config, self.setup.config.extractor
        if not self.aggregates:
            rules = [PlanRule(kind=k, participation_bound=0, mechanism="no-op") for k in ("train", "eval")]
            return ChargePlan(rules, 0.0, participation_bound=0, details={"sensitivity_form": "none"})
        rule = charge_rule(self.spec.name, ex.layers, self.fanout, ex.d_min, ex.degree_bound)
        details = {"sensitivity_form": rule.form, "derivation": rule.derivation}
        q = cfg.privacy.edge_sample_rate
        if q is not None:
            # releases with independent coins: the per-step form (docs/privacy.md, 5.2, eq. L2)
            details.update({"sensitivity_form": "per-step", "edge_sample_rate": q})
            rules = [
                PlanRule(kind=kind, participation_bound=rule.edge_reach, sampling_probability=q)
                for kind in ("train", "eval")
            ]
            self.sensitivity = rule.step_sensitivity
            return ChargePlan(rules, rule.step_sensitivity, participation_bound=rule.edge_reach, details=details)
        if cfg.privacy.accounting == "visible-batch":
            rules = [PlanRule(kind=kind, participation_bound=rule.participation_bound) for kind in ("train", "eval")]
            self.sensitivity = rule.sensitivity
            return ChargePlan(rules, rule.sensitivity, participation_bound=rule.participation_bound, details=details)
        degree = ex.degree_bound or ex.fanout
        train_nodes = roots.train_ids.numel()
        gamma = theorem21_gamma(train_nodes, min(cfg.batch_size, train_nodes), degree, ex.layers)
        details.update({
            "gamma": gamma, "gamma_degree": degree, "step_sensitivity": rule.step_sensitivity,
            "sensitivity_form": "per-step", "eval_sensitivity_form": rule.form,
        })
        rules = [
            PlanRule(kind="train", participation_bound=None, sampling_probability=gamma),
            PlanRule(
                kind="eval", participation_bound=rule.participation_bound,
                noise_scale=rule.step_sensitivity / rule.sensitivity,
            ),
        ]
        self.sensitivity = rule.step_sensitivity
        return ChargePlan(rules, rule.step_sensitivity, participation_bound=rule.participation_bound, details=details)

    def bind(self, noise_multiplier: float | None) -> None:
        super().bind(noise_multiplier)
        self.noise_std = 0.0 if noise_multiplier is None else noise_multiplier * self.sensitivity

    # -- what it releases -------------------------------------------------------------------
    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        """PMP over the roots' subgraphs [VESPER, Alg. 1]: the pre-charge B x d x L."""
        sample = self._take_prefetched(roots) or self._sample(roots)
        return self.model(
            sample.subgraph, self.setup.features, self.noise_std, self.setup.noise, sample.capped_degree,
            sample.messages, sample.dropout_key, sample.inputs,
        )

    def _sample(self, roots: torch.Tensor) -> _Sample:
        """The release's reads of the graph: all its draws from A's secret sampling generator
        (its dropout key first, then its edge sample and layer seeds), the sampled blocks'
        messages ready for the aggregation (graph structure only), the input nodes'
        features and dropout mask (no parameter), and the N(0, 1) draws of the release's
        streamed noise, in the order the release would draw them (pmp.ReleaseInputs)."""
        layers = self.setup.config.extractor.layers
        key = self.dropout_key()
        sampler, capped_degree = self.sampler, None
        if self.edge_rate and sampler is not None:
            # this release reads a fresh secret Poisson sample of the edges (party_a.edge_sampling),
            # in the sampler's keyed order of the neighbour lists, so its sampler needs no new sort
            edges = self._edges_read_by(sampler)
            keep = edges.coins(self.setup.sampling_generator)
            graph = edges.subgraph(keep)
            sampler = sampler.restricted(keep, graph) if self.fanout else NeighbourSampler(graph, 0, layers)
            capped_degree = self.capped_degree(graph)
        if sampler is None:  # the MLP: no block, no message, no noise (release_inputs draws none for it)
            subgraph, messages = edgeless_subgraph(roots, layers), None
        else:
            subgraph = sampler.sample(roots, sampler.layer_seeds(self.setup.sampling_generator))
            messages = self.model.messages(subgraph, capped_degree)
        inputs = self.model.release_inputs(subgraph, self.setup.features, key, self.noise_std, self.setup.noise)
        return _Sample(subgraph, capped_degree, messages, key, inputs)

    def _edges_read_by(self, sampler: NeighbourSampler) -> EdgeSubsampler:
        """The edge sample's coins over the slots the sampler reads (its keyed order; A's CSR for fanout 0)."""
        if self._edge_subsampler is None:
            slots = self.graph if not self.fanout else Graph(sampler.order.indptr, sampler.order.neighbours, self.graph.num_nodes)
            self._edge_subsampler = EdgeSubsampler(slots, self.edge_rate)
        return self._edge_subsampler

    # -- pipelining (party_a.run.step_loop): sampling reads no parameter -----------------------------
    def prefetch(self, roots: torch.Tensor) -> None:
        """Sample now what the next ``release(roots, ...)`` would sample, so that the trainer
        samples step t+1 while B computes step t. Exact: the sample depends only on the roots
        and A's sampling generator, which is consumed in the same order as without prefetching
        (the next release must be of exactly these roots, else RuntimeError). The input
        nodes' features and dropout masks read no parameter either, so they are built here too,
        and so is the release's streamed noise: drawn after step t's release and before step
        t+1's, as the release itself would draw it (nothing else draws from A's noise generator
        in between; no prefetch follows a checkpointed step)."""
        if self._prefetched is not None:
            raise RuntimeError("a prefetched sample is still unused: prefetching again would reorder the sampling")
        roots = roots.to(self.setup.device)
        self._prefetched = (roots, self._sample(roots))

    def _take_prefetched(self, roots: torch.Tensor) -> _Sample | None:
        if self._prefetched is None:
            return None
        expected, sampled = self._prefetched
        self._prefetched = None
        if expected is not roots and not torch.equal(expected, roots.to(expected.device)):
            raise RuntimeError("the release's roots differ from the prefetched ones: the sampling order would change")
        return sampled


# PMP, VFGNN, DPAR and the MLP train with the run's defaults (no run_defaults): fewer epochs over
# whole neighbourhoods give PMP more signal per release (`vesper bench snr`) but leave its encoder
# under-trained: on Cora at ε = 4, 10 epochs at fanout 0 scored 0.39-0.57.
class MlpPlugin(PmpPlugin):
    """The feature-only model, run alone (the baseline) or as an extractor's edge-free path
    (party_a.extractors.edge_free_path). Its dropout keys come from a stream of their own:
    release r's key is ``counter_key(s, r)`` with s = ``setup.edge_free_key`` (a secret of A's,
    party_a.run.secrets), so the path draws exactly the keys the MLP run alone would draw,
    whatever the extractor beside it draws from the sampling generator (common random
    numbers: where B keeps the path's head, the run scores as the MLP does, docs/utility.md,
    section 7). s and r are buffers: checkpointed with the parameters, and handed to party A's
    workers with the state dict. Without ``edge_free_key`` (a run recorded before it existed)
    the keys are drawn from the sampling generator, as then."""

    spec: ClassVar[ExtractorSpec] = ExtractorSpec(
        name="mlp", privacy_unit="edge", cost_model="none",
        summary="encoder and L edge-free layers; reads no edges, so spends nothing (the baseline)",
        uses=_SHARED, accountings=("visible-batch", "hidden-batch"), docs="docs/extractors/pmp.md",
    )

    def __init__(self, setup: ExtractorSetup) -> None:
        super().__init__(setup)
        self.own_stream = setup.edge_free_key is not None
        if self.own_stream:
            self.register_buffer("stream_key", torch.tensor(setup.edge_free_key, dtype=torch.int64))
            self.register_buffer("stream_position", torch.zeros((), dtype=torch.int64))

    def dropout_key(self) -> DropoutKey:
        """k_r = counter_key(s, r) of the r-th release (r counted from 0 over the run), or, without
        the stream, a key drawn from the sampling generator."""
        if not self.own_stream:
            return super().dropout_key()
        release = int(self.stream_position)
        self.stream_position += 1
        first, second = self.stream_key.tolist()
        return counter_key((first, second), release)


class PmpGinPlugin(PmpPlugin):
    spec: ClassVar[ExtractorSpec] = ExtractorSpec(
        name="pmp-gin", privacy_unit="edge", cost_model="per-step",
        summary="VESPER perturbed message passing, GIN sum aggregation; noise on every step's aggregates",
        uses=_SHARED + _GRAPH, accountings=("visible-batch", "hidden-batch"), edge_sampling=True,
        docs="docs/extractors/pmp.md",
    )


class PmpGcnPlugin(PmpPlugin):
    spec: ClassVar[ExtractorSpec] = ExtractorSpec(
        name="pmp-gcn", privacy_unit="edge", cost_model="per-step",
        summary="VESPER perturbed message passing, truncated GCN (D_min); noise on every step's aggregates",
        uses=_SHARED + _GRAPH + ("d_min",), accountings=("visible-batch", "hidden-batch"), edge_sampling=True,
        docs="docs/extractors/pmp.md",
    )
