"""Checkpoints and resuming of one run (party_a.run.checkpoint_files holds the files; docs/faults.md).

Once the run exists at the accountant A saves a resume record (the settings, how each
release is charged, the secret generators before the first release); every
``checkpoint_every`` steps of the main pass, a checkpoint. A resumed run replays the
preparation from the resume record, then restores the newest checkpoint.
"""

from __future__ import annotations

import torch

from vesper.party_a.extractors.base import Extractor
from vesper.party_a.run.checkpoint_files import Checkpoint, Position, RunFiles
from vesper.party_a.run.context import RunContext
from vesper.party_a.run.progress import ProgressEvent
from vesper.party_a.run.release import Release
from vesper.party_a.run.secrets import SecretGenerators


class RunCheckpoints:
    def __init__(self, ctx: RunContext, files: RunFiles, generators: SecretGenerators, resuming: bool) -> None:
        self.ctx = ctx
        self.files = files
        self.generators = generators
        self.latest: Checkpoint | None = files.latest_checkpoint() if resuming else None

    @property
    def resume_step(self) -> int:
        return self.latest.position.step if self.latest else 0

    def save_resume_record(self, delta: float, release: Release) -> None:
        """Once the run exists at the accountant: what a resumed run needs to replay it."""
        sampling, noise = self.generators.initial
        self.files.save_start({
            "run_id": self.ctx.run_id, "config": self.ctx.config.model_dump(mode="json"), "delta": delta,
            "release": release, "sampling": sampling, "noise": noise,
            # the edge-free layers' dropout secret (SecretGenerators.edge_free): a resume draws the same keys
            "edge_free": self.generators.edge_free,
            # keyed per-node noise (party A's workers, docs/privacy.md 2.6): a resume keeps the run's form
            "keyed_noise": self.ctx.settings.workers > 1,
        })

    def save(self, position: Position, extractor: Extractor, optimizer: torch.optim.Optimizer | None) -> None:
        sampling, noise = self.generators.state()
        charger = self.ctx.charger
        self.latest = Checkpoint(
            position=position, extractor=extractor.state_dict(),
            optimizer=None if optimizer is None else optimizer.state_dict(),
            sampling=sampling, noise=noise,
            charges=charger.charges, epsilon_spent=charger.epsilon_spent, steps_done=self.ctx.steps_done,
        )
        self.files.save_checkpoint(self.latest)
        charger.journal.checkpointed()

    def restore(self, extractor: Extractor, optimizer: torch.optim.Optimizer | None) -> Position:
        """The checkpoint's state, over a run replayed up to the end of its preparation."""
        saved = self.latest
        assert saved is not None
        extractor.load_state_dict(saved.extractor)
        if optimizer is not None and saved.optimizer is not None:
            optimizer.load_state_dict(saved.optimizer)
        self.generators.restore(saved.sampling, saved.noise)
        self.ctx.steps_done = saved.steps_done
        self.ctx.report(ProgressEvent(
            "train", message=f"resumed from the checkpoint after step {saved.position.step}",
            epsilon_spent=self.ctx.charger.epsilon_spent,
        ))
        return saved.position
