"""Party A's side of a private id alignment (docs/alignment.md), and the aligned graph A keeps.

A blinds its keys with a fresh secret a, pads them with random points to a size that is not
its node count, shuffles them and sends them to B (U = {H(x)^a}); B answers with U^b in U's
order and its own blinded keys V = {H(y)^b}. A computes V^a: a node x of A is in the
intersection when H(x)^(ab) is among V^a. A sends V^a back in V's order (B finds its side
of the intersection the same way) and sorts the intersection by the double-blinded values,
as B does: position j is shared index j. A's secret is dropped with the alignment.

A then writes ``<workdir>/alignments/<id>/graph.npz``: its whole graph, renumbered so that
shared index j is node j and the nodes B does not hold follow (still neighbours, never
named on the wire: a run refuses any id of B's from K on), and ``alignment.json`` (local).
Nothing of B's keys outside the intersection reaches A, nor B's key count beyond its padded size.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from vesper.common.csr_cache import _npz_member
from vesper.common.dataset_files import write_graph_npz
from vesper.common.psi import Blinder, PsiError, matches, padded_size, random_points, secret_shuffle, split_points
from vesper.common.stores import ALIGNMENT_FILE, GRAPH_FILE, alignment_dir, check_alignment_id, resolve_store
from vesper.party_a.graph_import import read_node_keys
from vesper.party_a.peers import LabelPartyClient, PeerError
from vesper.proto.v1 import label_party_pb2 as lp_pb

CHUNK = 1 << 16  # points per message: 2 MiB
EDGE_CHUNK = 1 << 22  # edges renumbered at once


class AlignmentReport(BaseModel):
    """What the coordinator is told: the aligned dataset's id and the intersection's size."""

    alignment_id: str
    dataset: str
    size: int
    seconds: float


def context_of(alignment_id: str) -> bytes:
    return b"vesper-align:" + alignment_id.encode()


def _chunks(part: str, points: list[bytes], alignment_id: str, dataset: str = "") -> Iterator[lp_pb.AlignPoints]:
    for start in range(0, max(len(points), 1), CHUNK):
        yield lp_pb.AlignPoints(
            alignment_id=alignment_id, dataset=dataset if start == 0 else "", part=part,
            total=len(points) if start == 0 else 0, points=b"".join(points[start : start + CHUNK]),
        )


def blinded_nodes(keys: list[str], alignment_id: str, pad_to: int | None) -> tuple[Blinder, list[bytes], list[int]]:
    """U: A's keys blinded, padded with random points, in a secret order; per position the
    node it blinds (-1 for padding)."""
    blinder = Blinder()
    size = padded_size(len(keys), pad_to)
    points = blinder.blind_keys(keys, context_of(alignment_id)) + random_points(size - len(keys))
    owner = list(range(len(keys))) + [-1] * (size - len(keys))
    order = secret_shuffle(size)
    return blinder, [points[i] for i in order], [owner[i] for i in order]


def exchange(
    label_party: LabelPartyClient, alignment_id: str, dataset: str, u: list[bytes], timeout_s: float,
) -> tuple[list[bytes], list[bytes]]:
    """Round 1: U out; U^b (U's order) and V back."""
    ub: list[bytes] = []
    v: list[bytes] = []
    for message in label_party.align_exchange(_chunks("U", u, alignment_id, dataset), timeout_s):
        target = ub if message.part == "Ub" else v if message.part == "V" else None
        if target is None:
            raise PeerError(f"party B sent an alignment part {message.part!r}")
        target += split_points(message.points, f"party B's {message.part}")
    if len(ub) != len(u):
        raise PeerError(f"party B answered {len(ub)} points of U^b for the {len(u)} of U")
    return ub, v


def align(
    workdir: Path, datasets: dict[str, str], dataset: str, alignment_id: str, label_party: LabelPartyClient,
    pad_to: int | None, timeout_s: float, report: Callable[[str], None] = lambda message: None,
) -> AlignmentReport:
    """The whole alignment, from A's store named ``dataset`` to the aligned graph ``alignment_id``."""
    started = time.monotonic()
    check_alignment_id(alignment_id)
    if (alignment_dir(workdir, alignment_id) / ALIGNMENT_FILE).exists():
        raise ValueError(f"party A already holds an alignment {alignment_id!r}: choose another id")
    store = resolve_store(dataset, datasets, "nodes.parquet", "party-a")
    keys = read_node_keys(store).to_pylist()
    report(f"blinding {len(keys)} keys")
    blinder, u, owner = blinded_nodes(keys, alignment_id, pad_to)
    report(f"exchanging {len(u)} blinded keys with party B")
    ub, v = exchange(label_party, alignment_id, dataset, u, timeout_s)
    try:
        va = blinder.blind_points(v, "party B's blinded keys")
    except PsiError as exc:
        raise PeerError(str(exc)) from None
    del blinder
    matched = [p for p in matches(ub, va) if owner[p] >= 0]
    shared = [owner[p] for p in sorted(matched, key=lambda p: ub[p])]  # the shared index, as B sorts it
    summary = label_party.align_finish(_chunks("Va", va, alignment_id), timeout_s)
    if summary.size != len(shared):
        raise PeerError(f"party B counts {summary.size} keys in the intersection, party A {len(shared)}: not aligned")
    report(f"{len(shared)} keys in the intersection; writing the aligned graph")
    write_aligned_graph(workdir, alignment_id, dataset, store, np.asarray(shared, dtype=np.int64))
    return AlignmentReport(
        alignment_id=alignment_id, dataset=dataset, size=len(shared), seconds=round(time.monotonic() - started, 3)
    )


def renumbering(num_nodes: int, shared: np.ndarray) -> np.ndarray:
    """new_of[old]: shared index j becomes node j, every other node follows in A's order."""
    rest = np.setdiff1d(np.arange(num_nodes, dtype=np.int64), shared, assume_unique=False)
    order = np.concatenate([shared, rest])  # order[new] = old
    new_of = np.empty(num_nodes, dtype=np.int64)
    new_of[order] = np.arange(num_nodes, dtype=np.int64)
    return new_of


def write_aligned_graph(workdir: Path, alignment_id: str, dataset: str, store: Path, shared: np.ndarray) -> None:
    """A's graph renumbered (``renumbering``), streamed chunk by chunk, then its alignment.json."""
    edges = _npz_member(store / GRAPH_FILE, "edges")
    features = _npz_member(store / GRAPH_FILE, "node_features")
    num_nodes = features.shape[0]
    new_of = renumbering(num_nodes, shared)
    order = np.argsort(new_of)
    final = alignment_dir(workdir, alignment_id)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)  # a crashed earlier attempt
    tmp.mkdir(parents=True)
    renamed = np.lib.format.open_memmap(tmp / "edges.npy", mode="w+", dtype=np.int64, shape=edges.shape)
    for start in range(0, edges.shape[0], EDGE_CHUNK):
        renamed[start : start + EDGE_CHUNK] = new_of[np.asarray(edges[start : start + EDGE_CHUNK])]
    moved = np.lib.format.open_memmap(tmp / "features.npy", mode="w+", dtype=np.float32, shape=features.shape)
    rows = max(1, (1 << 25) // max(1, features.shape[1] * 4))
    for start in range(0, num_nodes, rows):
        moved[start : start + rows] = features[order[start : start + rows]]
    write_graph_npz(tmp / GRAPH_FILE, renamed, moved)
    del renamed, moved
    (tmp / "edges.npy").unlink()
    (tmp / "features.npy").unlink()
    (tmp / ALIGNMENT_FILE).write_text(json.dumps({
        "alignment_id": alignment_id, "dataset": dataset, "store": str(store), "size": int(shared.size),
        "nodes": int(num_nodes), "created": time.time(),
    }, indent=2) + "\n")
    tmp.rename(final)
