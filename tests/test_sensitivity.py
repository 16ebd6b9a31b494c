"""Empirical sensitivity: the releases on neighbouring graphs never differ by more than
the accountant charges (privacy contract, "Every extractor must", 2), on random and
adversarial pairs, in every configuration of the degree projection; and the checker that
says so (tests/sensitivity_check.py) catches wrong claims.

The bounds' tightness: test_sensitivity_tightness.py; the formulas and the charge rule
alone: test_sensitivity_formulas.py. Derivations: docs/privacy.md, sections 3 and 4.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings, target
from sensitivity_check import Scenario, check_charge_rule, measure, read_graph
from sensitivity_pairs import ADVERSARIAL, _shared_displaced_scenario, extractor_for, inputs, scenarios

from vesper.party_a.extractors.pmp import PmpExtractor
from vesper.party_a.extractors.sensitivity import participation_bound
from vesper.party_a.graph_store import Graph, add_edge

# --------------------------------------------------------------------------------------
# The charged rules hold on random and adversarial pairs
# --------------------------------------------------------------------------------------


def checked_with_targets(scenario: Scenario) -> list[str]:
    """check_charge_rule, steering hypothesis towards pairs that come close to the bounds."""
    rule = scenario.rule()
    measured = measure(extractor_for(scenario), rule, scenario)
    if rule.step_sensitivity > 0:
        target(max(measured.step_distances) / rule.step_sensitivity, label="step distance / S_step")
    if 0 < rule.pass_cost < math.inf:
        target(measured.pass_distance / math.sqrt(rule.pass_cost), label="pass distance / charged")
    return measured.violations


@given(scenario=scenarios())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_extractor_stays_within_its_charge_rule(scenario: Scenario) -> None:
    assert checked_with_targets(scenario) == []


@given(scenario=scenarios(names=("pmp-gin", "pmp-gcn"), projected=True))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_projected_extractors_stay_within_their_charge_rule(scenario: Scenario) -> None:
    assert checked_with_targets(scenario) == []


def configuration(scenario: Scenario) -> str:
    """Which case of Lemma 4 the pair is on the projection (docs/privacy.md, 3.5)."""
    u, v = scenario.edge
    before, after = (read_graph(scenario, g) for g in (scenario.graph, add_edge(scenario.graph, u, v)))
    lost = {end: set(before.neighbours(end).tolist()) - set(after.neighbours(end).tolist()) for end in (u, v)}
    if v not in after.neighbours(u).tolist():
        return "removal" if lost[u] or lost[v] else "none"
    if lost[u] and lost[v]:
        return "T2" if lost[u] == lost[v] else "T1"
    return "T3" if lost[u] or lost[v] else "T4"


def projection_seeds(graph: Graph, edge: tuple[int, int], degree_bound: int) -> dict[str, int]:
    """The first projection seed that realises each configuration on this pair."""
    found: dict[str, int] = {}
    for seed in range(60):
        probe = Scenario("pmp-gin", graph, edge, torch.zeros(graph.num_nodes, 1), degree_bound=degree_bound, seed=seed)
        found.setdefault(configuration(probe), seed)
    return found


RAW_SETTINGS = [
    # (name, layers, fanout, d_min): the raw graph, sampled at the fanout (0 = all neighbours)
    ("mlp", 2, 0, 0),
    ("pmp-gin", 1, 3, 0), ("pmp-gin", 2, 3, 0),
    ("pmp-gcn", 1, 3, 1), ("pmp-gcn", 1, 0, 3), ("pmp-gcn", 2, 3, 2),
]


@pytest.mark.parametrize("setting", RAW_SETTINGS, ids=lambda s: "-".join(map(str, s)))
def test_adversarial_pairs_stay_within_the_charge_rule(setting) -> None:
    name, layers, fanout, d_min = setting
    rng = random.Random(0)
    for case, (graph, edge) in ADVERSARIAL.items():
        for seed, kind in enumerate(("endpoints-aligned", "groups", "aligned")):
            batch_size = (64, 1, 3)[seed] if graph.num_nodes <= 10 else (64, 8, 8)[seed]
            scenario = Scenario(
                name=name, graph=graph, edge=edge, inputs=inputs(kind, graph.num_nodes, rng, edge), layers=layers,
                fanout=fanout, d_min=d_min, batch_size=batch_size, seed=seed,
            )
            assert check_charge_rule(extractor_for(scenario), scenario.rule(), scenario) == [], (case, kind)


PROJECTED_SETTINGS = [
    # (name, layers, fanout, d_min, degree_bound)
    ("pmp-gin", 1, 0, 0, 3), ("pmp-gin", 2, 0, 0, 2),
    ("pmp-gcn", 1, 0, 1, 3), ("pmp-gcn", 1, 0, 3, 3), ("pmp-gcn", 2, 5, 2, 3),
]


@pytest.mark.parametrize("setting", [
    # one setting in make test; the sweep over the others (~60 s) in make test-slow
    s if i == 0 else pytest.param(s, marks=pytest.mark.slow) for i, s in enumerate(PROJECTED_SETTINGS)
], ids=lambda s: "-".join(map(str, s)))
def test_adversarial_pairs_in_every_configuration_stay_within_the_charge_rule(setting) -> None:
    """Every configuration T1-T4 (and e kept by one endpoint) that each pair admits."""
    name, layers, fanout, d_min, degree_bound = setting
    rng = random.Random(0)
    seen = set()
    for case, (graph, edge) in ADVERSARIAL.items():
        for config, seed in projection_seeds(graph, edge, degree_bound).items():
            seen.add(config)
            for kind, batch_size in (("endpoints-aligned", 64), ("groups", 2)):
                scenario = Scenario(
                    name=name, graph=graph, edge=edge, inputs=inputs(kind, graph.num_nodes, rng, edge), layers=layers,
                    fanout=fanout, d_min=d_min, degree_bound=degree_bound, batch_size=batch_size, seed=seed,
                )
                assert check_charge_rule(extractor_for(scenario), scenario.rule(), scenario) == [], (case, config, kind)
    assert {"T1", "T2", "T3", "T4", "removal"} <= seen


# --------------------------------------------------------------------------------------
# The checker catches wrong claims
# --------------------------------------------------------------------------------------


def test_a_rule_without_the_swap_factor_is_caught() -> None:
    """PMP-GIN charged √2 per layer (Proposition 1, no swaps) fails on the projection."""
    scenario = _shared_displaced_scenario("pmp-gin", 1)
    honest = scenario.rule()
    wrong = replace(honest, sensitivity=math.sqrt(2), step_sensitivity=math.sqrt(2))
    assert check_charge_rule(extractor_for(scenario), honest, scenario) == []
    violations = check_charge_rule(extractor_for(scenario), wrong, scenario)
    assert any(v.startswith("(i)") for v in violations) and any(v.startswith("(ii)") for v in violations)


def test_a_rule_of_one_is_found_by_search() -> None:
    """Claiming S = 1 for PMP-GIN: hypothesis finds a pair that breaks it."""

    def breaks(scenario: Scenario) -> bool:
        wrong = replace(scenario.rule(), sensitivity=1.0, step_sensitivity=1.0)
        return bool(check_charge_rule(extractor_for(scenario), wrong, scenario))

    search = settings(max_examples=200, database=None, phases=[Phase.generate])  # no shrinking: any pair will do
    found = find(scenarios(names=("pmp-gin",)), breaks, settings=search)
    assert breaks(found)


def test_the_raw_graph_participation_bound_is_caught_on_the_projection() -> None:
    """N_e = 2 (no projection, L = 1) is wrong for P(G): u' and v' change too."""
    graph, edge = ADVERSARIAL["degree exactly 3 at both ends"]
    for seed in range(200):
        scenario = Scenario(
            "pmp-gin", graph, edge, inputs("groups", graph.num_nodes, random.Random(seed), edge),
            degree_bound=3, batch_size=1, seed=seed,
        )
        rule = scenario.rule()
        wrong = replace(rule, edge_reach=participation_bound("pmp-gin", 1, 3), participation_bound=2, form="per-step")
        wrong = replace(wrong, sensitivity=wrong.step_sensitivity)
        if any(v.startswith("(iii)") for v in check_charge_rule(extractor_for(scenario), wrong, scenario)):
            assert check_charge_rule(extractor_for(scenario), rule, scenario) == []
            return
    raise AssertionError("no seed displaced an edge at both endpoints")


def test_a_per_step_sensitivity_charged_once_per_pass_is_caught() -> None:
    """L = 2 on P(G): charging S_step once per pass ignores recomputation at every root nearby."""
    scenario = _shared_displaced_scenario("pmp-gin", 2)
    rule = scenario.rule()
    assert rule.form == "per-pass"
    wrong = replace(rule, sensitivity=rule.step_sensitivity)
    violations = check_charge_rule(extractor_for(scenario), wrong, scenario)
    assert any(v.startswith("(ii)") for v in violations)


class DegreeLeakingGin(PmpExtractor):
    """Test-only: PMP-GIN that also adds the raw degree to each aggregate (not a sum of messages)."""

    def aggregate(self, block, h_src, *args, **kwargs):
        out = super().aggregate(block, h_src, *args, **kwargs)
        degree = torch.bincount(block.edge_dst, minlength=block.dst_count).to(out.dtype)
        return out + degree[:, None]


def test_an_extractor_that_breaks_its_rule_is_caught() -> None:
    graph, edge = ADVERSARIAL["two hubs"]
    for seed in range(50):
        scenario = Scenario("pmp-gin", graph, edge, inputs("aligned", graph.num_nodes, random.Random(0), edge), degree_bound=3, seed=seed)
        if set(read_graph(scenario, graph).neighbours(0).tolist()) <= set(read_graph(scenario, add_edge(graph, *edge)).neighbours(0).tolist()):
            continue  # nothing displaced at u*: the projected degrees do not move
        assert check_charge_rule(extractor_for(scenario), scenario.rule(), scenario) == []
        assert any(v.startswith("(i)") for v in check_charge_rule(extractor_for(scenario, DegreeLeakingGin), scenario.rule(), scenario))
        return
    raise AssertionError("no projection seed displaced an edge")
