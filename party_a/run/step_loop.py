"""The training step loop: per step, the extractor releases the batch's B x d x L', A charges
it, sends it to B, receives dLoss/dH and updates what the extractor trains [VESPER, Alg. 3].

Pipelining (``party_a.pipeline``): while B computes step t, A samples step t+1's subgraph and
gathers what else of it reads no parameter (its input nodes' features and dropout masks), so the
releases are the same; once B has answered, step
t+1's charge is committed while A applies step t's gradient (``WriteAheadCharger.charge_ahead``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from vesper.common.wire import WireError, decode_tensor
from vesper.party_a.extractors.base import RootPlan, shuffled_batches
from vesper.party_a.peers import PeerError, TrainingStream
from vesper.party_a.run.charger import PendingCharge
from vesper.party_a.run.checkpoint_files import Position
from vesper.party_a.run.context import RunContext
from vesper.party_a.run.progress import ProgressEvent
from vesper.party_a.run.release import Release
from vesper.party_a.run.step_timings import _NO_TIMER, STEP_TIMINGS_FILE, StepTimings
from vesper.proto.v1 import label_party_pb2 as lp_pb

__all__ = ["STEP_TIMINGS_FILE", "_NO_TIMER", "Batches", "StepLoop", "TrainingPass"]

Batches = Callable[[torch.Tensor, int, torch.Generator], list[torch.Tensor]]


@dataclass(frozen=True)
class TrainingPass:
    """``epochs`` passes over the train roots on B's session ``session_id``, from ``start``
    (a checkpoint's position) if given; ``checkpoint`` is called (and B asked to save)
    every ``checkpoint_every`` steps and after the last.

    ``prefetch(roots)`` (pipelining): called with step t+1's roots once step t is sent, so A
    samples step t+1 while B computes step t. Sampling reads no parameter, and the secret
    sampling generator is consumed in the same order either way, so the releases are the
    same; no prefetch after a step that is checkpointed, whose checkpoint must hold the
    sampling generator as it stands after that step. ``on_step(epoch, roots, gradient)``:
    the audit hooks (party_a.run.audit_hooks). ``timings`` records where each step's time goes.
    """

    session_id: str
    roots: RootPlan
    release: Release
    make: Callable[[torch.Tensor], torch.Tensor]
    optimizer: torch.optim.Optimizer | None
    epochs: int
    layers: int
    pass_prefix: str
    label: str
    batches: Batches = shuffled_batches
    on_step: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None
    start: Position | None = None
    checkpoint: Callable[[Position], None] | None = None
    prefetch: Callable[[torch.Tensor], None] | None = None
    timings: StepTimings | None = None
    edge_free: bool = False  # an extractor's edge-free stage: its releases read no edge
    # back-propagates B's gradient through the release (party_a.workers: over every worker); None: in place
    backward: Callable[[torch.Tensor, torch.Tensor], None] | None = None
    # the root-order generator's state to begin from (a stage the pass continues, Stage.continues);
    # None: seeded with the run's seed. A ``start`` overrides it
    root_order: torch.Tensor | None = None


@dataclass(frozen=True)
class PlannedStep:
    """One training step's place: its epoch, its roots and where they stand in the epoch."""

    epoch: int
    position: int  # index into ``epoch_batches``
    batch: torch.Tensor
    epoch_batches: list[torch.Tensor]
    drawn: torch.Tensor  # the root-order generator's state once this epoch's batches were drawn
    index: int  # the release's index in its pass
    last: bool  # the epoch's last non-empty batch


_NOT_DRAWN = object()  # the step after the current one has not been looked at yet


def planned_steps(
    train_ids: torch.Tensor, batch_size: int, epochs: int, batches: Batches, root_order: torch.Generator,
    start: Position | None,
) -> Iterator[PlannedStep]:
    """Every training step in order, from ``start`` if given. Lazily: an epoch's batches are
    drawn from ``root_order`` (which nothing else reads) when its first step is looked at."""
    first_epoch = start.epoch if start is not None else 0
    for epoch in range(first_epoch, epochs):
        if start is not None and epoch == start.epoch:
            epoch_batches, first = start.batches, start.batch
        else:
            epoch_batches, first = batches(train_ids, batch_size, root_order), 0
        drawn = root_order.get_state()
        last = max((i for i, b in enumerate(epoch_batches) if b.numel()), default=-1)
        index = sum(1 for b in epoch_batches[:first] if b.numel())  # the release's index in its pass
        for position in range(first, len(epoch_batches)):
            batch = epoch_batches[position]
            if batch.numel() == 0:
                continue
            yield PlannedStep(epoch, position, batch, epoch_batches, drawn, index, position == last)
            index += 1


class StepLoop:
    """One training pass with B (the run's main pass, or an extractor's edge-free stage)."""

    def __init__(self, ctx: RunContext, spec: TrainingPass) -> None:
        self.ctx = ctx
        self.spec = spec
        self.timer = spec.timings or StepTimings()
        self.total = spec.roots.steps_per_epoch * spec.epochs
        self.step = spec.start.step if spec.start is not None else 0
        self.pending: PendingCharge | None = None
        self.root_order = torch.Generator().manual_seed(ctx.config.seed)  # public: it orders the roots B sees

    def run(self) -> None:
        spec, root_order = self.spec, self.root_order
        if spec.start is not None:
            root_order.set_state(spec.start.root_order)
        elif spec.root_order is not None:
            root_order.set_state(spec.root_order)
        steps = planned_steps(
            spec.roots.train_ids, self.ctx.config.batch_size, spec.epochs, spec.batches, root_order, spec.start
        )
        stream = self.ctx.label_party.training()
        worker = ThreadPoolExecutor(1, thread_name_prefix="charge-ahead") if spec.prefetch is not None else None
        try:
            upcoming: PlannedStep | None = next(steps, None)
            while upcoming is not None:
                upcoming = self._step(upcoming, steps, stream, worker)
        finally:
            if self.pending is not None:
                self.pending.future.exception()  # let an unfinished charge settle before the run is closed
            if worker is not None:
                worker.shutdown(wait=True)
            stream.close()

    def _saves_after(self, current: PlannedStep) -> bool:
        """Whether a checkpoint is taken after this step (every ``checkpoint_every`` and the last)."""
        return self.spec.checkpoint is not None and (
            (self.step + 1) % self.ctx.settings.checkpoint_every == 0
            or (current.epoch == self.spec.epochs - 1 and current.last)
        )

    def _step(
        self, current: PlannedStep, steps: Iterator[PlannedStep], stream: TrainingStream,
        worker: ThreadPoolExecutor | None,
    ) -> PlannedStep | None:
        """Release, charge, send, (prefetch), receive, (charge ahead), update; the next step."""
        spec, ctx, timer = self.spec, self.ctx, self.timer
        ctx.stop_if_cancelled()
        timer.begin()
        save = self._saves_after(current)
        embeddings, message = ctx.charger.charged_release(
            spec.make, current.batch, spec.release, f"{spec.pass_prefix}-{current.epoch}", "train", current.index,
            timer, self.pending, spec.edge_free,
        )
        self.pending = None
        stream.send(lp_pb.TrainStep(
            run_id=spec.session_id, step=self.step, node_ids=current.batch.tolist(), embeddings=message, checkpoint=save,
        ))
        timer.mark("send")
        upcoming: PlannedStep | None | object = _NOT_DRAWN
        if spec.prefetch is not None and not save:
            upcoming = next(steps, None)
            if upcoming is not None:
                spec.prefetch(upcoming.batch)
            timer.mark("prefetch")
        reply = stream.receive(self.step)
        timer.mark("wait")
        gradient = check_reply(ctx, reply, spec.session_id, self.step, (current.batch.numel(), ctx.config.extractor.dim, spec.layers))
        if isinstance(upcoming, PlannedStep) and worker is not None and not ctx.cancelled():
            # once B has answered well, and during A's update, when B is idle: a third
            # busy process during B's turn would slow B down on a 2-core host
            self.pending = ctx.charger.charge_ahead(
                worker, upcoming.batch, spec.release, f"{spec.pass_prefix}-{upcoming.epoch}", upcoming.index
            )
        self._update(current, embeddings, gradient)
        if save:
            spec.checkpoint(Position(self.step, current.epoch, current.position + 1, current.epoch_batches, current.drawn))
        ctx.report(ProgressEvent(
            "train", current.epoch + 1, spec.epochs, self.step, self.total, reply.loss, ctx.charger.epsilon_spent,
            spec.label,
        ))
        timer.end()
        return next(steps, None) if upcoming is _NOT_DRAWN else upcoming  # type: ignore[return-value]

    def _update(self, current: PlannedStep, embeddings: torch.Tensor, gradient: torch.Tensor) -> None:
        """B's gradient to the audit hooks and back through the release into what A trains."""
        spec = self.spec
        if spec.on_step is not None:
            spec.on_step(current.epoch, current.batch, gradient)
        if spec.optimizer is not None and embeddings.requires_grad:
            spec.optimizer.zero_grad(set_to_none=True)
            if spec.backward is not None:
                spec.backward(embeddings, gradient.to(self.ctx.device))
            else:
                embeddings.backward(gradient.to(self.ctx.device))
            spec.optimizer.step()
        self.timer.mark("update")
        self.step += 1
        self.ctx.steps_done += 1
        self.ctx.counters.step()


def check_reply(
    ctx: RunContext, reply: lp_pb.TrainStepReply, session_id: str, step: int, shape: tuple[int, ...],
) -> torch.Tensor:
    """B's gradient of the step, checked: the right session and step, a finite loss, the release's shape."""
    if reply.run_id != session_id or reply.step != step:
        raise PeerError(
            f"party B answered run {reply.run_id!r} step {reply.step} to run {session_id!r} step {step}"
        )
    if not math.isfinite(reply.loss):
        raise PeerError(f"party B reported a non-finite loss at step {reply.step}")
    try:
        return decode_tensor(
            reply.gradient, name="gradient", expected_shape=shape, expected_dtype=ctx.config.wire_dtype,
            max_elements=ctx.settings.max_message_mb * 1024 * 1024 // 2,
        )
    except WireError as exc:
        raise PeerError(f"party B sent an unusable gradient at step {reply.step}: {exc}") from None
