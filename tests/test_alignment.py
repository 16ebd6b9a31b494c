"""Private id alignment (docs/alignment.md): the PSI's steps, and `vesper align` through the services.

The parties' key sets overlap in part: keys only A has, keys only B has. The alignment must
find exactly the plain intersection, both parties must agree on the shared index, party A's
renumbered graph must put each shared key's node at its index, and neither service's files,
logs or replies may hold the other side's keys outside the intersection.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import rbcl
from customers import A_ONLY, B_ONLY, SHARED, customers_cluster
from rich.console import Console

from vesper.common.dataset_files import load_graph_part, load_label_part
from vesper.common.psi import (
    Blinder,
    PsiError,
    hash_keys,
    matches,
    padded_size,
    random_points,
    secret_shuffle,
    split_points,
)
from vesper.party_a.alignment import renumbering

QUIET = Console(file=io.StringIO())

# -- the steps ---------------------------------------------------------------------------------


def test_blinding_commutes_so_both_sides_reach_the_same_double_blinded_values() -> None:
    a, b = Blinder(), Blinder()
    keys = ["alice", "bob", "007", ""]
    from_a = b.blind_points(a.blind_keys(keys, b"ctx"), "U")
    from_b = a.blind_points(b.blind_keys(keys, b"ctx"), "V")
    assert from_a == from_b and len(set(from_a)) == len(keys)


def test_the_hash_depends_on_the_alignment_and_the_key() -> None:
    assert hash_keys(["k"], b"one") == hash_keys(["k"], b"one")
    assert hash_keys(["k"], b"one") != hash_keys(["k"], b"two")
    assert hash_keys(["k1"], b"one") != hash_keys(["k2"], b"one")
    assert all(rbcl.crypto_core_ristretto255_is_valid_point(p) for p in hash_keys(["x", "y"], b"c"))


def test_matches_finds_the_intersection_and_padding_matches_nothing() -> None:
    a, b = Blinder(), Blinder()
    mine = ["k1", "k2", "k3", "k4"]
    theirs = ["k3", "k9", "k1"]
    u = a.blind_keys(mine, b"c") + random_points(4)
    ub = b.blind_points(u, "U")
    va = a.blind_points(b.blind_keys(theirs, b"c") + random_points(5), "V")
    assert matches(ub, va) == [0, 2]


def test_points_from_the_other_party_are_checked() -> None:
    invalid = bytes([0xFF] * 32)  # not a canonical encoding
    with pytest.raises(PsiError, match="element 1 is not a valid Ristretto255 point"):
        Blinder().blind_points([random_points(1)[0], invalid], "U")
    with pytest.raises(PsiError, match="not a whole number of 32-byte points"):
        split_points(b"x" * 33, "U")


def test_padding_hides_the_count_to_within_a_factor_of_two_or_to_a_declared_bound() -> None:
    assert [padded_size(n, None) for n in (1, 2, 3, 1000, 1024, 1025)] == [1, 2, 4, 1024, 1024, 2048]
    assert padded_size(10, 64) == 64
    with pytest.raises(ValueError, match="below the 10 keys"):
        padded_size(10, 5)
    order = secret_shuffle(50)
    assert sorted(order) == list(range(50))


def test_renumbering_puts_the_shared_index_first_and_keeps_the_rest_in_order() -> None:
    new_of = renumbering(6, np.array([4, 1]))
    assert new_of.tolist() == [2, 1, 3, 4, 0, 5]


# -- through the services ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    with customers_cluster(tmp_path_factory.mktemp("alignment")) as (cluster, report, facts):
        yield cluster, report, facts


def _everything_under(root: Path) -> bytes:
    return b"".join(path.read_bytes() for path in root.rglob("*") if path.is_file())


def _logs(cluster, name: str) -> bytes:
    logs = cluster.workdir / "logs"
    return b"".join(path.read_bytes() for path in logs.glob(f"{name}*")) if logs.is_dir() else b""




def test_the_alignment_finds_exactly_the_plain_intersection(aligned) -> None:
    cluster, report, _ = aligned
    shared = set(SHARED)  # A holds SHARED + A_ONLY, B holds SHARED + B_ONLY
    assert report["alignment_id"] == "customers-aligned" and report["size"] == len(shared)
    b_dir = cluster.workdir / "party_b" / "alignments" / "customers-aligned"
    assert set(pq.read_table(b_dir / "keys.parquet").column("key").to_pylist()) == shared
    unmatched = (b_dir / "unmatched_keys.csv").read_text().split()
    assert unmatched[0] == "key" and sorted(unmatched[1:]) == sorted(B_ONLY)
    assert json.loads((b_dir / "alignment.json").read_text())["unmatched_keys"] == len(B_ONLY)


def test_both_parties_agree_on_the_shared_index(aligned) -> None:
    """Shared index j is the same customer at A (its node j) and at B (its row j)."""
    cluster, report, facts = aligned
    b_dir = cluster.workdir / "party_b" / "alignments" / "customers-aligned"
    a_dir = cluster.workdir / "party_a" / "alignments" / "customers-aligned"
    keys = pq.read_table(b_dir / "keys.parquet").column("key").to_pylist()
    graph = load_graph_part(a_dir / "graph.npz")
    assert graph.num_nodes == len(SHARED) + len(A_ONLY)  # A's other nodes stay, as neighbours
    expected = np.array([facts["features"][key] for key in keys], dtype=np.float32)
    np.testing.assert_allclose(graph.features[: len(keys)], expected, atol=1e-5)
    labels = load_label_part(b_dir / "labels.npz")
    assert labels.labels.shape == (len(keys),)
    labelled = [key in facts["splits"] for key in keys]
    assert (labels.labels >= 0).tolist() == labelled  # SHARED[50:] are B's customers to score
    assert labels.masks is not None
    for code, split in enumerate(("train", "val", "test")):
        assert labels.masks[code][0].tolist() == [facts["splits"].get(key) == split for key in keys]


def _everything_under(root: Path) -> bytes:
    return b"".join(path.read_bytes() for path in root.rglob("*") if path.is_file())


def _logs(cluster, name: str) -> bytes:
    logs = cluster.workdir / "logs"
    return b"".join(path.read_bytes() for path in logs.glob(f"{name}*")) if logs.is_dir() else b""


def test_neither_party_keeps_or_logs_the_other_sides_keys_outside_the_intersection(aligned) -> None:
    cluster, report, _ = aligned
    held_by_a = _everything_under(cluster.workdir / "party_a") + _logs(cluster, "party-a")
    held_by_b = _everything_under(cluster.workdir / "party_b") + _logs(cluster, "party-b")
    assert held_by_a and held_by_b
    assert not [key for key in B_ONLY if key.encode() in held_by_a]
    assert not [key for key in A_ONLY if key.encode() in held_by_b]
    assert not [key for key in A_ONLY + B_ONLY if key in json.dumps(report)]


def test_an_alignment_id_is_not_reused(aligned) -> None:
    from vesper.coordinator.run_client import RunClientError
    from vesper.coordinator.serving_client import align

    cluster, report, _ = aligned
    before = _everything_under(cluster.workdir / "party_b" / "alignments")
    with pytest.raises(RunClientError, match="already holds an alignment 'customers-aligned'"):
        align(cluster.party_a_address, "customers", "customers-aligned", QUIET)
    assert _everything_under(cluster.workdir / "party_b" / "alignments") == before
