"""Party A's resume files: the release journal, checkpoint rotation, what cannot resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vesper.common.config import RunConfig
from vesper.common.wire import encode_tensor
from vesper.party_a.run.checkpoint_files import (
    KEEP,
    Checkpoint,
    Position,
    ReleaseJournal,
    ReplayDiverged,
    ResumeError,
    RunFiles,
    check_resumable,
)


def test_the_journal_records_each_release_once_and_refuses_a_replay_that_differs(tmp_path: Path) -> None:
    path = tmp_path / "releases.jsonl"
    sent = encode_tensor(torch.arange(6.0).reshape(1, 3, 2), "float32")
    journal = ReleaseJournal(path)
    journal.before_send("train-0/0", sent)
    reopened = ReleaseJournal(path)  # after a crash
    reopened.before_send("train-0/0", encode_tensor(torch.arange(6.0).reshape(1, 3, 2), "float32"))  # same bytes: fine
    assert len(path.read_text().splitlines()) == 1
    other = encode_tensor(torch.arange(6.0).reshape(1, 3, 2) + 1e-6, "float32")
    with pytest.raises(ReplayDiverged, match="train-0/0 recomputed on resume differs"):
        reopened.before_send("train-0/0", other)
    reopened.before_send("train-0/1", other)  # a new key is a new release
    assert len(path.read_text().splitlines()) == 2


def test_a_torn_last_journal_line_is_a_release_never_sent_but_a_torn_middle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "releases.jsonl"
    ReleaseJournal(path).before_send("a/0", encode_tensor(torch.zeros(1, 1, 1), "float32"))
    with path.open("a") as handle:
        handle.write('{"key": "a/1", "sha')
    assert set(ReleaseJournal(path).sent) == {"a/0"}
    path.write_text('{"key": "a/1", "sha\n' + path.read_text())
    with pytest.raises(ResumeError, match="line 1 is not a journal entry"):
        ReleaseJournal(path)


def _checkpoint(step: int) -> Checkpoint:
    state = torch.Generator().get_state()
    position = Position(step, 0, step, [torch.arange(3)], state)
    return Checkpoint(position, {"w": torch.ones(2)}, None, state, state, step, 0.5, step)


def test_checkpoints_rotate_and_the_newest_is_loaded(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    assert files.latest_checkpoint() is None
    for step in (5, 10, 15, 20):
        files.save_checkpoint(_checkpoint(step))
    assert files.checkpoint_steps() == [15, 20][-KEEP:]
    latest = files.latest_checkpoint()
    assert latest.position.step == 20 and torch.equal(latest.extractor["w"], torch.ones(2))
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ResumeError, match="no resume record"):
        files.load_start()


@pytest.mark.parametrize(
    "settings, fragment",
    [
        ({"label_privacy": {"mode": "rr", "epsilon": 2}}, "label_privacy.mode=rr"),
        ({"audit": {"canaries": 10}}, "an audit"),
        ({"record_gradients": True}, "record_gradients"),
    ],
)
def test_runs_whose_state_lives_outside_the_checkpoints_are_not_resumed(settings: dict, fragment: str) -> None:
    check_resumable(RunConfig.model_validate({"dataset": "cora"}))
    with pytest.raises(ResumeError, match=fragment):
        check_resumable(RunConfig.model_validate({"dataset": "cora", **settings}))


def test_the_journal_forgets_training_digests_no_kept_checkpoint_can_replay(tmp_path: Path) -> None:
    journal = ReleaseJournal(tmp_path / "releases.jsonl")
    message = encode_tensor(torch.zeros(1, 1, 1), "float32")
    journal.before_send("one-shot-0/0", message)
    for step in range(12):
        journal.before_send(f"train-0/{step}", message)
        if step % 4 == 3:
            journal.checkpointed()  # checkpoints after steps 4, 8 and 12
    # the files kept are checkpoints 8 and 12, and a resume replays from one of them: the
    # digests from step 8 on and the preparation's release stay checkable, older ones are gone
    assert set(journal.sent) == {"one-shot-0/0", *(f"train-0/{s}" for s in range(8, 12))}
    assert len((tmp_path / "releases.jsonl").read_text().splitlines()) == 13  # the file keeps all


def test_run_files_written_before_the_classes_moved_still_load(tmp_path: Path, monkeypatch) -> None:
    """A run interrupted under a release where Release lived in party_a/trainer.py and Checkpoint in
    party_a/run_checkpoint.py resumes under this one (issue #22 moved both)."""
    import dataclasses
    import sys
    import types

    from vesper.party_a.run import checkpoint_files
    from vesper.party_a.run.release import Release

    old_trainer = types.ModuleType("vesper.party_a.trainer")
    old_release = dataclasses.make_dataclass("Release", [f.name for f in dataclasses.fields(Release)], frozen=True)
    old_release.__module__ = old_trainer.__name__
    old_trainer.Release = old_release
    old_checkpoints = types.ModuleType("vesper.party_a.run_checkpoint")
    for name in ("Checkpoint", "Position"):
        cls = getattr(checkpoint_files, name)
        copy = dataclasses.make_dataclass(name, [f.name for f in dataclasses.fields(cls)])
        copy.__module__ = old_checkpoints.__name__
        setattr(old_checkpoints, name, copy)
    monkeypatch.setitem(sys.modules, old_trainer.__name__, old_trainer)
    monkeypatch.setitem(sys.modules, old_checkpoints.__name__, old_checkpoints)
    position = old_checkpoints.Position(3, 0, 1, [torch.arange(2)], torch.zeros(1))
    torch.save({"release": old_release([], 1.5, 1.0, 1, {}), "position": position}, tmp_path / "old.pt")
    monkeypatch.delitem(sys.modules, old_trainer.__name__)
    monkeypatch.delitem(sys.modules, old_checkpoints.__name__)

    loaded = checkpoint_files._load(tmp_path / "old.pt")
    assert type(loaded["release"]) is Release and loaded["release"].noise_std == 1.5
    assert type(loaded["position"]) is checkpoint_files.Position and loaded["position"].step == 3
