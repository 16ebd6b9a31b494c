"""Party A's resume files: the release journal, checkpoint rotation, what cannot resume."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vesper.common.config import RunConfig
from vesper.common.wire import encode_tensor
from vesper.party_a.run.checkpoint_files import (
    JOURNAL_FILE,
    KEEP,
    REPLAY_TOLERANCE,
    SENT_DIR,
    Checkpoint,
    Position,
    ReleaseJournal,
    ReplayDiverged,
    ResumeError,
    RunFiles,
    check_resumable,
    release_digest,
)
from vesper.proto.v1 import tensor_pb2


def test_the_journal_records_each_release_once_and_refuses_a_replay_that_differs(tmp_path: Path) -> None:
    """Without the bytes sent (a journal from before sent/ existed, or a host that lost them),
    a replay must hash to what was sent, bit for bit."""
    path = tmp_path / "releases.jsonl"
    sent = encode_tensor(torch.arange(6.0).reshape(1, 3, 2), "float32")
    journal = ReleaseJournal(path)
    assert journal.before_send("train-0/0", sent) is sent
    reopened = ReleaseJournal(path)  # after a crash
    reopened.before_send("train-0/0", encode_tensor(torch.arange(6.0).reshape(1, 3, 2), "float32"))  # same bytes: fine
    assert len(path.read_text().splitlines()) == 1
    other = encode_tensor(torch.arange(6.0).reshape(1, 3, 2) + 1e-6, "float32")
    with pytest.raises(ReplayDiverged, match="train-0/0 recomputed on resume differs.*not kept"):
        reopened.before_send("train-0/0", other)
    reopened.before_send("train-0/1", other)  # a new key is a new release
    assert len(path.read_text().splitlines()) == 2


def _release(values: torch.Tensor) -> tensor_pb2.Tensor:
    return encode_tensor(values.reshape(2, 3, 2), "float32")


def test_a_replay_that_differs_by_rounding_sends_the_bytes_sent_before(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    values = torch.linspace(-1.0, 2.0, 12)
    sent = _release(values)
    files.journal().before_send("train-0/0", sent)
    resumed = files.journal()  # after a crash
    rounding = _release(values * (1 + 3e-7))  # another thread schedule or alignment of the same math
    assert release_digest(rounding) != release_digest(sent)
    again = resumed.before_send("train-0/0", rounding)
    assert release_digest(again) == release_digest(sent)  # B gets the same bytes: nothing new
    assert [key for key, _ in resumed.inexact_replays] == ["train-0/0"]
    assert 0 < resumed.inexact_replays[0][1] < REPLAY_TOLERANCE["float32"]
    assert len((tmp_path / JOURNAL_FILE).read_text().splitlines()) == 1  # no second entry, no second release


def test_a_bfloat16_release_one_rounding_step_off_is_rounding(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    values = torch.linspace(-1.0, 2.0, 12).to(torch.bfloat16).reshape(2, 3, 2)
    files.journal().before_send("train-0/0", encode_tensor(values.float(), "bfloat16"))
    bits = values.view(torch.int16).clone()
    bits[-1, -1, -1] += 1  # the largest value, one bfloat16 step up: the widest a rounding flip can be
    off = encode_tensor(bits.view(torch.bfloat16).float(), "bfloat16")
    resumed = files.journal()
    assert release_digest(resumed.before_send("train-0/0", off)) == release_digest(
        encode_tensor(values.float(), "bfloat16")
    )
    assert resumed.inexact_replays and resumed.inexact_replays[0][1] > REPLAY_TOLERANCE["float32"]


@pytest.mark.parametrize("recomputed", [
    pytest.param(lambda v: v * 1.01, id="parameters-not-restored"),
    pytest.param(lambda v: v + torch.randn(12, generator=torch.Generator().manual_seed(1)), id="other-noise"),
    pytest.param(lambda v: torch.zeros(12), id="zeros"),
])
def test_a_replay_further_than_rounding_is_refused_and_nothing_is_sent(tmp_path: Path, recomputed) -> None:
    files = RunFiles(tmp_path)
    values = torch.linspace(-1.0, 2.0, 12)
    files.journal().before_send("train-0/0", _release(values))
    with pytest.raises(ReplayDiverged, match="train-0/0 recomputed on resume differs .* by .* of its largest value"):
        files.journal().before_send("train-0/0", _release(recomputed(values)))


def test_a_replay_of_another_shape_or_dtype_is_refused(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    files.journal().before_send("eval-0/0", _release(torch.ones(12)))
    with pytest.raises(ReplayDiverged, match="eval-0/0"):
        files.journal().before_send("eval-0/0", encode_tensor(torch.ones(3, 2, 2), "float32"))
    with pytest.raises(ReplayDiverged, match="eval-0/0"):
        files.journal().before_send("eval-0/0", encode_tensor(torch.ones(2, 3, 2), "bfloat16"))


def test_kept_bytes_that_are_torn_or_lost_fall_back_to_the_bit_for_bit_check(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    values = torch.linspace(-1.0, 2.0, 12)
    files.journal().before_send("train-0/0", _release(values))
    files.journal().before_send("train-0/1", _release(values))
    kept = sorted((tmp_path / SENT_DIR).iterdir())
    assert [p.name for p in kept] == ["train-0%2F0.pb", "train-0%2F1.pb"]
    kept[0].write_bytes(kept[0].read_bytes()[:-3])  # torn: a host that lost power before it reached the disk
    kept[1].unlink()
    for key in ("train-0/0", "train-0/1"):
        with pytest.raises(ReplayDiverged, match="not kept"):
            files.journal().before_send(key, _release(values * (1 + 3e-7)))


def test_an_edge_free_release_keeps_no_bytes_and_a_differing_replay_of_it_is_sent_as_recomputed(tmp_path: Path) -> None:
    """An extractor's edge-free stage (GAP's encoder) is replayed whole on resume; it reads no edge,
    so keeping its bytes (every epoch of the stage) would buy nothing."""
    files = RunFiles(tmp_path)
    values = torch.linspace(-1.0, 2.0, 12)
    files.journal().before_send("encoder-0/0", _release(values), edge_free=True)
    assert not (tmp_path / SENT_DIR).exists()
    recomputed = _release(values * 1.5)  # whatever it is: it reads no edge
    assert files.journal().before_send("encoder-0/0", recomputed, edge_free=True) is recomputed
    assert len((tmp_path / JOURNAL_FILE).read_text().splitlines()) == 1
    # the same key released as an edge-reading release would be held to the journal
    with pytest.raises(ReplayDiverged):
        files.journal().before_send("encoder-0/0", recomputed)


def test_kept_bytes_follow_the_checkpoints_and_go_when_the_run_ends(tmp_path: Path) -> None:
    files = RunFiles(tmp_path)
    journal = files.journal()
    for step in range(3 * (KEEP + 1)):
        journal.before_send(f"train-0/{step}", _release(torch.full((12,), float(step))))
        if step % 3 == 2:
            journal.checkpointed()
    journal.before_send("eval-0/0", _release(torch.ones(12)))
    kept = {p.name for p in (tmp_path / SENT_DIR).iterdir()}
    # a resume replays from the older of the KEEP newest checkpoints (after steps 5 and 8): steps 6 on
    assert kept == {f"train-0%2F{step}.pb" for step in range(6, 9)} | {"eval-0%2F0.pb"}
    journal.discard_kept()
    assert not (tmp_path / SENT_DIR).exists()
    assert len((tmp_path / JOURNAL_FILE).read_text().splitlines()) == 10  # the journal keeps every entry


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
