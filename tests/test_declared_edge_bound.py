"""A generated graph's public edge bound, declared beside its file, reaches the runs on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vesper.benchmarks.utility_datasets import ensure_synthetic, synthetic_spec
from vesper.common.config import RunConfig
from vesper.coordinator.public_facts import PublicFactsError, public_facts_path, with_published_edge_bound


def test_the_benchmark_declares_the_generators_edge_count_and_runs_take_it_as_edge_bound(tmp_path: Path) -> None:
    path = ensure_synthetic(tmp_path, "synthetic-heterophilous", 300, set())
    asked = synthetic_spec("synthetic-heterophilous", 300).target_edges
    assert public_facts_path(path).is_file()
    edges = np.load(path)["edges"]
    assert 0 < edges.shape[0] <= asked  # a bound: the generator cuts its draws to M
    run = with_published_edge_bound(RunConfig.model_validate({"dataset": str(path), "extractor": {"name": "relational"}}))
    assert run.privacy.edge_bound == asked
    declared = RunConfig.model_validate({"dataset": str(path), "privacy": {"edge_bound": 10**6}})
    assert with_published_edge_bound(declared).privacy.edge_bound == 10**6  # the operator's own stays


def test_a_file_without_a_declaration_gets_no_bound_and_a_broken_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mine.npz"
    run = RunConfig.model_validate({"dataset": str(path)})
    assert with_published_edge_bound(run).privacy.edge_bound is None
    public_facts_path(path).write_text('{"edge_bound": -3}')
    with pytest.raises(PublicFactsError, match="mine.public.json does not declare"):
        with_published_edge_bound(run)
