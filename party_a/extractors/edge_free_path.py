"""The edge-free path: every edge-level extractor's release also carries the MLP's layers.

A graph extractor can lose to the feature-only model: its noisy aggregates may carry less
about the labels than they cost in overfitting, or the graph may not help at all (Twitch
ENGB: a non-private GCN barely beats the MLP). So that a user who picks a graph extractor
never gets a worse model than not using the graph, the trainer appends to each of its
releases the release of the ``mlp`` extractor built from the same run config::

    release(roots) = [ extractor's B x d x L'  |  MLP's B x d x L_f ]      (slices along the last axis)

The MLP reads no edge, so the appended slices cost nothing under edge-level DP and are
trained end to end with B every step (A's optimiser updates both parts from B's gradient).
Party B builds three heads (party_b.decoders.FallbackDecoder): one over the extractor's
slices, one over the last ``L_f`` alone (exactly the MLP baseline's decoder) and one over all,
trains them together and keeps the one that scores best on its validation nodes. The charge plan is the extractor's own:
the appended part is a function of A's features, A's parameters (updated only from B's
gradients of charged releases) and dropout masks keyed like every other (docs/privacy.md,
section 2.5). The whole-release test runs every registered extractor through
:func:`build_extractor`, with its path.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from vesper.common.config import RunConfig
from vesper.party_a.extractors.base import (
    ChargePlan,
    Extractor,
    ExtractorSetup,
    PrepareSession,
    ReleaseKind,
    RootPlan,
    shuffled_batches,
)
from vesper.party_a.extractors.pmp_plugin import MlpPlugin


def wants_path(cls: type[Extractor], setup: ExtractorSetup) -> bool:
    """Whether a run of ``cls`` carries the edge-free path: an edge-level extractor that reads
    edges, unless the run turned it off (``extractor.edge_free_path = false``). Node-level
    extractors protect the features too, so an un-noised feature path would not be free there.

    A canary audit (``audit.canaries``) audits the extractor's own releases: its white-box
    statistics are the extractor's mechanism outputs, slice for slice, and the path reads no
    edge (docs/privacy.md, section 2.5), so it carries nothing a canary could be found by.
    """
    spec, config = cls.spec, setup.config
    return (
        config.extractor.edge_free_path and not config.audit.canaries
        and spec.privacy_unit == "edge" and spec.cost_model != "none"
        and issubclass(cls, nn.Module)  # the wrapper holds it as a submodule (a plugin need not be one)
    )


def build_extractor(cls: type[Extractor], setup: ExtractorSetup) -> Extractor:
    """The run's extractor: ``cls(setup)``, with the edge-free path where :func:`wants_path` says so.

    The extractor is built first: it draws its own secrets from A's generators in the same order
    as without the path; the MLP's construction draws none (it samples nothing).
    """
    extractor = cls(setup)
    return WithEdgeFreePath(extractor, MlpPlugin(setup)) if wants_path(cls, setup) else extractor


def recorded_run_config(data: dict[str, Any]) -> RunConfig:
    """A run's config as its record stored it. A run recorded before the edge-free path existed
    has no ``extractor.edge_free_path`` key: it resumes and predicts with the releases it began
    with, without the path (its B session and saved decoder have that many slices)."""
    extractor = data.get("extractor")
    if isinstance(extractor, dict) and "edge_free_path" not in extractor:
        data = {**data, "extractor": {**extractor, "edge_free_path": False}}
    return RunConfig.model_validate(data)


def unwrapped(extractor: Extractor) -> Extractor:
    """The extractor itself, without its edge-free path (what the audits inspect)."""
    return extractor.inner if isinstance(extractor, WithEdgeFreePath) else extractor


def edge_free_layers(extractor: Extractor) -> int:
    """L_f: how many trailing slices of each release read no edge (0: no path)."""
    return extractor.path.output_layers if isinstance(extractor, WithEdgeFreePath) else 0


class WithEdgeFreePath(nn.Module):
    """``inner``'s releases with ``path``'s (the MLP extractor's) appended along the layer axis."""

    def __init__(self, inner: Extractor, path: MlpPlugin) -> None:
        super().__init__()
        self.inner = inner
        self.path = path
        self.spec = inner.spec
        if hasattr(inner, "prefetch"):  # pipelining (party_a.run.step_loop) only where the extractor has it
            self.prefetch = self._prefetch

    @property
    def output_layers(self) -> int:
        return self.inner.output_layers + self.path.output_layers

    @property
    def setup(self) -> ExtractorSetup:
        """The run's setup (the path shares it: the same secret generators)."""
        return self.inner.setup

    @property
    def noise_std(self) -> float:
        """The extractor's θ (the path adds no noise); set by party A's workers (party_a.workers)."""
        return self.inner.noise_std

    @noise_std.setter
    def noise_std(self, value: float) -> None:
        self.inner.noise_std = value

    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        """The extractor's plan: the path reads no edge, so every rule stays as it is."""
        plan = self.inner.charge_plan(roots)
        details = {**plan.details, "edge_free_path": {
            "layers": self.path.output_layers, "charged": "nothing: the MLP's layers read no edge",
        }}
        return ChargePlan(
            plan.rules, plan.sensitivity, plan.one_shot_releases, plan.pre_train_releases, plan.stages,
            plan.participation_bound, details, plan.prediction_passes,
        )

    def bind(self, noise_multiplier: float | None) -> None:
        self.inner.bind(noise_multiplier)
        self.path.bind(noise_multiplier)  # its sensitivity is 0: it adds no noise whatever z is

    def prepare(self, session: PrepareSession) -> None:
        self.inner.prepare(session)

    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        """[extractor's B x d x L' | MLP's B x d x L_f]: the extractor's release first, so its draws
        from A's secret generators come in the same order as without the path."""
        graph_part = self.inner.release(roots, kind)
        free_part = self.path.release(roots, kind)
        return torch.cat([graph_part.to(free_part.dtype), free_part], dim=-1)

    def _prefetch(self, roots: torch.Tensor) -> None:
        """Both parts' next samples, in release order (the path's is its dropout key alone)."""
        self.inner.prefetch(roots)
        self.path.prefetch(roots)

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [*self.inner.trainable_parameters(), *self.path.trainable_parameters()]

    def root_batches(self, train_ids: torch.Tensor, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
        return getattr(self.inner, "root_batches", shuffled_batches)(train_ids, batch_size, generator)

    def serving_state(self) -> dict[str, Any]:
        return self.inner.serving_state()

    def load_serving_state(self, state: dict[str, Any]) -> None:
        self.inner.load_serving_state(state)
