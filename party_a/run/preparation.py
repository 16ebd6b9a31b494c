"""The extractor's stages before training (``Extractor.prepare``): edge-free pre-training with
B, and one-shot releases (GAP's hops, DPAR's neighbourhoods), each charged first."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from vesper.common.optim import build_optimizer, carry_state
from vesper.party_a.extractors.base import RootPlan, Stage
from vesper.party_a.run.context import RunContext
from vesper.party_a.run.progress import ProgressEvent
from vesper.party_a.run.release import Release
from vesper.party_a.run.step_loop import StepLoop, TrainingPass
from vesper.proto.v1 import label_party_pb2 as lp_pb


class Preparation:
    """The PrepareSession an extractor's ``prepare`` gets: charging and training with B.

    ``open_session(session_id, layers)`` sets a session up with B (party_a.run.label_session)."""

    def __init__(
        self, ctx: RunContext, roots: RootPlan, release: Release,
        open_session: Callable[[str, int], lp_pb.SetupRunReply],
    ) -> None:
        self.ctx = ctx
        self.roots = roots
        self.release = release
        self.open_session = open_session
        # the optimisers of the completed stages the run continues (Stage.continues), and where the
        # last of them left the order of the roots: the run goes on from there, as one pass would
        self.continued: list[torch.optim.Optimizer] = []
        self.root_order: torch.Tensor | None = None

    def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
        self.ctx.charger.charge(node_ids, self.release, "one-shot-0", "one-shot", index)

    def charge_pre_train(self, index: int, node_ids: torch.Tensor) -> None:
        self.ctx.charger.charge(node_ids, self.release, "pre-train-0", "pre-train", index)

    def train_stage(
        self, stage: Stage, release: Callable[[torch.Tensor], torch.Tensor], parameters: Iterable[nn.Parameter]
    ) -> None:
        """An extractor's edge-free stage, trained with B in a session of its own.

        A stage the run continues (``stage.continues``) hands B's decoder to the run's edge-free
        head when it completes, and leaves its optimiser (:func:`continue_optimiser`) and its order
        of the roots for the run's: the stage's epochs and the run's are then one pass's, the MLP
        baseline's (party_a.extractors.edge_free_path).
        """
        parameters = list(parameters)
        session_id = f"{self.ctx.run_id}.{stage.name}"
        self.open_session(session_id, stage.layers)  # on resume: replayed from its start
        status, reason = "failed", "stage did not finish"
        try:
            optimizer = build_optimizer(self.ctx.config.optimizer, parameters) if parameters else None
            loop = StepLoop(self.ctx, TrainingPass(
                session_id, self.roots, self.release, release, optimizer, stage.epochs, stage.layers,
                f"{stage.name}", f"{stage.name} epoch", edge_free=True,
            ))
            loop.run()
            status, reason = "completed", "stage completed"
            if stage.continues:
                self.root_order = loop.root_order.get_state()
                if optimizer is not None:
                    self.continued.append(optimizer)
        finally:
            head_to = self.ctx.run_id if stage.continues and status == "completed" else ""
            self.ctx.label_party.finish(session_id, status, reason, edge_free_head_to=head_to)

    def progress(self, message: str) -> None:
        self.ctx.report(ProgressEvent("prepare", message=message, epsilon_spent=self.ctx.charger.epsilon_spent))


def continue_optimiser(optimizer: torch.optim.Optimizer, stages: Iterable[torch.optim.Optimizer]) -> None:
    """The run's optimiser goes on from each continued stage's state (Adam's moments and step
    count) for the parameters they share, as if the stage's epochs had been the run's first:
    without it, the edge-free path's layers would restart Adam's bias correction at the run's first step."""
    shared = [p for group in optimizer.param_groups for p in group["params"]]
    for stage in stages:
        carry_state(optimizer, stage, ((p, p) for p in shared))
