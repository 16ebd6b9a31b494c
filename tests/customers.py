"""Two parties' own files for the serving tests: customers whose key sets overlap in part.

A holds SHARED + A_ONLY (shuffled) with features and random edges; B holds labels for
SHARED[:50] and B_ONLY (train/val/test by position) and unlabelled SHARED[50:], customers
to score. ``customers_cluster`` imports both, starts the three services and aligns them.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from vesper.party_a.graph_import import import_graph
from vesper.party_b.label_import import import_labels

QUIET = Console(file=io.StringIO())

A_ONLY = [f"only-a-{i}" for i in range(25)]
B_ONLY = [f"only-b-{i}" for i in range(12)]
SHARED = [f"cust-{i:03d}" for i in range(60)]


def stores(tmp: Path) -> tuple[Path, Path, dict]:
    """A's store (its keys: SHARED + A_ONLY, shuffled) and B's (SHARED[:50] labelled, 10 unlabelled, B_ONLY)."""
    rng = random.Random(0)
    a_keys = SHARED + A_ONLY
    rng.shuffle(a_keys)
    features = {key: [rng.gauss(0, 1) for _ in range(6)] for key in a_keys}
    (tmp / "a").mkdir()
    with (tmp / "a" / "features.csv").open("w") as handle:
        handle.write("id," + ",".join(f"f{j}" for j in range(6)) + "\n")
        for key in a_keys:
            handle.write(key + "," + ",".join(f"{v:.6f}" for v in features[key]) + "\n")
    with (tmp / "a" / "edges.csv").open("w") as handle:
        handle.write("src,dst\n")
        for _ in range(200):
            u, v = rng.sample(a_keys, 2)
            handle.write(f"{u},{v}\n")
    truth = {key: ("risky" if features[key][0] > 0 else "fine") for key in a_keys}
    splits = {}
    (tmp / "b").mkdir()
    with (tmp / "b" / "labels.csv").open("w") as handle:
        handle.write("id,label,split\n")
        for i, key in enumerate(SHARED[:50] + B_ONLY):
            split = ("train", "train", "val", "test")[i % 4]
            splits[key] = split
            handle.write(f"{key},{truth.get(key, rng.choice(['risky', 'fine']))},{split}\n")
        for key in SHARED[50:]:
            handle.write(f"{key},,\n")  # held by B, not labelled: a customer to score
    import_graph(tmp / "a" / "edges.csv", tmp / "a" / "features.csv", tmp / "a-store")
    import_labels(tmp / "b" / "labels.csv", tmp / "b-store")
    return tmp / "a-store", tmp / "b-store", {"features": features, "splits": splits}



@contextlib.contextmanager
def customers_cluster(tmp: Path) -> Iterator[tuple[object, dict, dict]]:
    """(the running LocalCluster, the alignment report, the facts of ``stores``), aligned as
    dataset ``customers-aligned``."""
    from vesper.coordinator.processes import LocalCluster
    from vesper.coordinator.serving_client import align

    a_store, b_store, facts = stores(tmp)
    cluster = LocalCluster(
        tmp / "cluster", party_a={"datasets": {"customers": str(a_store)}},
        party_b={"datasets": {"customers": str(b_store)}},
    )
    with cluster:
        report = json.loads(align(cluster.party_a_address, "customers", "customers-aligned", QUIET))
        yield cluster, report, facts
