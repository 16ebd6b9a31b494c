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
    sent/              the exact bytes of the releases a resume may recompute (those sent
                       since the oldest kept checkpoint, the preparation's and the
                       evaluation's, not an edge-free stage's); removed once the run can no
                       longer resume

A resumed run replays from its last checkpoint. Every release it recomputes that the
ledger already holds is sent again as the bytes sent before (``sent/``): re-sending the
same bytes tells B nothing new and the accountant recognises the charge (idempotent per
release key). The recomputation is checked against them: floating-point rounding (another
thread schedule, another memory alignment of the same math) may change its last bits,
which is logged; a recomputed release further than that from what was sent means the
checkpoint did not restore the run, and nothing is sent (:class:`ReplayDiverged`).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

import torch

from vesper.common.config import RunConfig
from vesper.common.wire import WireError, decode_tensor, dtype_from_proto, tensor_digest
from vesper.proto.v1 import tensor_pb2

log = logging.getLogger(__name__)

RESUME_FILE = "resume.pt"
JOURNAL_FILE = "releases.jsonl"
SENT_DIR = "sent"
# A recomputed release within this fraction of its largest |value| of the bytes sent differs by
# floating-point rounding only (bfloat16 on the wire: one rounding step is up to 2^-8 of a value,
# so two steps); a state the checkpoint failed to restore (parameters, the noise stream, the
# sampled neighbours) moves it by the order of the noise itself (docs/faults.md).
REPLAY_TOLERANCE = {"float32": 1e-3, "bfloat16": 2.0**-7}
KEEP = 2
TRAIN_PASS = "train-"  # release keys of the main training loop: "train-<epoch>/<index>"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)\.pt$")


class ReplayDiverged(ValueError):
    """A release recomputed on resume differs from the one sent under the same charge."""


class ResumeError(ValueError):
    """The run cannot be resumed (named reason)."""


def release_digest(message: tensor_pb2.Tensor) -> str:
    """SHA-256 of the tensor exactly as it goes on the wire."""
    return tensor_digest(message)


def replay_gap(sent: tensor_pb2.Tensor, recomputed: tensor_pb2.Tensor) -> float:
    """How far a recomputed release is from the one sent: max |difference| over the sent
    release's largest |value| (infinite if either is not a tensor of the same shape and dtype)."""
    try:
        before = decode_tensor(sent, name="sent release", require_finite=False, max_abs=None)
        after = decode_tensor(recomputed, name="recomputed release", require_finite=False, max_abs=None)
    except WireError:
        return float("inf")
    if before.shape != after.shape or sent.dtype != recomputed.dtype:
        return float("inf")
    scale = before.abs().max().item() if before.numel() else 0.0
    gap = (before - after).abs().max().item() if before.numel() else 0.0
    return gap / scale if scale > 0 else (0.0 if gap == 0 else float("inf"))


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
    """``releases.jsonl``: the digest of every release sent; ``sent/``: the bytes a resume may
    send again; and the check of replays."""

    def __init__(self, path: Path, sent_dir: Path | None = None) -> None:
        self.path = path
        self.sent_dir = sent_dir
        self.sent: dict[str, str] = {}
        self.inexact_replays: list[tuple[str, float]] = []  # (key, replay_gap) of each release re-sent
        # keys of training releases, one list per interval between checkpoints (oldest first):
        # their digests (and bytes) are dropped once no kept checkpoint precedes them (checkpointed())
        self._train_keys: list[list[str]] = [[]]
        if path.exists():
            lines = path.read_text().splitlines()
            for number, line in enumerate(lines, 1):
                try:
                    entry = json.loads(line)
                    self.sent[entry["key"]] = entry["sha256"]
                    if entry["key"].startswith(TRAIN_PASS):
                        self._train_keys[0].append(entry["key"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    # only the last line can be torn (a crash mid-append), and its release was never sent
                    if number != len(lines):
                        raise ResumeError(f"{path} line {number} is not a journal entry") from None

    def before_send(self, key: str, message: tensor_pb2.Tensor, edge_free: bool = False) -> tensor_pb2.Tensor:
        """Record the release about to be sent, or check a replayed one against the record.
        Returns what to send: the release itself, or for a replay the bytes sent before.

        ``edge_free``: a release that reads no edge (an extractor's edge-free stage, replayed
        whole on resume): nothing to protect at edge level, so its bytes are not kept and a
        recomputation that differs is sent as it is."""
        digest = release_digest(message)
        earlier = self.sent.get(key)
        if earlier is not None:
            if digest == earlier:
                return message
            if edge_free:
                log.info("edge-free release %s recomputed on resume differs from the one sent; it reads no edge: sent", key)
                return message
            return self._replayed(key, message, digest, earlier)
        if not edge_free:
            self._keep(key, message)
        with self.path.open("a") as handle:
            handle.write(json.dumps({"key": key, "sha256": digest}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.sent[key] = digest
        if key.startswith(TRAIN_PASS):
            self._train_keys[-1].append(key)
        return message

    def _replayed(self, key: str, recomputed: tensor_pb2.Tensor, digest: str, earlier: str) -> tensor_pb2.Tensor:
        """A recomputed release whose bytes differ from those sent: the bytes sent, if they are
        kept and the difference is rounding; otherwise ReplayDiverged."""
        sent = self._kept(key, earlier)
        if sent is None:
            raise ReplayDiverged(
                f"release {key} recomputed on resume differs from the one sent before (sha256 {digest[:12]} "
                f"against {earlier[:12]}), and the bytes sent are not kept to send again; it was not sent: "
                "sending it would be a second release under one charge. The run cannot be resumed"
            )
        gap = replay_gap(sent, recomputed)
        tolerance = REPLAY_TOLERANCE.get(dtype_from_proto(sent.dtype), 0.0)
        if gap > tolerance:
            raise ReplayDiverged(
                f"release {key} recomputed on resume differs from the one sent before by {gap:.3g} of its "
                f"largest value, more than floating-point rounding ({tolerance:g}): the checkpoint did "
                "not restore the run's state. Nothing was sent. The run cannot be resumed"
            )
        log.warning(
            "release %s recomputed on resume differs from the one sent in its last bits (by %.3g of its largest "
            "value); the bytes sent before are sent again", key, gap,
        )
        self.inexact_replays.append((key, gap))
        return sent

    def _file(self, key: str) -> Path:
        assert self.sent_dir is not None
        return self.sent_dir / (quote(key, safe="") + ".pb")

    def _keep(self, key: str, message: tensor_pb2.Tensor) -> None:
        """The bytes about to be sent, for a resume to send again. Written to a temporary name
        and renamed, not synced: a process killed keeps them (the page cache survives it); a
        host that loses power may lose them, and its replay is then checked bit for bit."""
        if self.sent_dir is None:
            return
        self.sent_dir.mkdir(exist_ok=True)
        path = self._file(key)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(message.SerializeToString(deterministic=True))
        tmp.replace(path)

    def _kept(self, key: str, digest: str) -> tensor_pb2.Tensor | None:
        """The bytes sent under ``key``, if kept and intact (their digest is the journal's)."""
        if self.sent_dir is None or not self._file(key).exists():
            return None
        message = tensor_pb2.Tensor()
        try:
            message.ParseFromString(self._file(key).read_bytes())
        except Exception:  # noqa: BLE001 - a torn or foreign file: not the bytes sent
            return None
        return message if release_digest(message) == digest else None

    def checkpointed(self) -> None:
        """A checkpoint was saved. A resume replays training from a kept checkpoint (the KEEP
        newest), so training releases sent before the oldest of them are never looked up
        again: their digests leave memory (~190 bytes per step otherwise, for the whole run)
        and their bytes leave ``sent/``. releases.jsonl keeps every entry; the preparation's
        and the evaluation's releases (replayed whole on resume) stay."""
        self._train_keys.append([])
        while len(self._train_keys) > KEEP:
            for key in self._train_keys.pop(0):
                self.sent.pop(key, None)
                if self.sent_dir is not None:
                    self._file(key).unlink(missing_ok=True)

    def discard_kept(self) -> None:
        """The run can no longer resume: the bytes kept for a resume go."""
        if self.sent_dir is None or not self.sent_dir.exists():
            return
        try:
            for path in self.sent_dir.iterdir():
                path.unlink(missing_ok=True)
            self.sent_dir.rmdir()
        except OSError as exc:  # the run is over either way: say what is left behind
            log.warning("could not remove %s (%s): delete it by hand; nothing needs it", self.sent_dir, exc)


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

    def journal(self, keep_sent: bool = True) -> ReleaseJournal:
        """The run's release journal; ``keep_sent``: also keep the bytes a resume sends again
        (a prediction pass is never resumed, so it keeps only the digests)."""
        return ReleaseJournal(self.run_dir / JOURNAL_FILE, self.run_dir / SENT_DIR if keep_sent else None)

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
