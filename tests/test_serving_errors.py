"""Bad input to alignment and prediction gets a typed error naming the problem, and changes nothing.

Party B's handler (party_b/handler.py) is called directly: the servicer maps these errors to
status codes in one place (party_b/service.py, tests/test_fuzz_rpc_party_b.py for the mapping).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vesper.common.config import PartyBConfig
from vesper.common.psi import Blinder, random_points
from vesper.party_b import errors
from vesper.party_b.handler import LabelParty
from vesper.party_b.label_import import import_labels
from vesper.proto.v1 import label_party_pb2 as pb


@pytest.fixture()
def party_b(tmp_path: Path) -> LabelParty:
    labels = tmp_path / "labels.csv"
    labels.write_text("id,label\n" + "".join(f"k{i},{'ab'[i % 2]}\n" for i in range(10)))
    import_labels(labels, tmp_path / "store")
    return LabelParty(PartyBConfig(workdir=tmp_path / "b", datasets={"mine": str(tmp_path / "store")}))


def _u(alignment_id: str = "al1", dataset: str = "mine", points: list[bytes] | None = None, **fields) -> pb.AlignPoints:
    points = points if points is not None else random_points(3)
    return pb.AlignPoints(alignment_id=alignment_id, dataset=dataset, part="U", total=len(points), points=b"".join(points), **fields)


def _drain(iterator) -> list:  # noqa: ANN001
    return list(iterator)


@pytest.mark.parametrize("message, error, fragment", [
    (_u(alignment_id="../x"), errors.BadRequest, "alignment id '../x' must be"),
    (_u(dataset="nothing"), errors.UnknownRun, "names no store"),
    (_u(points=[bytes([0xFF] * 32)]), errors.BadRequest, "element 0 is not a valid Ristretto255 point"),
    (pb.AlignPoints(alignment_id="al1", dataset="mine", part="U", total=2, points=b"x" * 33), errors.BadRequest,
     "not a whole number of 32-byte points"),
    (pb.AlignPoints(alignment_id="al1", dataset="mine", part="V", total=0), errors.BadRequest, "expected part 'U'"),
])
def test_a_bad_first_round_is_refused_by_name(party_b: LabelParty, message, error, fragment) -> None:  # noqa: ANN001
    with pytest.raises(error, match=fragment):
        _drain(party_b.align_exchange(iter([message])))
    assert not (party_b.config.workdir / "alignments").exists() or not any((party_b.config.workdir / "alignments").iterdir())


def test_a_miscounted_round_is_refused(party_b: LabelParty) -> None:
    message = _u()
    message.total = 5
    with pytest.raises(errors.BadRequest, match="announced 5 points of U and sent 3"):
        _drain(party_b.align_exchange(iter([message])))


def test_the_second_round_needs_the_first_and_the_right_count(party_b: LabelParty) -> None:
    with pytest.raises(errors.UnknownRun, match="no alignment 'nope' is waiting"):
        party_b.align_finish(iter([pb.AlignPoints(alignment_id="nope", part="Va", total=0)]))
    answers = _drain(party_b.align_exchange(iter([_u()])))
    v = [m for m in answers if m.part == "V"]
    assert sum(len(m.points) for m in v) // 32 == 16  # 10 keys padded to the next power of two
    short = pb.AlignPoints(alignment_id="al1", part="Va", total=1, points=Blinder().blind_points(random_points(1), "x")[0])
    with pytest.raises(errors.BadRequest, match="sent 1 points of V\\^a for the 16 of V"):
        party_b.align_finish(iter([short]))


def test_an_empty_stream_and_a_reused_id_are_refused(party_b: LabelParty) -> None:
    with pytest.raises(errors.BadRequest, match="empty alignment stream"):
        _drain(party_b.align_exchange(iter([])))
    _drain(party_b.align_exchange(iter([_u()])))
    with pytest.raises(errors.AlreadySetUp, match="already in progress"):
        _drain(party_b.align_exchange(iter([_u()])))


def test_prediction_and_scores_of_an_unknown_run_are_refused(party_b: LabelParty) -> None:
    chunk = pb.EvalChunk(run_id="abcdef012345", split="predict", node_ids=[0])
    with pytest.raises(errors.UnknownRun, match="no finished run abcdef012345"):
        party_b.predict(iter([chunk]))
    with pytest.raises(errors.BadRequest, match="empty prediction stream"):
        party_b.predict(iter([]))
    with pytest.raises(errors.BadRequest, match="must match"):
        party_b.scores_plan(pb.ScoresRequest(run_id="../etc", select="all"))
    with pytest.raises(errors.UnknownRun, match="no finished run"):
        party_b.scores_plan(pb.ScoresRequest(run_id="abcdef012345", select="all"))
