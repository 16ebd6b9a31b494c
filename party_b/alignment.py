"""Party B's side of a private id alignment (docs/alignment.md): the PSI's two rounds, and the
aligned dataset B keeps.

Round 1 (``exchange``): A's blinded keys U = {H(x)^a} arrive; B answers with U^b in U's order,
then with its own blinded keys V = {H(y)^b}, padded with random points and shuffled. B's
secret b is dropped once both are computed. Round 2 (``finish``): V^a arrives in V's order;
a key y of B is in the intersection when H(y)^(ab) is among U^b. B sorts the intersection by
those double-blinded values, which A sorts alike: position j is shared index j. B writes, in
``<workdir>/alignments/<id>/``:

    labels.npz          its labels over the shared index (-1 = held but unlabelled), class
                        names, its split when its file gave one
    keys.parquet        its key of each shared index (for prediction); never sent
    unmatched_keys.csv  its keys A's graph does not hold, for B only
    alignment.json      the id, the size of the intersection and how many keys were unmatched

Nothing of A's keys outside the intersection reaches B: U^b of a key B does not hold is a
random group element to B (DDH), and A pads U to a size that is not its node count.
"""

from __future__ import annotations

import csv
import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vesper.common.dataset_files import write_label_npz
from vesper.common.psi import Blinder, PsiError, matches, padded_size, random_points, secret_shuffle, split_points
from vesper.common.stores import ALIGNMENT_FILE, LABEL_FILE, alignment_dir, check_alignment_id, resolve_store
from vesper.party_b.errors import AlreadySetUp, BadRequest, Refused, UnknownRun
from vesper.party_b.label_import import read_label_table
from vesper.proto.v1 import label_party_pb2 as pb

CHUNK = 1 << 16  # points per message: 2 MiB
_PENDING_S = 3600.0  # how long B keeps a round-1 state waiting for round 2


def context_of(alignment_id: str) -> bytes:
    """The hash's context: both parties hash their keys under the alignment's public id."""
    return b"vesper-align:" + alignment_id.encode()


@dataclass
class _Pending:
    """What B keeps between the rounds: never its secret, never a key of A."""

    store: Path
    ub: list[bytes]  # U^b, in U's order
    v_owner: list[int]  # per position of V: the index of B's key, or -1 for padding
    started: float


def _chunks(part: str, points: list[bytes], alignment_id: str) -> Iterator[pb.AlignPoints]:
    for start in range(0, max(len(points), 1), CHUNK):
        yield pb.AlignPoints(
            alignment_id=alignment_id, part=part, total=len(points) if start == 0 else 0,
            points=b"".join(points[start : start + CHUNK]),
        )


class Alignments:
    """B's alignments in progress (between the two rounds) and the ones it has made."""

    def __init__(self, workdir: Path, datasets: dict[str, str], pad_to: int | None = None) -> None:
        self.workdir = workdir
        self.datasets = datasets
        self.pad_to = pad_to
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()

    # -- round 1 ---------------------------------------------------------------------------
    def exchange(self, requests: Iterator[pb.AlignPoints]) -> Iterator[pb.AlignPoints]:
        first = next(requests, None)
        if first is None:
            raise BadRequest("an empty alignment stream: the first message names the alignment and B's dataset")
        alignment_id = self._new_id(first.alignment_id)
        try:
            store = resolve_store(first.dataset, self.datasets, "labels.parquet", "party-b")
        except ValueError as exc:
            raise UnknownRun(str(exc)) from None
        keys, *_ = read_label_table(store)
        blinder = Blinder()
        ub: list[bytes] = []
        for message in _points_of(first, requests, "U", alignment_id):
            answered = _blind(blinder, message, "party A's blinded keys")
            ub += answered
            yield from _chunks("Ub", answered, alignment_id)
        v, v_owner = self._blinded_keys(blinder, keys.to_pylist(), alignment_id)
        del blinder  # b is not needed again: round 2 compares values only
        with self._lock:
            self._pending[alignment_id] = _Pending(store, ub, v_owner, time.monotonic())
        yield from _chunks("V", v, alignment_id)

    def _new_id(self, alignment_id: str) -> str:
        try:
            check_alignment_id(alignment_id)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        if (alignment_dir(self.workdir, alignment_id) / ALIGNMENT_FILE).exists():
            raise AlreadySetUp(f"party B already holds an alignment {alignment_id!r}: choose another id")
        with self._lock:
            now = time.monotonic()
            self._pending = {k: p for k, p in self._pending.items() if now - p.started < _PENDING_S}
            if alignment_id in self._pending:
                raise AlreadySetUp(f"alignment {alignment_id!r} is already in progress at party B")
        return alignment_id

    def _blinded_keys(self, blinder: Blinder, keys: list[str], alignment_id: str) -> tuple[list[bytes], list[int]]:
        """V: B's keys blinded, padded with random points to the padded size, in a secret order."""
        try:
            size = padded_size(len(keys), self.pad_to)
        except ValueError as exc:
            raise Refused(f"party B: {exc} (party_b.alignment_pad_to)") from None
        points = blinder.blind_keys(keys, context_of(alignment_id)) + random_points(size - len(keys))
        owner = list(range(len(keys))) + [-1] * (size - len(keys))
        order = secret_shuffle(size)
        return [points[i] for i in order], [owner[i] for i in order]

    # -- round 2 ---------------------------------------------------------------------------
    def finish(self, requests: Iterator[pb.AlignPoints]) -> pb.AlignSummary:
        first = next(requests, None)
        if first is None:
            raise BadRequest("an empty alignment stream")
        with self._lock:
            pending = self._pending.pop(first.alignment_id, None)
        if pending is None:
            raise UnknownRun(f"no alignment {first.alignment_id[:80]!r} is waiting for its second round at party B")
        va: list[bytes] = []
        for message in _points_of(first, requests, "Va", first.alignment_id):
            va += split_points(message.points, "V blinded by party A")
        if len(va) != len(pending.v_owner):
            raise BadRequest(f"party A sent {len(va)} points of V^a for the {len(pending.v_owner)} of V")
        matched = [p for p in matches(va, pending.ub) if pending.v_owner[p] >= 0]
        shared = sorted(matched, key=lambda p: va[p])  # the shared index: sorted by H(y)^(ab)
        size = write_alignment(self.workdir, first.alignment_id, pending.store, [pending.v_owner[p] for p in shared])
        return pb.AlignSummary(alignment_id=first.alignment_id, size=size)


def _points_of(
    first: pb.AlignPoints, requests: Iterator[pb.AlignPoints], part: str, alignment_id: str
) -> Iterator[pb.AlignPoints]:
    """The messages of one part, first included, each checked to belong to it; the count checked at the end."""
    expected, received = first.total, 0
    for message in _prepend(first, requests):
        if message.alignment_id != alignment_id or message.part != part:
            raise BadRequest(f"expected part {part!r} of alignment {alignment_id!r}, got {message.part!r} of {message.alignment_id!r}")
        received += len(message.points) // 32
        yield message
    if received != expected:
        raise BadRequest(f"party A announced {expected} points of {part} and sent {received}")


def _prepend(first: pb.AlignPoints, rest: Iterator[pb.AlignPoints]) -> Iterator[pb.AlignPoints]:
    yield first
    yield from rest


def _blind(blinder: Blinder, message: pb.AlignPoints, what: str) -> list[bytes]:
    try:
        return blinder.blind_points(split_points(message.points, what), what)
    except PsiError as exc:
        raise BadRequest(str(exc)) from None


def write_alignment(workdir: Path, alignment_id: str, store: Path, shared_rows: list[int]) -> int:
    """B's aligned dataset: ``shared_rows[j]`` is the row of B's store at shared index j."""
    keys, labels, splits, class_names = read_label_table(store)
    rows = np.asarray(shared_rows, dtype=np.int64)
    final = alignment_dir(workdir, alignment_id)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)  # a crashed earlier attempt
    tmp.mkdir(parents=True)
    masks = None
    if (splits[labels >= 0] >= 0).any():
        masks = tuple(np.atleast_2d(splits[rows] == code) for code in (0, 1, 2))
    write_label_npz(tmp / LABEL_FILE, labels[rows].astype(np.int64), class_names, masks)
    pq.write_table(pa.table({"key": keys.take(pa.array(rows))}), tmp / "keys.parquet")
    unmatched = np.setdiff1d(np.arange(len(keys)), rows)
    with (tmp / "unmatched_keys.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["key"])
        for start in range(0, unmatched.size, CHUNK):
            writer.writerows([k] for k in keys.take(pa.array(unmatched[start : start + CHUNK])).to_pylist())
    (tmp / ALIGNMENT_FILE).write_text(json.dumps({
        "alignment_id": alignment_id, "store": str(store), "size": int(rows.size),
        "unmatched_keys": int(unmatched.size), "created": time.time(),
    }, indent=2) + "\n")
    tmp.rename(final)
    return int(rows.size)
