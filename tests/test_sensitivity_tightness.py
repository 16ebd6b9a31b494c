"""Tightness of the sensitivity bounds: the production extractors attain them where
docs/privacy.md says the derivation is tight (the checker: tests/sensitivity_check.py)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch
from sensitivity_check import Scenario, measure, read_graph
from sensitivity_pairs import ADVERSARIAL, DIM, _graph, _shared_displaced_scenario, extractor_for, inputs

from vesper.party_a.extractors.sensitivity import (
    gcn_layer_sensitivity,
    gin_layer_sensitivity,
    projected_layer_sensitivity,
)
from vesper.party_a.graph_store import add_edge

# --------------------------------------------------------------------------------------
# Tightness: the bounds are attained where docs/privacy.md says so
# --------------------------------------------------------------------------------------


def test_projected_gin_attains_eight_per_layer_and_8d_plus_20_per_pass() -> None:
    """Eq. J4: S² = 8 per layer (T2, h_u* = h_v* ⊥ h_w); eq. R3 for L = 2, D = 3: 8D + 20 = 44."""
    one = replace(_shared_displaced_scenario("pmp-gin", 1), batch_size=64)  # one step, every node
    measured = measure(extractor_for(one), one.rule(), one)
    assert one.rule().step_sensitivity == pytest.approx(math.sqrt(8))
    assert measured.step_distances == [pytest.approx(math.sqrt(8), abs=1e-5)]
    assert measured.pass_distance == pytest.approx(one.rule().sensitivity, abs=1e-5)
    two = _shared_displaced_scenario("pmp-gin", 2)
    # the pass bound needs every root near u*, v*, w to be its own step, and the
    # neighbourhoods at their maximum: u*, v*, w have degree D = 3 in P(G')
    measured = measure(extractor_for(two), two.rule(), two)
    assert two.rule().sensitivity == pytest.approx(math.sqrt(8 * 3 + 20))
    assert measured.pass_distance == pytest.approx(math.sqrt(8 * 3 + 20), abs=1e-4)


def test_the_projected_participation_bounds_are_reached() -> None:
    """Eq. N3 at D = 3: GIN reaches 4 roots at L = 1 and 4D = 12 at L = 2; GCN 2D + 2 = 8 at L = 1."""
    graph, edge = ADVERSARIAL["full neighbourhoods at D = 3"]
    h = inputs("random", graph.num_nodes, random.Random(0), edge)
    for seed in range(200):
        scenario = Scenario("pmp-gin", graph, edge, h, degree_bound=3, batch_size=5, seed=seed)
        before, after = (read_graph(scenario, g) for g in (graph, add_edge(graph, *edge)))
        if 2 not in after.neighbours(0).tolist() and 3 not in after.neighbours(1).tolist() and 1 in after.neighbours(0).tolist():
            break
    else:
        raise AssertionError("no projection seed displaced (0, 2) and (1, 3)")
    for name, layers, reach in (("pmp-gin", 1, 4), ("pmp-gin", 2, 12), ("pmp-gcn", 1, 8)):
        s = replace(scenario, name=name, layers=layers)
        assert s.rule().edge_reach == reach
        assert measure(extractor_for(s), s.rule(), s).changed_roots == reach


def test_projected_gcn_attains_one_and_a_half_per_layer() -> None:
    """Truncated PMP-GCN, D_min ≤ 1, on P(G): S² = 3/2 (T2 with u*, v* of degree 1, w of degree 2).

    u* and v* have a second edge each, to a hub that does not keep it, so that they
    hold D = 2 edges but projected degree 1.
    """
    # u*=0, v*=1, w=2; hub 3 with leaves 4..9 (the hub keeps only 2 of its edges)
    edges = [(0, 2), (1, 2), (0, 3), (1, 3)] + [(3, leaf) for leaf in range(4, 10)]
    graph = _graph(10, edges)
    h = torch.zeros(10, DIM)
    h[:, 2] = 1.0
    h[[0, 1], 0], h[[0, 1], 2] = 1.0, 0.0
    h[2, 1], h[2, 2] = 1.0, 0.0
    for seed in range(2000):
        scenario = Scenario("pmp-gcn", graph, (0, 1), h, d_min=1, degree_bound=2, batch_size=64, seed=seed)
        before, after = (read_graph(scenario, g) for g in (graph, add_edge(graph, 0, 1)))
        if before.neighbours(0).tolist() == [2] and before.neighbours(1).tolist() == [2] and after.neighbours(2).numel() == 0:
            measured = measure(extractor_for(scenario), scenario.rule(), scenario)
            assert measured.step_distances[0] == pytest.approx(math.sqrt(1.5), abs=1e-5)
            assert projected_layer_sensitivity("pmp-gcn", 2, 1) == pytest.approx(math.sqrt(1.5))
            return
    raise AssertionError("no projection seed realises the configuration")


def _raw_scenario(case: str, name: str, fanout: int, d_min: int, kind: str, seed: int = 0) -> Scenario:
    graph, edge = ADVERSARIAL[case]
    h = inputs(kind, graph.num_nodes, random.Random(0), edge) if kind != "one-hot" else torch.eye(graph.num_nodes)
    return Scenario(name, graph, edge, h, fanout=fanout, d_min=d_min, batch_size=64, seed=seed)


def test_raw_graph_bounds_are_attained_where_the_derivation_is_tight() -> None:
    """Eq. G0 (2 with swaps, √2 without) and eq. G6 at D_min ≤ 1 (1/√2)."""
    # one-hot inputs, so a swap costs √2; both hubs swap for some sampling seeds
    worst = 0.0
    for seed in range(300):
        s = _raw_scenario("two hubs", "pmp-gin", 5, 0, "one-hot", seed)
        worst = max(worst, measure(extractor_for(s), s.rule(), s).step_distances[0])
        if worst >= gin_layer_sensitivity(5) - 1e-5:
            break
    assert worst == pytest.approx(gin_layer_sensitivity(5), abs=1e-5)
    s = _raw_scenario("both isolated", "pmp-gin", 0, 0, "aligned")
    assert measure(extractor_for(s), s.rule(), s).step_distances[0] == pytest.approx(gin_layer_sensitivity(0), abs=1e-6)
    for d_min in (0, 1):
        s = _raw_scenario("both isolated", "pmp-gcn", 5, d_min, "aligned")
        assert measure(extractor_for(s), s.rule(), s).step_distances[0] == pytest.approx(gcn_layer_sensitivity(5, d_min), abs=1e-6)


def test_truncation_raises_the_honest_sensitivity() -> None:
    """At the D_min boundary an aggregate jumps from 0 to a full GCN sum (docs/privacy.md, 3.3)."""
    values = [gcn_layer_sensitivity(10, d_min) for d_min in (1, 2, 3, 5, 10)]
    assert values == sorted(values) and values[-1] > 3 * values[0]
    s = _raw_scenario("D_min boundary star", "pmp-gcn", 10, 4, "aligned")
    crossing = measure(extractor_for(s), s.rule(), s).step_distances[0]
    assert crossing > gcn_layer_sensitivity(10, 1)  # the boundary alone exceeds the untruncated bound
