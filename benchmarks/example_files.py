"""``vesper data example``: the two institutions' own files, made from the bundled Cora graph.

What a platform and a bank might export before ``vesper data import``:

* ``party_a/edges.csv`` (``src,dst``: every edge row of Cora's file, so each undirected edge
  appears once or twice, either way round) and ``party_a/features.csv`` (``id`` and the
  features ``f0..``), keyed by opaque customer ids ``cust-<6 hex digits>``;
* ``party_b/labels.csv`` (``id,label``, the class *names* of Cora's seven topics): labels for
  80 % of A's nodes, 10 % of B's rows left empty (customers B holds but has not labelled, to
  be scored), and 200 keys A does not have (most of them labelled), rows shuffled.

The same ``seed`` writes the same files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
from pydantic import BaseModel

from vesper.common.dataset_files import load_graph_part, load_label_part, resolve_dataset
from vesper.common.store_directory import check_output_directory

CORA_CLASSES = (
    "Case_Based", "Genetic_Algorithms", "Neural_Networks", "Probabilistic_Methods",
    "Reinforcement_Learning", "Rule_Learning", "Theory",
)
B_SHARE = 0.8  # of A's nodes whose keys B holds
EMPTY_SHARE = 0.1  # of B's rows with an empty label
EXTRA_KEYS = 200  # B's keys that A does not have


class ExampleFiles(BaseModel):
    edges: Path
    features: Path
    labels: Path
    nodes: int
    edge_rows: int
    b_rows: int
    b_unlabelled: int
    b_only: int


def write_example(out: Path, seed: int = 0) -> ExampleFiles:
    """Write the example files under ``out`` (refused if it exists and is not empty)."""
    out = Path(out)
    check_output_directory(out)
    cora = resolve_dataset("cora")
    graph, labels = load_graph_part(cora), load_label_part(cora).labels
    rng = np.random.default_rng(seed)
    n = graph.num_nodes
    codes = rng.choice(16**6, size=n + EXTRA_KEYS, replace=False)
    keys = np.array([f"cust-{code:06x}" for code in codes])
    (out / "party_a").mkdir(parents=True, exist_ok=True)
    (out / "party_b").mkdir(parents=True, exist_ok=True)
    files = ExampleFiles(
        edges=out / "party_a" / "edges.csv", features=out / "party_a" / "features.csv",
        labels=out / "party_b" / "labels.csv", nodes=n, edge_rows=int(graph.edges.shape[0]), b_rows=0,
        b_unlabelled=0, b_only=EXTRA_KEYS,
    )
    edges = keys[graph.edges]
    plain = pcsv.WriteOptions(quoting_style="none")  # keys, numbers and topic names: nothing to quote
    pcsv.write_csv(pa.table({"src": edges[:, 0], "dst": edges[:, 1]}), files.edges, plain)
    features = graph.features
    if np.array_equal(features, np.round(features)):
        features = features.astype(np.int64)  # Cora's 0/1 words, written as 0 and 1
    columns = {"id": pa.array(keys[:n])}
    columns.update({f"f{j}": pa.array(features[:, j]) for j in range(features.shape[1])})
    pcsv.write_csv(pa.table(columns), files.features, plain)
    held = rng.permutation(n)[: int(round(B_SHARE * n))]
    b_keys = np.concatenate([keys[held], keys[n:]])
    b_classes = np.concatenate([labels[held], rng.choice(labels, size=EXTRA_KEYS)])
    order = rng.permutation(b_keys.size)
    b_keys, b_classes = b_keys[order], b_classes[order]
    empty = rng.random(b_keys.size) < EMPTY_SHARE
    names = pa.array([None if blank else CORA_CLASSES[c] for c, blank in zip(b_classes, empty)], pa.string())
    pcsv.write_csv(pa.table({"id": pa.array(b_keys), "label": names}), files.labels, plain)
    return files.model_copy(update={"b_rows": int(b_keys.size), "b_unlabelled": int(empty.sum())})
