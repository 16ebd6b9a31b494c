"""Nothing public is an exact statistic of A's graph (docs/privacy.md, section 1).

Under add/remove-one-edge neighbours |E| has sensitivity 1, so an exact |E| (or 1/|E| as δ,
or a rate b/|E|) in anything B or the public can read decides the edge in question. The
services run here on a graph whose |E|, maximum degree and number of non-isolated nodes
are distinctive numbers, train several extractors through ``vesper train``, and scan every
record the runs produce: the coordinator's output (progress and summary), the JSON
summaries, the REST status and ledger of every run, ``vesper status``, the ledger file
itself, the services' logs and what party B keeps.
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
from pathlib import Path

import httpx
import numpy as np
import pytest
from e2e import vesper

from vesper.common.config import RunSummary
from vesper.coordinator.processes import LocalCluster

pytestmark = pytest.mark.e2e

NODES, EDGES, HUB_DEGREE, NON_ISOLATED = 1200, 7919, 311, 1187
BATCH = 512  # relational's expected_batch: q = b / |E| would be 0.0646546...


def statistics_graph(path: Path) -> Path:
    """A graph with exactly EDGES undirected edges, one hub of degree HUB_DEGREE (the maximum)
    and NON_ISOLATED nodes with an edge; the rest isolated; 3 classes, a 50/25/25 split."""
    rng = random.Random(7)
    edges = {(0, v) for v in range(1, HUB_DEGREE + 1)}
    for v in range(HUB_DEGREE + 1, NON_ISOLATED):  # every other connected node gets an edge
        edges.add((rng.randrange(1, v), v))
    while len(edges) < EDGES:
        u, v = sorted(rng.sample(range(1, NON_ISOLATED), 2))
        edges.add((u, v))
    degree = np.bincount(np.array(sorted(edges)).reshape(-1), minlength=NODES)
    assert degree.max() == HUB_DEGREE == degree[0] and (degree > 0).sum() == NON_ISOLATED
    features = np.random.default_rng(0).random((NODES, 16), dtype=np.float32)
    labels = np.random.default_rng(1).integers(0, 3, NODES)
    order = np.random.default_rng(2).permutation(NODES)
    masks = [np.zeros((1, NODES), dtype=bool) for _ in range(3)]
    for mask, part in zip(masks, np.split(order, [NODES // 2, 3 * NODES // 4]), strict=True):
        mask[0, part] = True
    np.savez(path, node_features=features, node_labels=labels, edges=np.array(sorted(edges)),
             train_masks=masks[0], val_masks=masks[1], test_masks=masks[2])
    return path


# every exact statistic of the graph above, as an integer (with or without thousands separators)
COUNTS = {"|E|": EDGES, "2|E| (CSR slots)": 2 * EDGES, "the maximum degree": HUB_DEGREE,
          "the non-isolated nodes": NON_ISOLATED}
# and |E| inside a rate: any number within 0.5 % of c/|E| (δ = 1/|E|, q = b/|E|), however rounded
RATES = {"1/|E|": 1.0, "b/|E|": float(BATCH)}
_INTEGER = re.compile(r"(?<![\d.,])\d{1,3}(?:,\d{3})+(?![\d,])|(?<![\d.])\d+(?![\d.])")
_FLOAT = re.compile(r"(?<![\w.])\d*\.\d+(?:[eE][-+]?\d+)?|(?<![\w.])\d+[eE][-+]?\d+")
# a digest or an identifier (a hex word of 8 or more characters, one a letter) is not a count:
# B's receipt log holds a sha256 per release, and "…e311f…" inside one is not the maximum degree
_HEX_WORD = re.compile(r"(?<![0-9A-Za-z])(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}(?![0-9A-Za-z])")


def leaks(text: str) -> list[str]:
    text = _HEX_WORD.sub(" ", text)
    integers = {int(token.replace(",", "")) for token in _INTEGER.findall(text)}
    floats = [float(token) for token in _FLOAT.findall(text)]
    found = [name for name, count in COUNTS.items() if count in integers]
    for name, numerator in RATES.items():
        if any(value > 0 and abs(value * EDGES / numerator - 1) < 0.005 for value in floats):
            found.append(name)
    return found


def test_the_scanner_finds_each_statistic() -> None:
    """The scan can fail: every statistic, printed the usual ways, is found."""
    assert leaks(f"{EDGES} edges") == ["|E|"] and leaks(f"{EDGES:,} edges") == ["|E|"]
    assert leaks(f'"max_degree": {HUB_DEGREE}') == ["the maximum degree"]
    assert leaks(json.dumps({"delta": 1 / EDGES})) == ["1/|E|"]
    assert leaks(f"at δ={1 / EDGES:.3g}") == ["1/|E|"]
    assert leaks(f"q = {BATCH / EDGES:.4g}") == ["b/|E|"]
    assert leaks(RunSummary(
        run_id="x", status="completed", dataset="d", extractor="e", decoder="concat", accounting="visible-batch",
        epsilon_budget=1.0, epsilon_spent=1.0, delta=1 / EDGES,
    ).model_dump_json()) == ["1/|E|"]
    assert leaks("loss 0.3114, ε 0.311, 7919.5 s") == []  # digits inside other numbers are not counts
    digest = "9c4e311f" + "0" * 56  # a sha256 with the maximum degree's digits inside it
    assert leaks(json.dumps({"sha256": digest})) == [] and leaks(f"{digest} 311") == ["the maximum degree"]


RUNS = {
    "pmp-gcn": ("--extractor", "pmp-gcn"),
    "relational-gap": (
        "--extractor", "relational-gap", "--edge-bound", "20000", "--param", "pretrain_steps=2",
        "--param", f"expected_batch={BATCH}", "--param", "encoder_epochs=1",
        "--edge-free-path-epochs", "1",  # the path's own stage (scanned too), 1 epoch of the 49 it would train
    ),
    "heterpoisson": ("--extractor", "heterpoisson", "--batch-size", "300"),
    "dpar-edge": ("--extractor", "dpar-edge", "--edge-free-path-epochs", "1"),
}


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> dict[str, str]:
    """Every record of four runs on the statistics graph, by where it was read."""
    workdir = tmp_path_factory.mktemp("public-records")
    dataset = statistics_graph(workdir / "stats.npz")
    found: dict[str, str] = {}
    with LocalCluster(workdir, datasets={"stats": str(dataset)}, party_b={"receipt_log": str(workdir / "receipts.jsonl")}) as cluster:
        for name, flags in RUNS.items():
            out = workdir / f"{name}.json"
            code, output = vesper(
                "train", "--party-a", cluster.party_a_address, "--dataset", "stats", "--epochs", "1",
                "--epsilon", "4", "--seed", "1", *flags, "--json-out", str(out),
            )
            assert code == 0, output
            summary = json.loads(out.read_text())
            run_id = summary["run_id"]
            found[f"{name}: vesper train output"] = output
            found[f"{name}: summary"] = out.read_text()
            for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/ledger"):
                found[f"{name}: GET {path}"] = httpx.get(f"{cluster.status_url}{path}", timeout=10).text
            found[f"{name}: vesper status"] = vesper("status", run_id, "--url", cluster.status_url)[1]
        found["GET /v1/runs"] = httpx.get(f"{cluster.status_url}/v1/runs", timeout=10).text
        with sqlite3.connect(f"file:{cluster.ledger}?mode=ro", uri=True) as ledger:
            found["the ledger file"] = "\n".join(ledger.iterdump())
    for log in sorted((workdir / "logs").glob("*.log")):
        found[f"log {log.name}"] = log.read_text(errors="replace")
    found["B's receipt log"] = (workdir / "receipts.jsonl").read_text()
    for kept in sorted((workdir / "party_b").rglob("*")):
        if kept.is_file() and kept.suffix in (".json", ".jsonl", ".txt", ".log"):
            found[f"party B keeps {kept.relative_to(workdir)}"] = kept.read_text(errors="replace")
    for summary in sorted((workdir / "party_a").rglob("summary.json")):
        found[f"party A's {summary.relative_to(workdir)}"] = summary.read_text()
    return found


def test_no_record_of_a_run_carries_an_exact_statistic_of_the_graph(records: dict[str, str]) -> None:
    assert len(records) > 4 * 5  # every run was read, from every place
    found = {where: leaks(text) for where, text in records.items() if leaks(text)}
    assert found == {}
