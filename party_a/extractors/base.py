"""The extractor plugin interface: everything party A's trainer needs from a method.

An extractor turns A's graph and features into the B x d x L' tensors A sends to B,
and says, as data, what each release costs. The trainer owns everything else: the
split, calibration of the noise multiplier z, write-ahead charging, the gRPC streams,
checkpoints and summaries. A run goes through an extractor in this order::

    ex = Extractor(setup)              # graph, features, config, A's secret generators
    ex.output_layers                   # L' of every release (B builds its decoder for it)
    plan = ex.charge_plan(roots)       # DpEvent of each kind of release, as PlanRules of z
    ex.bind(z)                         # the calibrated z (None: no noise is ever added)
    ex.prepare(session)                # optional stages before training: private
                                       # pre-training inside A, edge-free training with B,
                                       # one-shot releases (all charged through the session
                                       # before any use)
    ex.root_batches(train_ids, ...)    # per epoch: the roots of each step (default: a
                                       # shuffled split into batches)
    ex.release(roots, "train")         # per step; the trainer charges, then sends
    ex.release(roots, "eval")          # per evaluation chunk; likewise

Kinds of release (ledger rows, one PlanRule each):

* ``train`` / ``eval``: what the trainer sends per step or evaluation chunk. A
  per-step method (PMP, VFGNN) pays here; a one-shot method sends rows of data it has
  already paid for, so its rule is ``mechanism="no-op"`` (post-processing).
* ``one-shot``: releases made once before training (GAP's K noisy hops, DPAR's private
  top-K neighbourhoods), charged through :meth:`PrepareSession.charge_one_shot`
  before the released data is used for anything that reaches B.
* ``pre-train``: private training steps inside A whose noisy outputs never leave A
  (relational pre-training's DP-SGD chunks), charged through
  :meth:`PrepareSession.charge_pre_train` before each chunk runs. Since B never sees
  them, their sampling may be credited (Poisson-sampled events).

A method is registered under the entry-point group ``vesper.extractors``; the entry
point names a class implementing :class:`Extractor` (usually a subclass of
:class:`ExtractorBase`). See docs/extractors/README.md for how to write one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, get_args, runtime_checkable

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from vesper.common.config import RunConfig
from vesper.common.privacy.ledger import PlannedPass, PlanRule
from vesper.common.privacy.names import AccountantName
from vesper.party_a.graph_store import Graph
from vesper.party_a.keyed_dropout import DropoutKey, draw_dropout_key
from vesper.party_a.noise import NoiseSource

PrivacyUnit = Literal["edge", "node"]
CostModel = Literal["none", "per-step", "one-shot", "one-shot + per-step"]
ReleaseKind = Literal["train", "eval"]


class NoParams(BaseModel):
    """An extractor without method-specific hyper-parameters."""

    model_config = ConfigDict(extra="forbid")


class ExtractorSpec(BaseModel):
    """What ``vesper extractors`` lists, and what A checks a run's config against."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str
    privacy_unit: PrivacyUnit
    cost_model: CostModel
    summary: str
    params: type[BaseModel] = NoParams  # extractor.params, validated by this model
    uses: tuple[str, ...] = ()  # which shared extractor.* fields it reads (layers, dim, fanout, ...)
    accountings: tuple[str, ...] = ("visible-batch",)
    accountants: tuple[str, ...] = get_args(AccountantName)  # privacy.accountant values its DpEvents support
    relation: str = ""  # the neighbouring relation in words, recorded with every run (default by unit)
    edge_sampling: bool = False  # whether privacy.edge_sample_rate is supported
    docs: str = ""  # path of its docs page, relative to the repository
    no_prediction: str = ""  # why `vesper predict` cannot serve its runs ("" = it can)
    # the run settings this method trains best with, as dotted RunConfig keys (``epochs``,
    # ``extractor.layers``, ...): applied by party A to every run that does not set them itself
    # (registry.with_run_defaults), and used by the benchmarks; docs/extractors/<name>.md measures them
    run_defaults: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class RootPlan:
    """The roots B allows, and how many releases of each pass the run will make.

    Under label privacy ``pate`` (docs/label-privacy.md) ``train_ids`` are B's query
    nodes (the student's roots are the answered ones, at most these), and A first
    releases its frozen embeddings of ``teacher_ids`` (B's labelled nodes) and of the
    queries for B's teachers, in the evaluation pass: ``eval_chunks`` counts them.
    """

    train_ids: torch.Tensor
    val_ids: torch.Tensor
    test_ids: torch.Tensor
    steps_per_epoch: int
    eval_chunks: int
    teacher_ids: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    predict_chunks: int = 0  # chunks of one prediction pass: every node B may name, each once


@dataclass(frozen=True)
class Stage:
    """Edge-free training with B before the main training (e.g. GAP's encoder).

    Its releases are sent in a separate B session of ``layers`` slices and charged as
    ``train`` releases (so the train rule must be no-op for an extractor with stages).
    """

    name: str
    epochs: int
    layers: int
    # the run goes on training what this stage trained (the edge-free path's stage): B starts the
    # run's edge-free head from the stage's decoder, and A's optimiser from the stage's state
    continues: bool = False


@dataclass(frozen=True)
class ChargePlan:
    """What each kind of release costs, as a function of the run's z."""

    rules: list[PlanRule]  # one per kind: train and eval always, one-shot and pre-train if any
    sensitivity: float  # the S that reported θ = z · S refers to (0 when nothing is noised)
    one_shot_releases: int = 0  # releases of the single one-shot pass
    pre_train_releases: int = 0  # releases of the single pre-train pass (before the one-shot pass)
    stages: tuple[Stage, ...] = ()
    participation_bound: int | None = None  # N_e of the train rule, for the summary
    details: dict[str, Any] = field(default_factory=dict)  # recorded with the run
    prediction_passes: int = 0  # reserved "predict" passes (the run adds their rule: party_a.run.release)

    def passes(self, epochs: int, roots: RootPlan) -> list[PlannedPass]:
        """Every pass the run will make, in order: what calibration must cover."""
        passes: list[PlannedPass] = []
        if self.pre_train_releases:
            passes.append(PlannedPass(kind="pre-train", releases=self.pre_train_releases))
        if self.one_shot_releases:
            passes.append(PlannedPass(kind="one-shot", releases=self.one_shot_releases))
        for stage in self.stages:
            passes += [PlannedPass(kind="train", releases=roots.steps_per_epoch)] * stage.epochs
        passes += [PlannedPass(kind="train", releases=roots.steps_per_epoch)] * epochs
        passes.append(PlannedPass(kind="eval", releases=roots.eval_chunks))
        passes += [PlannedPass(kind="predict", releases=roots.predict_chunks)] * self.prediction_passes
        return passes


@dataclass(frozen=True)
class ExtractorSetup:
    """What party A hands an extractor when a run starts."""

    config: RunConfig
    params: BaseModel  # config.extractor.params validated by the spec's model
    graph: Graph  # A's whole graph, on ``device``
    features: torch.Tensor  # [N, F] on ``device``
    device: torch.device
    sampling_generator: torch.Generator  # CPU; secret from B
    noise_generator: torch.Generator  # on ``device``; secret from B
    delta: float
    # every mechanism's noise is drawn through it (party_a.noise); default: from noise_generator
    noise: NoiseSource | None = None
    # per-node noise keyed by (release, layer, node) instead of streamed: what party A's workers
    # need (party_a.workers, docs/privacy.md 2.6); the default noise source's setting
    keyed_noise: bool = False
    # the secret s of the edge-free layers' own dropout-key stream (pmp_plugin.MlpPlugin;
    # party_a.run.secrets); None: their keys are drawn from the sampling generator (runs recorded
    # before the stream existed, and set-ups built by hand)
    edge_free_key: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.noise is None:
            object.__setattr__(self, "noise", NoiseSource(self.noise_generator, keyed=self.keyed_noise))


class PrepareSession(Protocol):
    """What :meth:`Extractor.prepare` may do; provided by the trainer."""

    roots: RootPlan

    def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
        """Write-ahead charge of one-shot release ``index`` (0-based) about ``node_ids``.

        Raises the trainer's BudgetRefused when the budget cannot cover it; the
        extractor must then not use what it computed.
        """

    def charge_pre_train(self, index: int, node_ids: torch.Tensor) -> None:
        """Write-ahead charge of pre-train release ``index`` (0-based), before it runs.

        Raises the trainer's BudgetRefused when the budget cannot cover it.
        """

    def train_stage(
        self,
        stage: Stage,
        release: Callable[[torch.Tensor], torch.Tensor],
        parameters: Iterable[nn.Parameter],
    ) -> None:
        """Train ``parameters`` with B for ``stage.epochs`` epochs over the train roots.

        ``release(roots)`` must return B x d x stage.layers with gradient and read no
        edges; every release is charged (train kind) before it is sent.
        """

    def progress(self, message: str) -> None:
        """A line for the coordinator's progress display."""


@runtime_checkable
class Extractor(Protocol):
    spec: ClassVar[ExtractorSpec]

    def __init__(self, setup: ExtractorSetup) -> None: ...

    @property
    def output_layers(self) -> int:
        """L' of every train/eval release, which is B x d x L'."""

    def charge_plan(self, roots: RootPlan) -> ChargePlan: ...

    def bind(self, noise_multiplier: float | None) -> None:
        """Fix z for the whole run (None: ε = ∞ or nothing to noise)."""

    def prepare(self, session: PrepareSession) -> None: ...

    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        """B x d x L' for ``roots`` (on A's device). With gradient iff trainable."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What B's gradients update (empty: nothing; B's gradient is then discarded)."""

    def root_batches(self, train_ids: torch.Tensor, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
        """The roots of each training step of one epoch (empty batches are skipped).

        Overriding the default requires ``participation_bound=None`` on the train rule:
        the ledger's per-pass counting assumes each root at most once per epoch.
        """

    def train(self, mode: bool = True) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def serving_state(self) -> dict[str, Any]:
        """What a prediction pass needs beyond ``state_dict``: the run's already-charged one-shot
        releases, which it serves again as post-processing (saved with the finished run)."""

    def load_serving_state(self, state: dict[str, Any]) -> None: ...


class ExtractorBase(nn.Module):
    """Defaults for the optional parts of :class:`Extractor`.

    Subclasses set ``spec`` and implement ``charge_plan`` and ``release``; they are
    nn.Modules, so parameters, train/eval mode and state_dict come for free.
    """

    spec: ClassVar[ExtractorSpec]
    # attributes that hold the run's charged one-shot releases (serving_state saves them)
    SERVED: ClassVar[tuple[str, ...]] = ()

    def __init__(self, setup: ExtractorSetup) -> None:
        super().__init__()
        self.setup = setup
        self.noise_multiplier: float | None = None

    def serving_state(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.SERVED}

    def load_serving_state(self, state: dict[str, Any]) -> None:
        missing = [name for name in self.SERVED if name not in state]
        if missing:
            raise ValueError(f"{self.spec.name}: the saved run lacks {', '.join(missing)}: it cannot be served")
        for name in self.SERVED:
            setattr(self, name, state[name])

    @property
    def output_layers(self) -> int:
        return self.setup.config.extractor.layers

    def charge_plan(self, roots: RootPlan) -> ChargePlan:
        raise NotImplementedError

    def bind(self, noise_multiplier: float | None) -> None:
        self.noise_multiplier = noise_multiplier

    def prepare(self, session: PrepareSession) -> None:
        return None

    def release(self, roots: torch.Tensor, kind: ReleaseKind) -> torch.Tensor:
        raise NotImplementedError

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def root_batches(self, train_ids: torch.Tensor, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
        return shuffled_batches(train_ids, batch_size, generator)

    def perturb(self, values: torch.Tensor, std: float, rows: torch.Tensor | None = None) -> torch.Tensor:
        """values + N(0, std² I) from A's secret noise (party_a.noise); ``rows``: the node id of
        each row of ``values``, if its rows are about nodes."""
        return self.setup.noise.gaussian(values, std, rows=rows)

    def dropout_key(self) -> DropoutKey:
        """A fresh secret key for the dropout masks of one release (party_a.keyed_dropout)."""
        return draw_dropout_key(self.setup.sampling_generator)


def shuffled_batches(train_ids: torch.Tensor, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Every train root once per epoch, in a random order, ``batch_size`` at a time."""
    order = train_ids[torch.randperm(train_ids.numel(), generator=generator)]
    return list(order.split(batch_size))


def overrides_root_batches(extractor: object) -> bool:
    """Whether an extractor chooses its own roots (its train rule must count every release)."""
    method = getattr(type(extractor), "root_batches", None)
    return method is not None and method is not ExtractorBase.root_batches


def default_relation(unit: str) -> str:
    return {
        "edge": "edge-level: the neighbouring graph adds or removes one edge",
        "node": "node-level: the neighbouring graph removes one node's features and all its edges",
    }.get(unit, unit)


def post_processing_rules(kinds: Iterable[str] = ("train", "eval")) -> list[PlanRule]:
    """Rules for kinds whose releases are post-processing of what was already charged."""
    return [PlanRule(kind=kind, participation_bound=None, mechanism="no-op") for kind in kinds]
