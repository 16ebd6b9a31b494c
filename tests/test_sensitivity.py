"""Empirical sensitivity: the releases on neighbouring graphs never differ by more than
the accountant charges (privacy contract, "Every extractor must", 2).

``check_charge_rule`` runs the production code — the degree projection, the sampler
and ``PmpExtractor.noisy_aggregates`` / ``forward`` with the noise switched off — on G'
and G = G' + (u*, v*) with the same seeds, over one whole pass (a permutation of all
nodes split into batches), and compares the result with a claimed ``ChargeRule``:

  (i)   per step, the L2 distance of all pre-noise aggregates the step computes, over
        all layers, is at most the per-step sensitivity S_step;
  (ii)  over the pass, √(Σ_steps distance²) is at most what the rule charges per pass
        (N_e counted releases of S_step, or one release of S_pass);
  (iii) at most N_e roots see their released embedding change.

For (i) and (ii) every layer reads the same inputs H under both graphs: the analysis
conditions each layer on the (noisy, already released) previous layers, so the test
sets the extractor's post-processing to h^(l) = h^(l-1) (identity encoder and W_self,
aggregate gain 0) and feeds adversarial H directly. For (iii) the extractor runs with
random weights, so changes propagate through the layers as in training.
Derivations: docs/privacy.md, sections 3 and 4.
"""

from __future__ import annotations

import copy
import math
import random
from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings, target
from hypothesis import strategies as st

from vesper.common.config import ExtractorConfig
from vesper.party_a.degree_projection import project_degree
from vesper.party_a.encoder import GivenEncoding
from vesper.party_a.extractors.pmp import PmpExtractor
from vesper.party_a.extractors.sensitivity import (
    ChargeRule,
    charge_rule,
    gcn_layer_sensitivity,
    gin_layer_sensitivity,
    participation_bound,
    pass_sensitivity,
    projected_layer_sensitivity,
    step_sensitivity,
)
from vesper.party_a.graph_store import Graph, add_edge, build_graph
from vesper.party_a.sampler import NeighbourSampler, edgeless_subgraph

DIM = 6  # width of the layer inputs unless a scenario brings its own
TOLERANCE = 1e-4  # float32 sums of up to ~30 unit vectors


# --------------------------------------------------------------------------------------
# Scenarios: a neighbouring pair, the extractor's parameters, and the pass
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    graph: Graph  # G', without the edge
    edge: tuple[int, int]  # e = (u*, v*), added to make G
    inputs: torch.Tensor  # H: non-negative rows of norm 1 (or 0), every layer's input
    layers: int = 1
    fanout: int = 0
    d_min: int = 1
    degree_bound: int = 0
    batch_size: int = 1
    seed: int = 0  # root order, projection seed and per-step sampling seeds

    def rule(self) -> ChargeRule:
        return charge_rule(self.name, self.layers, self.fanout, self.d_min, self.degree_bound)

    @property
    def projection_seed(self) -> tuple[int, int]:
        return (self.seed * 7919) % (1 << 32), (self.seed * 104729 + 1) % (1 << 32)


def read_graph(scenario: Scenario, graph: Graph) -> Graph:
    """The graph the extractor reads: P(G) with a degree bound, G otherwise."""
    if scenario.degree_bound:
        return project_degree(graph, scenario.degree_bound, scenario.projection_seed)
    return graph


def capped_degree(scenario: Scenario, graph: Graph) -> torch.Tensor:
    """What the trainer gives the extractor: the read graph's degree, capped at the fanout."""
    return graph.degree.clamp(max=scenario.fanout) if scenario.fanout else graph.degree


def make_extractor(
    name: str, layers: int, d_min: int, fanout: int, dim: int, cls: type[PmpExtractor] = PmpExtractor, seed: int = 0
) -> PmpExtractor:
    """The production extractor with random weights; its inputs are the features themselves."""
    config = ExtractorConfig(
        name=name, layers=layers, fanout=fanout, d_min=d_min, dim=dim, encoder_hidden=8, dropout=0.0, spectral_norm=False
    )
    torch.manual_seed(seed)
    model = cls(config, in_features=dim, capped_degree=torch.zeros(1, dtype=torch.int64))
    model.encoder = GivenEncoding()  # features are the layer-0 inputs H themselves
    return model.eval()


def coupled(extractor: PmpExtractor) -> PmpExtractor:
    """A copy whose post-processing ignores the aggregates: h^(l) = normalize(relu(h^(l-1))).

    Then both graphs feed every layer the same H, as the per-layer analysis assumes.
    """
    model = copy.deepcopy(extractor)
    with torch.no_grad():
        for layer in model.layers:
            layer.self_weight.weight.copy_(torch.eye(layer.self_weight.weight.shape[0]))
            layer.self_weight.bias.zero_()
            if layer.agg_gain is not None:
                layer.agg_gain.zero_()
    return model


def _subgraph(scenario: Scenario, graph: Graph, roots: torch.Tensor, seeds):
    """The step's blocks, as the trainer builds them (no edges at all for the MLP)."""
    if scenario.name == "mlp":
        return edgeless_subgraph(roots, scenario.layers)
    return NeighbourSampler(graph, scenario.fanout, scenario.layers).sample(roots, seeds)


def step_aggregates(
    scenario: Scenario, extractor: PmpExtractor, graph: Graph, roots: torch.Tensor, seeds
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Run the real mechanism for one step without noise; per layer (nodes, pre-noise aggregates)."""
    recorded: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = extractor.aggregate

    def recording(block, *args, **kwargs):
        out = original(block, *args, **kwargs)
        recorded.append((block.dst_nodes.clone(), out.clone()))
        return out

    extractor.capped_degree = capped_degree(scenario, graph)
    extractor.aggregate = recording  # an instance attribute shadows the method
    try:
        extractor.noisy_aggregates(_subgraph(scenario, graph, roots, seeds), scenario.inputs, 0.0, None)
    finally:
        del extractor.aggregate
    return recorded


def released(scenario: Scenario, extractor: PmpExtractor, graph: Graph, roots: torch.Tensor, seeds) -> torch.Tensor:
    """The B x d x L tensor the roots would be sent, without noise."""
    extractor.capped_degree = capped_degree(scenario, graph)
    with torch.no_grad():
        return extractor(_subgraph(scenario, graph, roots, seeds), scenario.inputs, 0.0, None)


def pass_plan(scenario: Scenario, layers: int) -> list[tuple[torch.Tensor, list[tuple[int, int]]]]:
    """One pass: a permutation of every node in batches, and each step's layer seeds."""
    generator = torch.Generator().manual_seed(scenario.seed)
    order = torch.randperm(scenario.graph.num_nodes, generator=generator)
    steps = []
    for roots in order.split(scenario.batch_size):
        draws = torch.randint(0, 1 << 32, (layers, 2), generator=generator, dtype=torch.int64)
        steps.append((roots, [(int(a), int(b)) for a, b in draws.tolist()]))
    return steps


@dataclass
class Measurement:
    step_distances: list[float]
    pass_distance: float
    changed_roots: int
    violations: list[str]


def measure(extractor: PmpExtractor, rule: ChargeRule, scenario: Scenario) -> Measurement:
    """Run one pass on G' and G and compare it with ``rule`` (module docstring: (i)-(iii))."""
    n = scenario.graph.num_nodes
    graphs = [read_graph(scenario, g) for g in (scenario.graph, add_edge(scenario.graph, *scenario.edge))]
    model = coupled(extractor)
    violations: list[str] = []
    distances: list[float] = []
    cache: dict[tuple, tuple] = {}
    changed = 0
    everyone = torch.arange(n)
    for roots, seeds in pass_plan(scenario, scenario.layers):
        # Every node's aggregate and release under each graph with this step's seeds: a
        # node's sample does not depend on the other roots, so these are what the step
        # computes for its own nodes (checked below), and they supply the aggregates of
        # the nodes only one graph's step computes (the analysis compares the union).
        # Without sampling the seeds do not matter and one run serves the whole pass.
        key = tuple(seeds) if scenario.fanout and not scenario.degree_bound and scenario.name != "mlp" else ()
        if key not in cache:
            cache[key] = (
                [step_aggregates(scenario, model, g, everyone, seeds) for g in graphs],
                [released(scenario, extractor, g, everyone, seeds) for g in graphs],
            )
        full, outputs = cache[key]
        squared = 0.0
        runs = [step_aggregates(scenario, model, g, roots, seeds) for g in graphs]
        for layer in range(len(runs[0])):
            computed = torch.zeros(n, dtype=torch.bool)
            for run, all_nodes in zip(runs, full):
                nodes, values = run[layer]
                if not torch.allclose(values, all_nodes[layer][1][nodes], atol=1e-6):
                    violations.append("a step computed an aggregate that differs from the all-nodes run")
                computed[nodes] = True
            difference = full[1][layer][1] - full[0][layer][1]
            squared += float((difference[computed] ** 2).sum())
        distance = math.sqrt(squared)
        distances.append(distance)
        if distance > rule.step_sensitivity * (1 + TOLERANCE) + TOLERANCE:
            violations.append(f"(i) step distance {distance:.6g} > S_step {rule.step_sensitivity:.6g}")
        changed += int(((outputs[1][roots] - outputs[0][roots]).abs().amax(dim=(1, 2)) > 1e-6).sum())
    pass_distance = math.sqrt(sum(d * d for d in distances))
    counted = len(distances) if rule.participation_bound is None else min(rule.participation_bound, len(distances))
    charged = math.sqrt(counted) * rule.sensitivity
    if pass_distance > charged * (1 + TOLERANCE) + TOLERANCE:
        violations.append(f"(ii) pass distance {pass_distance:.6g} > charged {charged:.6g} ({rule.form})")
    if rule.edge_reach is not None and changed > rule.edge_reach:
        violations.append(f"(iii) {changed} roots changed > N_e {rule.edge_reach}")
    return Measurement(distances, pass_distance, changed, violations)


def check_charge_rule(extractor: PmpExtractor, rule: ChargeRule, scenario: Scenario) -> list[str]:
    """The violations of ``rule`` by ``extractor`` on ``scenario`` (empty: none found)."""
    return measure(extractor, rule, scenario).violations


# --------------------------------------------------------------------------------------
# Graph pairs: random and adversarial
# --------------------------------------------------------------------------------------


def _graph(n: int, edges: list[tuple[int, int]]) -> Graph:
    return build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), n)


def random_pair(rng: random.Random, n: int, p: float) -> tuple[Graph, tuple[int, int]]:
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    present = set(edges)
    missing = [(i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in present]
    if not missing:  # complete graph: drop one edge and add it back
        missing = [edges.pop(rng.randrange(len(edges)))]
    return _graph(n, edges), rng.choice(missing)


def neighbourhood_pair(
    rng: random.Random, degree_u: int, degree_v: int, shared: int, extra: float
) -> tuple[Graph, tuple[int, int]]:
    """u* = 0 and v* = 1 with the given degrees, ``shared`` common neighbours, plus random
    edges among the others at rate ``extra`` (so neighbours have varied degrees: hubs,
    leaves, nodes at D or at the D_min boundary)."""
    shared = min(shared, degree_u, degree_v)
    common = list(range(2, 2 + shared))
    own_u = list(range(2 + shared, 2 + degree_u))
    own_v = list(range(2 + degree_u, 2 + degree_u + degree_v - shared))
    n = 2 + degree_u + degree_v - shared + rng.randint(0, 2)
    edges = {(0, w) for w in common + own_u} | {(1, w) for w in common + own_v}
    others = range(2, n)
    edges |= {(a, b) for a in others for b in others if a < b and rng.random() < extra}
    return _graph(n, sorted(edges)), (0, 1)


def inputs(kind: str, n: int, rng: random.Random, edge: tuple[int, int]) -> torch.Tensor:
    """Layer inputs, non-negative with unit norm, in the shapes that maximise each term."""
    h = torch.zeros(n, DIM)
    if kind == "aligned":  # sums add up fully
        h[:, 0] = 1.0
    elif kind == "endpoints-aligned":  # u*, v* along one axis, everyone else along another
        h[:, 1] = 1.0
        h[list(edge), 1] = 0.0
        h[list(edge), 0] = 1.0
    elif kind == "groups":  # random clusters of identical vectors, orthogonal across clusters
        for node in range(n):
            h[node, rng.randrange(DIM)] = 1.0
    else:
        h = torch.rand(n, DIM, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
        h = h / h.norm(dim=1, keepdim=True)
    return h


@st.composite
def scenarios(draw, names: tuple[str, ...] = ("mlp", "pmp-gin", "pmp-gcn"), projected: bool | None = None) -> Scenario:
    name = draw(st.sampled_from(names))
    layers = draw(st.sampled_from([1, 2]))
    use_projection = draw(st.booleans()) if projected is None else projected
    degree_bound = draw(st.sampled_from([1, 2, 3, 4])) if use_projection else 0
    if degree_bound:
        fanout = draw(st.sampled_from([0, 0, degree_bound, degree_bound + 2]))
    else:
        fanout = draw(st.sampled_from([0, 1, 2, 3, 5]))
    scale = degree_bound or fanout or 4
    d_min = draw(st.integers(0, min(scale, 5))) if name == "pmp-gcn" else 0
    seed = draw(st.integers(0, 2**31 - 1))
    rng = random.Random(seed)
    if draw(st.booleans()):
        graph, edge = random_pair(rng, draw(st.integers(2, 14)), draw(st.floats(0.0, 0.7)))
    else:
        degrees = [0, max(d_min - 1, 0), d_min, scale - 1, scale, scale + 1, 3 * scale]
        graph, edge = neighbourhood_pair(
            rng,
            draw(st.sampled_from(degrees)),
            draw(st.sampled_from(degrees)),
            draw(st.integers(0, 3)),
            draw(st.sampled_from([0.0, 0.15, 0.4])),
        )
    kind = draw(st.sampled_from(["aligned", "endpoints-aligned", "groups", "random"]))
    batch_size = draw(st.sampled_from([1, 2, 3, 64]))
    return Scenario(
        name=name, graph=graph, edge=edge, inputs=inputs(kind, graph.num_nodes, rng, edge), layers=layers,
        fanout=fanout, d_min=d_min, degree_bound=degree_bound, batch_size=batch_size, seed=seed,
    )


def extractor_for(scenario: Scenario, cls: type[PmpExtractor] = PmpExtractor) -> PmpExtractor:
    dim = scenario.inputs.shape[1]
    return make_extractor(scenario.name, scenario.layers, scenario.d_min, scenario.fanout, dim, cls, seed=scenario.seed % 1000)


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


def _star(centre: int, leaves: range) -> list[tuple[int, int]]:
    return [(centre, leaf) for leaf in leaves]


ADVERSARIAL = {
    # name: (graph G', edge)
    "both isolated": (_graph(2, []), (0, 1)),
    "hub and leaf": (_graph(16, _star(0, range(1, 15))), (0, 15)),
    "two hubs": (_graph(24, _star(0, range(2, 13)) + _star(1, range(13, 24))), (0, 1)),
    "degree exactly 3 at both ends": (_graph(8, _star(0, range(2, 5)) + _star(1, range(5, 8))), (0, 1)),
    "degree 2 at both ends": (_graph(8, _star(0, range(2, 4)) + _star(1, range(5, 7))), (0, 1)),
    "D_min boundary star": (_graph(6, _star(0, range(1, 4)) + [(4, 5)]), (0, 4)),
    "shared neighbours": (_graph(6, [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]), (0, 1)),
    # u*, v* of degree 3 sharing w = 2, which also has degree 3: u' = v' = w for some seeds
    "shared displaced neighbour": (_graph(8, [(0, 2), (0, 3), (0, 4), (1, 2), (1, 5), (1, 6), (2, 7)]), (0, 1)),
    # u*, v*, u' = 2, v' = 3 each with D = 3 distinct neighbours: N_e is reached when
    # (0, 2) and (1, 3) are displaced
    "full neighbourhoods at D = 3": (
        _graph(12, [(0, 2), (0, 4), (0, 5), (1, 3), (1, 6), (1, 7), (2, 8), (2, 9), (3, 10), (3, 11)]),
        (0, 1),
    ),
    # the displaced neighbours 2 and 5 sit at degree 2, 3: D_min crossings on removal
    "displaced at the D_min boundary": (
        _graph(10, [(0, 2), (0, 3), (0, 4), (1, 5), (1, 6), (1, 7), (2, 8), (5, 8), (5, 9)]),
        (0, 1),
    ),
}

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


@pytest.mark.parametrize("setting", PROJECTED_SETTINGS, ids=lambda s: "-".join(map(str, s)))
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


def _shared_displaced_scenario(name: str, layers: int, d_min: int = 0) -> Scenario:
    """Configuration T2 on D = 3: both endpoints displace their edge to w = 2.

    u* = 0 and v* = 1 have neighbours {2, 3, 4} and {2, 5, 6}; w = 2 has {0, 1, 7}.
    The projection seed is searched so that adding (0, 1) drops (0, 2) and (1, 2).
    """
    graph, edge = ADVERSARIAL["shared displaced neighbour"]
    h = torch.zeros(graph.num_nodes, DIM)
    h[:, 2] = 1.0
    h[[0, 1], 0] = 1.0  # h_u* = h_v*, orthogonal to h_w: Δa_w = −2 h_u*
    h[[0, 1], 2] = 0.0
    h[2, 1], h[2, 2] = 1.0, 0.0
    for seed in range(500):
        scenario = Scenario(name, graph, edge, h, layers=layers, d_min=d_min, degree_bound=3, batch_size=1, seed=seed)
        before, after = (read_graph(scenario, g) for g in (graph, add_edge(graph, *edge)))
        if before.neighbours(2).tolist() == [0, 1, 7] and after.neighbours(2).tolist() == [7] and 1 in after.neighbours(0).tolist():
            return scenario
    raise AssertionError("no projection seed realises u' = v'")


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


# --------------------------------------------------------------------------------------
# The numbers and the rule
# --------------------------------------------------------------------------------------


def test_step_sensitivity_composes_layers() -> None:
    assert step_sensitivity("pmp-gin", 3, 5, 0) == pytest.approx(3**0.5 * 2)
    assert step_sensitivity("pmp-gin", 2, 0, 0, degree_bound=4) == pytest.approx(2**0.5 * 8**0.5)
    assert step_sensitivity("mlp", 2, 5, 0) == 0


def test_participation_bounds() -> None:
    assert participation_bound("mlp", 3, 10) == 0
    assert participation_bound("pmp-gin", 1, 10) == 2
    assert participation_bound("pmp-gcn", 1, 10) == 20
    assert participation_bound("pmp-gcn", 1, 0) is None  # unbounded degree, unbounded reach
    assert participation_bound("pmp-gin", 2, 10) is None  # L >= 2 reaches neighbours of neighbours
    # on P(G), eqs. N2-N3: four changed nodes for GIN, their neighbourhoods for GCN
    assert participation_bound("pmp-gin", 1, 0, degree_bound=10) == 4
    assert participation_bound("pmp-gin", 2, 0, degree_bound=10) == 40
    assert participation_bound("pmp-gcn", 1, 0, degree_bound=10) == 22
    assert participation_bound("pmp-gcn", 2, 0, degree_bound=10) == 202


def test_pass_sensitivities() -> None:
    assert pass_sensitivity("pmp-gin", 1, 10, 0) == pytest.approx(2.0)  # eq. G0, once per pass
    assert pass_sensitivity("pmp-gcn", 1, 10, 1) == pytest.approx(gcn_layer_sensitivity(10, 1))
    assert pass_sensitivity("pmp-gin", 2, 10, 0) is None  # unbounded recomputation
    for degree_bound in (2, 3, 10):  # eq. R3 for GIN, L = 2: 8D + 20
        assert pass_sensitivity("pmp-gin", 2, 0, 0, degree_bound) ** 2 == pytest.approx(8 * degree_bound + 20)
    assert pass_sensitivity("pmp-gin", 1, 0, 0, 10) ** 2 == pytest.approx(8.0)


@pytest.mark.parametrize("name", ["pmp-gin", "pmp-gcn"])
@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("fanout, degree_bound", [(10, 0), (0, 0), (0, 10), (0, 4)])
def test_the_rule_is_the_cheaper_valid_form(name: str, layers: int, fanout: int, degree_bound: int) -> None:
    rule = charge_rule(name, layers, fanout, 2, degree_bound)
    step = step_sensitivity(name, layers, fanout, 2, degree_bound)
    reach = participation_bound(name, layers, fanout, degree_bound)
    whole = pass_sensitivity(name, layers, fanout, 2, degree_bound)
    assert rule.step_sensitivity == pytest.approx(step)
    assert rule.edge_reach == reach
    per_step = math.inf if reach is None else reach * step**2
    per_pass = math.inf if whole is None else whole**2
    assert rule.pass_cost == pytest.approx(min(per_step, per_pass))
    assert rule.form == ("per-pass" if per_pass < per_step else "per-step")
    assert (rule.participation_bound == 1) == (rule.form == "per-pass")
    assert "docs/privacy.md" in rule.derivation


def test_the_pass_form_removes_the_double_count() -> None:
    """GCN, L = 1, fanout 10: the per-step form charged N_e = 2D = 20 releases of the same S."""
    rule = charge_rule("pmp-gcn", 1, 10, 1, 0)
    assert rule.form == "per-pass" and rule.participation_bound == 1
    assert 20 * step_sensitivity("pmp-gcn", 1, 10, 1) ** 2 == pytest.approx(20 * rule.pass_cost)


def test_mlp_is_free() -> None:
    rule = charge_rule("mlp", 2, 10, 0, 0)
    assert (rule.sensitivity, rule.participation_bound, rule.step_sensitivity) == (0.0, 0, 0.0)


@pytest.mark.parametrize(
    "args, message",
    [
        (("gat", 1, 10, 1, 0), "unknown extractor"),
        (("pmp-gin", 0, 10, 1, 0), "layers"),
        (("pmp-gin", 1, -1, 1, 0), ">= 0"),
        (("pmp-gcn", 1, 0, 1, -2), ">= 0"),
        (("pmp-gcn", 1, 5, 1, 10), "not supported"),
        (("pmp-gcn", 1, 0, 11, 10), "d_min 11 above the degree bound"),
    ],
)
def test_bad_arguments_are_refused(args, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        charge_rule(*args)


def test_reading_the_projection_with_a_larger_fanout_is_the_same_rule() -> None:
    assert charge_rule("pmp-gcn", 2, 12, 2, 10).pass_cost == charge_rule("pmp-gcn", 2, 0, 2, 10).pass_cost


def test_the_per_pass_form_can_be_switched_off() -> None:
    """For accounting that needs one event per release (e.g. Poisson edge sampling)."""
    rule = charge_rule("pmp-gcn", 1, 10, 1, 0, allow_per_pass=False)
    assert rule.form == "per-step" and rule.participation_bound == 20

