"""Shared fixtures. End-to-end tests start real services; see test_e2e_*.py."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from vesper.coordinator.processes import LocalCluster
from vesper.party_a.graph_store import Graph, build_graph


def small_dense_graph(path: Path) -> Path:
    """Write the 100-node dense synthetic graph (mean degree 4) to ``path`` and return it: small
    enough that an extractor's whole default schedule trains in seconds (one step per epoch)."""
    from vesper.benchmarks.synthetic import SyntheticSpec, generate, save_npz

    save_npz(generate(SyntheticSpec(num_nodes=100, profile="dense", mean_degree=4.0)), path)
    return path


def random_graph(rng: random.Random, n: int, p: float) -> Graph:
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    return build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), n)


@pytest.fixture
def rng() -> random.Random:
    return random.Random(1234)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny tensors: one torch thread avoids waiting on a pool that other jobs keep busy (and keeps
    float sums in one order). A module opts in with ``pytestmark = pytest.mark.usefixtures(...)``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The three services on loopback, started once for every end-to-end module that needs no
    settings of its own (starting and stopping a set costs 10-20 s on 2 cores). A module that
    needs other settings (datasets of its own, TLS, workers, a service it kills) defines its own
    ``cluster`` fixture, which takes precedence. What the shared one fixes:

    * both parties' ``secret_seed`` (A: 5, B: 9), so two runs of one config give the same numbers;
    * B's receipt log at ``cluster.workdir / "receipts.jsonl"`` (read it through
      ``e2e.receipts(path, run_id)``: other modules' runs are in it too);
    * B's ``max_label_epsilon`` = 6, for the label-privacy runs;
    * a dataset ``mismatch`` that is Cora at party A and a 100-node graph at party B: ids that
      are not aligned (test_e2e_bad_input).

    Every run has its own run id, ledger rows and files; a test reads only its own."""
    from vesper.common.dataset_files import resolve_dataset

    workdir = tmp_path_factory.mktemp("services")
    small = small_dense_graph(workdir / "small.npz")
    party_a = {"secret_seed": 5, "datasets": {"mismatch": str(resolve_dataset("cora"))}}
    party_b = {
        "receipt_log": str(workdir / "receipts.jsonl"), "secret_seed": 9, "max_label_epsilon": 6,
        "datasets": {"mismatch": str(small)},
    }
    with LocalCluster(workdir, party_a=party_a, party_b=party_b) as services:
        yield services
