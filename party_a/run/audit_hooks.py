"""What an audit adds to party A's run, plugged in at named points instead of woven through it.

A run carries the hooks its ``audit`` settings and ``record_gradients`` ask for:

    CanaryHook     the one-run canary audit [SNJ23, Alg. 1]: coins at start, canaries planted
                   once B has named its split (party_a.canaries), per-release white-box
                   statistics of their endpoints (party_a.canary_statistics)
    TftsHook       the membership audit's train-from-the-subgraph (TFTS, [VESPER, App. C.7]):
                   training reads the subgraph of B's training nodes, evaluation the whole
                   graph and the members too (party_a.membership_audit)
    GradientHook   B's gradients of the first and last epoch (party_a.gradient_record), for
                   the label-leakage measurement

Nothing a hook does is sent or charged: the releases, their noise and their charges are the
same with or without it (a canary is an edge like any other). The auditor reads what the
hooks write (auditor/).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from vesper.common.config import PartyAConfig, RunConfig
from vesper.party_a.canaries import CanaryDraw, canary_generator, draw_canaries, draw_coins, plant
from vesper.party_a.canary_statistics import STATISTICS_FILE, CanaryStatistics, observe_releases, unsupported_reason
from vesper.party_a.extractors.base import Extractor, RootPlan
from vesper.party_a.gradient_record import GradientRecord
from vesper.party_a.graph_store import Graph, induced_subgraph
from vesper.party_a.membership_audit import check_tfts, tfts_chunk
from vesper.party_a.run.graph_data import GraphData
from vesper.party_a.run.progress import ProgressEvent, Report

Parts = list[tuple[str, torch.Tensor]]


class RunHook:
    """One audit's part in a run; every method is a no-op unless the audit needs it."""

    def check(self, extractor: Extractor) -> None:
        """Refuse, before anything is charged, an extractor the audit cannot follow (ValueError)."""

    def on_roots(self, roots: RootPlan, data: GraphData, num_classes: int) -> GraphData:
        """B has named its split; the graph the run reads from now on (canaries are planted here)."""
        return data

    def training_graph(self, data: GraphData, roots: RootPlan) -> Graph | None:
        """A graph for training other than the run's (None: the run's)."""
        return None

    def on_bound(self, extractor: Extractor, evaluator: Extractor) -> None:
        """The extractors have their noise; the run is about to release."""

    def on_step(self, epoch: int, roots: torch.Tensor, gradient: torch.Tensor) -> None:
        """B's gradient of one main-pass training step."""

    def evaluation_parts(self, roots: RootPlan, parts: Parts) -> Parts:
        """What the evaluation pass releases, split by split."""
        return parts

    def on_finish(self, run_dir: Path) -> None:
        """The run completed: write what the auditor will read."""


class CanaryHook(RunHook):
    """Worst-case canaries (party_a.canaries) and their per-release statistics."""

    def __init__(self, config: RunConfig, settings: PartyAConfig, report: Report, run_dir: Callable[[], Path]) -> None:
        self.config = config
        self.report = report
        self.run_dir = run_dir
        # the coins now (A's secret generator of their own), the pairs once B has named its split
        self.coins = draw_coins(config.audit.canaries, canary_generator(settings.secret_seed, config.seed))
        self.draw: CanaryDraw | None = None
        self.statistics: CanaryStatistics | None = None
        self.num_nodes = 0

    def on_roots(self, roots: RootPlan, data: GraphData, num_classes: int) -> GraphData:
        """Pairs of low-degree training roots, planted into a new GraphData (the service's
        cached one is shared by every run); the draw is A's secret until the audit."""
        self.draw = draw_canaries(
            data.graph, self.coins, self.config.audit.canary_seed, roots.train_ids.cpu().numpy(),
            self.config.extractor.fanout,
        )
        if self.draw.m < self.coins.size:
            self.report(ProgressEvent("setup", message=(
                f"audit.canaries: only {self.draw.m} of {self.coins.size} canary pairs fit among "
                "B's low-degree training roots"
            )))
        planted = dataclasses.replace(data, graph=plant(data.graph, self.draw))
        self.num_nodes = planted.graph.num_nodes
        self.draw.save(self.run_dir() / "canaries.npz")
        return planted

    def on_bound(self, extractor: Extractor, evaluator: Extractor) -> None:
        """Per-release white-box statistics of the canary endpoints, for the extractors they cover."""
        reason = unsupported_reason(extractor)
        if reason:
            self.report(ProgressEvent("setup", message=f"no per-release canary statistics: {reason}"))
            return
        ex = self.config.extractor
        self.statistics = CanaryStatistics(self.draw, self.num_nodes, ex.dim, ex.layers)
        for each in dict.fromkeys((extractor, evaluator)):  # the evaluator may be the extractor itself
            observe_releases(each, self.statistics)

    def on_finish(self, run_dir: Path) -> None:
        if self.statistics is not None:
            self.statistics.save(run_dir / STATISTICS_FILE)


class TftsHook(RunHook):
    """TFTS: train on the subgraph induced by B's training nodes, evaluate on the whole graph."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config

    def check(self, extractor: Extractor) -> None:
        check_tfts(self.config, extractor)

    def training_graph(self, data: GraphData, roots: RootPlan) -> Graph | None:
        return induced_subgraph(data.graph, roots.train_ids)

    def evaluation_parts(self, roots: RootPlan, parts: Parts) -> Parts:
        # the members come back too, so B can query the model on them
        size = tfts_chunk(roots, self.config.eval_chunk)
        return [("train", ids) for ids in roots.train_ids.split(size)] + parts


class GradientHook(RunHook):
    """``record_gradients``: what a curious party A keeps of B's gradients (gradients.npz)."""

    def __init__(self, config: RunConfig) -> None:
        self.epochs = config.epochs
        self.record: GradientRecord | None = None

    def on_roots(self, roots: RootPlan, data: GraphData, num_classes: int) -> GraphData:
        self.record = GradientRecord(self.epochs, num_classes)
        return data

    def on_step(self, epoch: int, roots: torch.Tensor, gradient: torch.Tensor) -> None:
        self.record.add(epoch, roots, gradient)

    def on_finish(self, run_dir: Path) -> None:
        self.record.save(run_dir / "gradients.npz")


class RunHooks(RunHook):
    """The run's hooks, called in order."""

    def __init__(self, hooks: list[RunHook]) -> None:
        self.hooks = hooks

    @classmethod
    def for_run(cls, config: RunConfig, settings: PartyAConfig, report: Report, run_dir: Callable[[], Path]) -> RunHooks:
        hooks: list[RunHook] = []
        if config.audit.membership:
            hooks.append(TftsHook(config))
        if config.audit.canaries:
            hooks.append(CanaryHook(config, settings, report, run_dir))
        if config.record_gradients:
            hooks.append(GradientHook(config))
        return cls(hooks)

    @property
    def observes_steps(self) -> bool:
        return any(type(h).on_step is not RunHook.on_step for h in self.hooks)

    def check(self, extractor: Extractor) -> None:
        for hook in self.hooks:
            hook.check(extractor)

    def on_roots(self, roots: RootPlan, data: GraphData, num_classes: int) -> GraphData:
        for hook in self.hooks:
            data = hook.on_roots(roots, data, num_classes)
        return data

    def training_graph(self, data: GraphData, roots: RootPlan) -> Graph | None:
        graphs = [g for g in (hook.training_graph(data, roots) for hook in self.hooks) if g is not None]
        if len(graphs) > 1:
            raise ValueError("two audits each ask for a training graph of their own")
        return graphs[0] if graphs else None

    def on_bound(self, extractor: Extractor, evaluator: Extractor) -> None:
        for hook in self.hooks:
            hook.on_bound(extractor, evaluator)

    def on_step(self, epoch: int, roots: torch.Tensor, gradient: torch.Tensor) -> None:
        for hook in self.hooks:
            hook.on_step(epoch, roots, gradient)

    def evaluation_parts(self, roots: RootPlan, parts: Parts) -> Parts:
        for hook in self.hooks:
            parts = hook.evaluation_parts(roots, parts)
        return parts

    def on_finish(self, run_dir: Path) -> None:
        for hook in self.hooks:
            hook.on_finish(run_dir)

