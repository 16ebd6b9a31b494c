"""Shared fixtures. End-to-end tests start real services; see test_e2e_*.py."""

from __future__ import annotations

import random

import pytest
import torch

from vesper.party_a.graph_store import Graph, build_graph


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
