"""The empirical sensitivity checker of the test_sensitivity*.py modules: do the releases on
neighbouring graphs ever differ by more than the accountant charges (privacy contract,
"Every extractor must", 2)?

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
from dataclasses import dataclass

import torch

from vesper.common.config import ExtractorConfig
from vesper.party_a.degree_projection import project_degree
from vesper.party_a.encoder import GivenEncoding
from vesper.party_a.extractors.pmp import PmpExtractor
from vesper.party_a.extractors.sensitivity import ChargeRule, charge_rule
from vesper.party_a.graph_store import Graph, add_edge
from vesper.party_a.sampler import NeighbourSampler, edgeless_subgraph

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
    # the same secret order key on G and G': the coupling of Lemma 2 holds for every key
    order_key = scenario.projection_seed if scenario.fanout else None
    return NeighbourSampler(graph, scenario.fanout, scenario.layers, order_key).sample(roots, seeds)


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
