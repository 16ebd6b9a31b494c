"""The edge-free path: every edge-level extractor's release also carries the MLP's layers.

A graph extractor can lose to the feature-only model: its noisy aggregates may carry less
about the labels than they cost in overfitting, or the graph may not help at all (Twitch
ENGB: a non-private GCN barely beats the MLP). So that a user who picks a graph extractor
never gets a worse model than not using the graph, the trainer appends to each of its
releases the release of the ``mlp`` extractor built from the same run config::

    release(roots) = [ extractor's B x d x L'  |  MLP's B x d_f x L_f as B x d x (L_f · d_f / d) ]   (slices along the last axis)

The MLP reads no edge, so the appended slices cost nothing under edge-level DP and are
trained end to end with B every step (A's optimiser updates both parts from B's gradient).
Party B builds three heads (party_b.decoders.FallbackDecoder): one over the extractor's
slices, one over the last ``L_f`` alone (exactly the MLP baseline's decoder) and one over all,
trains them together and keeps the edge-free head unless another leads it on B's validation
nodes by more than the paired noise there (party_b.head_choice).

An extractor released once (one-shot) stops its run early to spare its fixed noise (GAP: 20
epochs), which would leave the path an MLP trained 20 epochs where the baseline trains 50:
0.722 against 0.745 on Cora at ε = 4 (docs/utility.md, section 7). So for such an extractor
the path first trains alone with B, in an edge-free stage of its own (``edge-free-path``),
for E_pre = E_mlp − E epochs (``extractor.edge_free_path_epochs`` sets another number), and the
run's E epochs then train it on: E_mlp in all, the baseline's. The run continues the stage at both
parties (``Stage.continues``): B's edge-free head starts from the stage's decoder, optimiser
state and dropout stream, A's optimiser from the stage's state, and the run's order of the
roots from where the stage left it, so that stage and run are one pass of E_mlp epochs.

**The path is the MLP run (common random numbers).** Its settings are the ``mlp`` run's of the
same explicit settings: where the extractor's own defaults narrowed the run (GAP's d = 16,
progap's L = 2), the run records the baseline's for the path (``extractor.edge_free_path_dim``
and ``_layers``, registry.with_run_defaults), and a path of width k · d goes out as k slices of d
per layer (:meth:`WithEdgeFreePath.free_release`). Its dropout keys are its own stream
(pmp_plugin.MlpPlugin), so it draws the MLP run's whatever the extractor draws. Built under
the run's seed as the MLP run's model and B's decoder are, it then computes, step for step,
what the MLP run of the same seed and secrets computes: where B keeps its head, the run scores
exactly what the MLP run scores (tests/test_common_random_numbers.py).

The charge plan is the extractor's own: the appended part is a function of A's features,
A's parameters (updated only from B's gradients of charged releases) and dropout masks keyed
like every other (docs/privacy.md, section 2.5). The whole-release test runs every registered
extractor through :func:`build_extractor`, with its path.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from vesper.common.config import RunConfig
from vesper.party_a.extractors.base import (
    ChargePlan,
    CostModel,
    Extractor,
    ExtractorSetup,
    PrepareSession,
    ReleaseKind,
    RootPlan,
    Stage,
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
    return carries_path(cls, setup.config)


def carries_path(cls: type[Extractor], config: RunConfig) -> bool:
    """:func:`wants_path` for a run's config (registry.path_as_baseline asks before the set-up)."""
    spec = cls.spec
    return (
        config.extractor.edge_free_path and not config.audit.canaries
        and spec.privacy_unit == "edge" and spec.cost_model != "none"
        and issubclass(cls, nn.Module)  # the wrapper holds it as a submodule (a plugin need not be one)
    )


PATH_STAGE = "edge-free-path"


def baseline_epochs() -> int:
    """E_mlp: the epochs the MLP baseline trains with its defaults (its run_defaults, else the run's)."""
    return int(MlpPlugin.spec.run_defaults.get("epochs", RunConfig.model_fields["epochs"].default))


def path_stage_epochs(cost_model: CostModel, config: RunConfig) -> int:
    """E_pre, the epochs of the path's own edge-free stage, for an extractor of ``cost_model``.

    Only an extractor released once has one: its training releases are free (no-op), as a
    stage's must be, while a per-step extractor's path trains with its charged steps. Set:
    ``extractor.edge_free_path_epochs``; else E_mlp − E (none when the run trains as long, or
    under PATE, whose A trains nothing with B's labels before the answered queries).
    """
    if cost_model != "one-shot":
        return 0
    if config.extractor.edge_free_path_epochs is not None:
        return config.extractor.edge_free_path_epochs
    if config.label_privacy.mode == "pate":
        return 0
    return max(0, baseline_epochs() - config.epochs)


def build_extractor(cls: type[Extractor], setup: ExtractorSetup) -> Extractor:
    """The run's extractor: ``cls(setup)``, with the edge-free path where :func:`wants_path` says so.

    The extractor is built first: it draws its own secrets from A's generators in the same order
    as without the path; the MLP's construction draws none (it samples nothing).
    """
    if not wants_path(cls, setup):
        return cls(setup)  # no path (the MLP itself, a node-level extractor): no stage of it either
    stage_epochs = setup.config.extractor.edge_free_path_epochs
    if stage_epochs and cls.spec.cost_model != "one-shot":
        raise ValueError(
            f"extractor.edge_free_path_epochs = {stage_epochs}: only an extractor released once (one-shot) trains "
            f"its edge-free path in a stage of its own; {cls.spec.name}'s path trains with its charged steps. "
            "Leave it unset"
        )
    return WithEdgeFreePath(cls(setup), MlpPlugin(path_setup(setup)))


def path_setup(setup: ExtractorSetup) -> ExtractorSetup:
    """The run's set-up with the path's own layers and width (``extractor.edge_free_path_layers``
    and ``_dim``, recorded where the extractor's defaults changed the run's: the MLP baseline's)."""
    ex = setup.config.extractor
    layers, dim = ex.edge_free_path_layers or ex.layers, ex.edge_free_path_dim or ex.dim
    if dim % ex.dim:
        raise ValueError(
            f"extractor.edge_free_path_dim = {dim} is not a multiple of extractor.dim = {ex.dim}: the path's layers are "
            f"released as slices of width {ex.dim}. Set a multiple of {ex.dim}, or leave it unset"
        )
    if (layers, dim) == (ex.layers, ex.dim):
        return setup
    config = setup.config.model_copy(update={"extractor": ex.model_copy(update={"layers": layers, "dim": dim})})
    return dataclasses.replace(setup, config=config)


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
    """How many trailing slices of each release read no edge (0: no path): L_f · d_f / d."""
    return extractor.free_layers if isinstance(extractor, WithEdgeFreePath) else 0


class WithEdgeFreePath(nn.Module):
    """``inner``'s releases with ``path``'s (the MLP extractor's) appended along the layer axis.

    A path wider than the run's d (d_f = k · d: the MLP baseline's width where the extractor's
    own defaults narrowed the run's, GAP's 16 against the MLP's 64) is released as k slices of d
    per layer, in the order B's concat decoder reads a release (slice-major): its edge-free head
    then reads the very numbers, in the very order, the MLP run's decoder reads."""

    def __init__(self, inner: Extractor, path: MlpPlugin) -> None:
        super().__init__()
        self.inner = inner
        self.path = path
        self.spec = inner.spec
        self.fold = path.setup.config.extractor.dim // inner.setup.config.extractor.dim  # k
        if hasattr(inner, "prefetch"):  # pipelining (party_a.run.step_loop) only where the extractor has it
            self.prefetch = self._prefetch

    @property
    def free_layers(self) -> int:
        """The release's trailing slices that read no edge: L_f · k."""
        return self.path.output_layers * self.fold

    @property
    def output_layers(self) -> int:
        return self.inner.output_layers + self.free_layers

    def free_release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        """The path's B x d_f x L_f as B x d x (L_f · k): slice l·k + j holds units j·d … (j+1)·d − 1
        of layer l, so the release read slice after slice is the path's read layer after layer."""
        free = self.path.release(roots, kind)
        if self.fold == 1:
            return free
        batch, width, layers = free.shape
        return free.transpose(1, 2).reshape(batch, layers * self.fold, width // self.fold).transpose(1, 2)

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

    def path_stage(self) -> Stage | None:
        """The path's own edge-free stage (E_pre epochs of its L_f slices), or None."""
        epochs = path_stage_epochs(self.spec.cost_model, self.setup.config)
        return Stage(name=PATH_STAGE, epochs=epochs, layers=self.free_layers, continues=True) if epochs else None

    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        """The extractor's plan: the path reads no edge, so every rule stays as it is; its own
        stage, if any, comes after the extractor's (no-op train releases, as every stage's)."""
        plan = self.inner.charge_plan(roots)
        stage = self.path_stage()
        details = {**plan.details, "edge_free_path": {
            "layers": self.free_layers, "width": self.path.setup.config.extractor.dim,
            "charged": "nothing: the MLP's layers read no edge",
            "stage_epochs": stage.epochs if stage else 0,
        }}
        return ChargePlan(
            plan.rules, plan.sensitivity, plan.one_shot_releases, plan.pre_train_releases,
            (*plan.stages, stage) if stage else plan.stages, plan.participation_bound, details, plan.prediction_passes,
        )

    def bind(self, noise_multiplier: float | None) -> None:
        self.inner.bind(noise_multiplier)
        self.path.bind(noise_multiplier)  # its sensitivity is 0: it adds no noise whatever z is

    def prepare(self, session: PrepareSession) -> None:
        """The extractor's preparation, then the path's own stage (after: the extractor's draws
        from A's secret generators come in the same order as without the path)."""
        self.inner.prepare(session)
        stage = self.path_stage()
        if stage is None:
            return
        session.progress(
            f"training the edge-free path alone for {stage.epochs} epochs (then {self.setup.config.epochs} with "
            f"the extractor's releases)"
        )
        self.path.train()
        session.train_stage(stage, lambda roots: self.free_release(roots, "train"), self.path.trainable_parameters())

    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        """[extractor's B x d x L' | MLP's B x d x L_f]: the extractor's release first, so its draws
        from A's secret generators come in the same order as without the path."""
        graph_part = self.inner.release(roots, kind)
        free_part = self.free_release(roots, kind)
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
