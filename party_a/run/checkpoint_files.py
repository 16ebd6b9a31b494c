"""What party A keeps on disk to resume a run (docs/faults.md).

``runs/<id>/`` at A holds, besides the run's results:

    resume.pt          written once the run exists at the accountant: the run's settings,
                       how each release is charged (the calibrated z), and A's secret
                       generators as they stood before the first release
    checkpoint-<s>.pt  after s training steps of the main session: the extractor and
                       optimiser, the generators (sampling, noise, batch order),
                       and the position in the epoch; the newest KEEP are kept
    releases.jsonl     one line per release sent to B: its release key and the SHA-256
                       of the exact bytes sent, appended (and synced) before it is sent

A resumed run replays from its last checkpoint. Every release it recomputes that the
ledger already holds must hash to what was sent: re-sending the same bytes tells B
nothing new and the accountant recognises the charge (idempotent per release key). A
recomputed release that differs is never sent (:class:`ReplayDiverged`): that would be
a second release charged once.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from vesper.common.config import RunConfig
from vesper.proto.v1 import tensor_pb2

RESUME_FILE = "resume.pt"
JOURNAL_FILE = "releases.jsonl"
KEEP = 2
TRAIN_PASS = "train-"  # release keys of the main training loop: "train-<epoch>/<index>"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)\.pt$")


class ReplayDiverged(ValueError):
    """A release recomputed on resume differs from the one sent under the same charge."""


class ResumeError(ValueError):
    """The run cannot be resumed (named reason)."""


def release_digest(message: tensor_pb2.Tensor) -> str:
    """SHA-256 of the tensor exactly as it goes on the wire."""
    return hashlib.sha256(message.SerializeToString(deterministic=True)).hexdigest()


def _atomic_save(obj: Any, path: Path) -> None:
    """Write, sync, then rename: a crash leaves the old file or the new one, never half."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())
    tmp.replace(path)


class _MovedClasses(pickle.Unpickler):
    """Reads run files written before the classes they hold moved (issue #22 made
    party_a/trainer.py the package party_a/run/): a run interrupted under an older release
    still resumes."""

    MOVED = {
        ("vesper.party_a.trainer", "Release"): ("vesper.party_a.run.release", "Release"),
        ("vesper.party_a.run_checkpoint", "Checkpoint"): ("vesper.party_a.run.checkpoint_files", "Checkpoint"),
        ("vesper.party_a.run_checkpoint", "Position"): ("vesper.party_a.run.checkpoint_files", "Position"),
    }

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(*self.MOVED.get((module, name), (module, name)))


_PICKLE = SimpleNamespace(Unpickler=_MovedClasses, load=pickle.load, __name__="pickle")


def _load(path: Path) -> dict:
    # A's own files, written by this module: trusted, and they hold pydantic models and generator states
    return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_PICKLE)


@dataclass
class Position:
    """Where the main training loop stands after ``step`` steps (a checkpoint's place)."""

    step: int
    epoch: int
    batch: int  # index into ``batches`` of the next step's roots
    batches: list[torch.Tensor]  # this epoch's roots, as drawn at its start
    root_order: torch.Tensor  # the batch-order generator after drawing this epoch


@dataclass
class Checkpoint:
    """A's state after ``position.step`` training steps (one file, ``checkpoint-<step>.pt``)."""

    position: Position
    extractor: dict[str, Any]
    optimizer: dict[str, Any] | None
    sampling: torch.Tensor
    noise: torch.Tensor
    charges: int  # ledger rows of the run when it was taken
    epsilon_spent: float
    steps_done: int


class ReleaseJournal:
    """``releases.jsonl``: the digest of every release sent, and the check of replays."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sent: dict[str, str] = {}
        # keys of training releases, one list per interval between checkpoints (oldest first):
        # their digests leave memory once no kept checkpoint precedes them (checkpointed())
        self._train_keys: list[list[str]] = [[]]
        if path.exists():
            for number, line in enumerate(path.read_text().splitlines(), 1):
                try:
                    entry = json.loads(line)
                    self.sent[entry["key"]] = entry["sha256"]
                    if entry["key"].startswith(TRAIN_PASS):
                        self._train_keys[0].append(entry["key"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    # only the last line can be torn (a crash mid-append), and its release was never sent
                    if number != len(path.read_text().splitlines()):
                        raise ResumeError(f"{path} line {number} is not a journal entry") from None

    def before_send(self, key: str, message: tensor_pb2.Tensor) -> None:
        """Record the release about to be sent, or check a replayed one against the record."""
        digest = release_digest(message)
        earlier = self.sent.get(key)
        if earlier is not None:
            if earlier != digest:
                raise ReplayDiverged(
                    f"release {key} recomputed on resume differs from the one sent before (sha256 "
                    f"{digest[:12]} against {earlier[:12]}); it was not sent: sending it would be a second "
                    "release under one charge. The run cannot be resumed on this host/configuration"
                )
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps({"key": key, "sha256": digest}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.sent[key] = digest
        if key.startswith(TRAIN_PASS):
            self._train_keys[-1].append(key)

    def checkpointed(self) -> None:
        """A checkpoint was saved. A resume replays training from a kept checkpoint (the KEEP
        newest), so digests of training releases sent before the oldest of them are never
        looked up again: without this, memory grows by ~190 bytes per step for the whole run.
        releases.jsonl keeps every entry; the preparation's releases (replayed whole on
        resume) stay in memory."""
        self._train_keys.append([])
        while len(self._train_keys) > KEEP:
            for key in self._train_keys.pop(0):
                self.sent.pop(key, None)


def check_resumable(config: RunConfig) -> None:
    """Refuse to resume runs whose state lives outside the checkpoints (ResumeError names it)."""
    reasons = []
    if config.label_privacy.mode != "none":
        reasons.append(f"label_privacy.mode={config.label_privacy.mode} (B's label mechanism draws once per run)")
    if config.audit.canaries or config.audit.membership or config.audit.record_releases:
        reasons.append("an audit (canaries, membership or recorded releases are kept in memory)")
    if config.record_gradients:
        reasons.append("record_gradients (the record is kept in memory)")
    if reasons:
        raise ResumeError("resuming is not supported for runs with " + "; ".join(reasons) + ": start it again")


class RunFiles:
    """A run's resume files in ``run_dir``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def save_start(self, state: dict[str, Any]) -> None:
        _atomic_save(state, self.run_dir / RESUME_FILE)

    def load_start(self) -> dict[str, Any]:
        path = self.run_dir / RESUME_FILE
        if not path.exists():
            raise ResumeError(
                f"party A has no resume record for this run ({path}): it never reached the accountant, "
                "or it ran before checkpoints existed; start it again"
            )
        return _load(path)

    def journal(self) -> ReleaseJournal:
        return ReleaseJournal(self.run_dir / JOURNAL_FILE)

    def checkpoint_steps(self) -> list[int]:
        steps = []
        for path in self.run_dir.glob("checkpoint-*.pt"):
            match = _CHECKPOINT.match(path.name)
            if match:
                steps.append(int(match.group(1)))
        return sorted(steps)

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        _atomic_save(checkpoint, self.run_dir / f"checkpoint-{checkpoint.position.step}.pt")
        for step in self.checkpoint_steps()[:-KEEP]:
            (self.run_dir / f"checkpoint-{step}.pt").unlink(missing_ok=True)

    def latest_checkpoint(self) -> Checkpoint | None:
        """The newest checkpoint. B holds it too: A takes checkpoint s only once B has
        answered step s, and B saves before it answers (B keeps KEEP as well)."""
        steps = self.checkpoint_steps()
        return _load(self.run_dir / f"checkpoint-{steps[-1]}.pt") if steps else None
