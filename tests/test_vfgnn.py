"""VFGNN (output perturbation, docs/extractors/vfgnn.md): empirical sensitivity and sound training.

``measure`` runs the production extractor — its degree projection, the sampler and
``VfgnnExtractor.release`` with the noise switched off — on G' and G = G' + (u*, v*),
two extractors built with the same secret generator so that they draw the same
projection seed and the same per-step sampling seeds, over one whole pass (a
permutation of every node in batches), and compares the result with a claimed
``VfgnnCharge``:

  (i)   per step, the L2 distance of the step's release is at most the sensitivity
        charged for one release (S_step; in the per-pass form S_pass bounds it too);
  (ii)  over the pass, √(Σ_steps distance²) is at most what the rule charges per pass
        (√(counted releases) · S);
  (iii) at most N_e roots see their release change, each by at most √2 (eq. V4).

The encoder is replaced by the identity, so the features are the layer-0 inputs
m^(0) themselves and can be adversarial: non-negative rows of norm 1, or 0 (which an
encoder's relu can produce and which makes the per-root bound √2 attainable).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import pytest
import torch

from vesper.common.config import ExtractorConfig, RunConfig
from vesper.party_a.encoder import GivenEncoding, MlpEncoder
from vesper.party_a.extractors import vfgnn
from vesper.party_a.extractors.base import ExtractorSetup, RootPlan
from vesper.party_a.extractors.vfgnn import (
    ROOT_BOUND,
    VfgnnCharge,
    VfgnnExtractor,
    VfgnnParams,
    charge,
    edge_reach,
)
from vesper.party_a.graph_store import Graph, add_edge, build_graph

DIM = 6
TOLERANCE = 1e-5


# --------------------------------------------------------------------------------------
# Running the production extractor on a neighbouring pair
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    graph: Graph  # G', without the edge
    edge: tuple[int, int]  # (u*, v*), added to make G
    inputs: torch.Tensor  # m^(0): non-negative rows of norm 1 or 0
    layers: int = 1
    fanout: int = 3
    degree_bound: int = 0
    batch_size: int = 4
    aggregation: str = "mean"
    seed: int = 0  # A's secret generator (projection and sampling seeds) and the root order

    def rule(self) -> VfgnnCharge:
        fanout = 0 if self.degree_bound else self.fanout
        n = min(self.batch_size, self.graph.num_nodes)
        return charge(self.layers, fanout, self.degree_bound, {"train": n, "eval": n})


def build(scenario: Scenario, graph: Graph, *, self_slice: bool = True, device: str = "cpu") -> VfgnnExtractor:
    """The production extractor on ``graph``, its encoder replaced by the identity."""
    config = RunConfig(
        extractor=ExtractorConfig(
            name="vfgnn", layers=scenario.layers, fanout=scenario.fanout, degree_bound=scenario.degree_bound,
            dim=scenario.inputs.shape[1], encoder_hidden=8, dropout=0.0,
            params={"aggregation": scenario.aggregation, "self_slice": self_slice},
        ),
        batch_size=scenario.batch_size,
    )
    setup = ExtractorSetup(
        config=config, params=VfgnnParams.model_validate(config.extractor.params), graph=graph.to(device),
        features=scenario.inputs.to(device), device=torch.device(device),
        sampling_generator=torch.Generator().manual_seed(scenario.seed),
        noise_generator=torch.Generator(device=device).manual_seed(scenario.seed + 1), delta=1e-5,
    )
    extractor = VfgnnExtractor(setup)
    extractor.encoder = GivenEncoding()
    return extractor.train(False)


@dataclass
class Measurement:
    step_distances: list[float]
    pass_distance: float
    changed_roots: int
    largest_root_change: float
    violations: list[str]


def measure(scenario: Scenario, rule: VfgnnCharge) -> Measurement:
    """One pass on G' and G with the same secret seeds, compared with ``rule`` ((i)-(iii))."""
    pair = [build(scenario, g) for g in (scenario.graph, add_edge(scenario.graph, *scenario.edge))]
    order = torch.randperm(scenario.graph.num_nodes, generator=torch.Generator().manual_seed(scenario.seed))
    distances, changed, largest, violations = [], 0, 0.0, []
    with torch.no_grad():
        for roots in order.split(scenario.batch_size):
            before, after = (ex.release(roots, "train") for ex in pair)  # noise off: z never bound
            if not torch.equal(before[..., 0], after[..., 0]):
                violations.append("the edge-free slice h^(0) depends on the edge")
            per_root = (after - before).flatten(1).norm(dim=1)
            changed += int((per_root > 1e-6).sum())
            largest = max(largest, float(per_root.max()))
            distance = float(per_root.norm())
            distances.append(distance)
            if distance > rule.sensitivity["train"] * (1 + TOLERANCE) + TOLERANCE:
                violations.append(f"(i) step distance {distance:.6g} > S {rule.sensitivity['train']:.6g}")
    pass_distance = math.sqrt(sum(d * d for d in distances))
    bound = rule.participation_bound
    counted = len(distances) if bound is None else min(bound, len(distances))
    charged = math.sqrt(counted) * rule.sensitivity["train"]
    if pass_distance > charged * (1 + TOLERANCE) + TOLERANCE:
        violations.append(f"(ii) pass distance {pass_distance:.6g} > charged {charged:.6g} ({rule.form})")
    if rule.edge_reach is not None and changed > rule.edge_reach:
        violations.append(f"(iii) {changed} roots changed > N_e {rule.edge_reach}")
    if largest > ROOT_BOUND * (1 + TOLERANCE):
        violations.append(f"(iii) a root moved by {largest:.6g} > √2")
    return Measurement(distances, pass_distance, changed, largest, violations)


# --------------------------------------------------------------------------------------
# Graph pairs and inputs
# --------------------------------------------------------------------------------------


def _graph(n: int, edges: list[tuple[int, int]]) -> Graph:
    return build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), n)


def _star(centre: int, leaves: range) -> list[tuple[int, int]]:
    return [(centre, leaf) for leaf in leaves]


PAIRS = {
    "both isolated": (_graph(2, []), (0, 1)),
    "hub and leaf": (_graph(16, _star(0, range(1, 15))), (0, 15)),
    "two hubs": (_graph(24, _star(0, range(2, 13)) + _star(1, range(13, 24))), (0, 1)),
    "degree exactly 3 at both ends": (_graph(8, _star(0, range(2, 5)) + _star(1, range(5, 8))), (0, 1)),
    "degree 2 at both ends": (_graph(8, _star(0, range(2, 4)) + _star(1, range(5, 7))), (0, 1)),
    "shared neighbours": (_graph(6, [(0, 2), (0, 3), (0, 4), (1, 2), (1, 3), (1, 4)]), (0, 1)),
    "shared displaced neighbour": (_graph(8, [(0, 2), (0, 3), (0, 4), (1, 2), (1, 5), (1, 6), (2, 7)]), (0, 1)),
    # u*, v*, u' = 2, v' = 3 each with D = 3 neighbours in disjoint neighbourhoods: the
    # projection's T1 reaches N_e = 4 (L = 1) and 4D = 12 (L = 2)
    "full neighbourhoods at D = 3": (
        _graph(12, [(0, 2), (0, 4), (0, 5), (1, 3), (1, 6), (1, 7), (2, 8), (2, 9), (3, 10), (3, 11)]),
        (0, 1),
    ),
}


def inputs(kind: str, n: int, rng: random.Random, edge: tuple[int, int]) -> torch.Tensor:
    """m^(0) in the shapes that push the per-root changes up."""
    h = torch.zeros(n, DIM)
    if kind == "groups":  # clusters of identical vectors, orthogonal across clusters
        for node in range(n):
            h[node, rng.randrange(DIM)] = 1.0
    elif kind == "zero endpoints":  # endpoints carry nothing of their own: their outputs can turn fully
        for node in range(n):
            h[node, rng.randrange(DIM)] = 1.0
        h[list(edge)] = 0.0
    elif kind == "sparse zeros":  # a third of the nodes are 0 (relu killed everything)
        for node in range(n):
            if rng.random() > 1 / 3:
                h[node, rng.randrange(DIM)] = 1.0
    else:
        h = torch.rand(n, DIM, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
        h = h / h.norm(dim=1, keepdim=True)
    return h


KINDS = ("groups", "zero endpoints", "sparse zeros", "random")


def random_pair(rng: random.Random, n: int, p: float) -> tuple[Graph, tuple[int, int]]:
    edges = [(i, j) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    present = set(edges)
    missing = [(i, j) for i in range(n) for j in range(i + 1, n) if (i, j) not in present]
    if not missing:
        missing = [edges.pop(rng.randrange(len(edges)))]
    return _graph(n, edges), rng.choice(missing)


# --------------------------------------------------------------------------------------
# The charged rule holds: adversarial and random pairs, L = 1 and 2, raw and projected
# --------------------------------------------------------------------------------------

SETTINGS = [
    # (layers, fanout, degree_bound, aggregation)
    (1, 3, 0, "mean"), (1, 1, 0, "sum"), (1, 0, 0, "mean"), (2, 3, 0, "mean"),
    (1, 0, 3, "mean"), (2, 0, 3, "sum"), (2, 0, 2, "mean"),
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "L{}-f{}-D{}-{}".format(*s))
def test_adversarial_pairs_stay_within_the_charge(setting) -> None:
    layers, fanout, degree_bound, aggregation = setting
    rng = random.Random(0)
    offset = SETTINGS.index(setting)
    for index, (case, (graph, edge)) in enumerate(PAIRS.items()):
        kind = KINDS[(index + offset) % len(KINDS)]  # every pair meets every input kind across settings
        scenario = Scenario(
            graph, edge, inputs(kind, graph.num_nodes, rng, edge), layers, fanout, degree_bound,
            batch_size=(3, 64)[index % 2], aggregation=aggregation, seed=index,
        )
        assert measure(scenario, scenario.rule()).violations == [], (case, kind)


def test_random_pairs_stay_within_the_charge() -> None:
    rng = random.Random(7)
    for trial in range(14):
        layers, fanout, degree_bound, aggregation = SETTINGS[trial % len(SETTINGS)]
        graph, edge = random_pair(rng, rng.randint(2, 14), rng.choice([0.1, 0.3, 0.6]))
        scenario = Scenario(
            graph, edge, inputs(rng.choice(KINDS), graph.num_nodes, rng, edge), layers, fanout, degree_bound,
            batch_size=rng.choice([2, 5, 64]), aggregation=aggregation, seed=trial,
        )
        assert measure(scenario, scenario.rule()).violations == [], (trial, scenario)


# --------------------------------------------------------------------------------------
# The bounds are reached, and claims below them are caught
# --------------------------------------------------------------------------------------


def _swap_pair() -> tuple[Graph, tuple[int, int], torch.Tensor]:
    """u* = 0 ~ a = 2, v* = 1 ~ b = 3, fanout 1: adding (0, 1) can swap a → v* at u*.

    m^(0): u* = 0 (nothing of its own), v* = e0, a = e1, b = e2. If u* samples v*,
    o_{u*} turns from e1 to e0: √2, the largest change (V4).
    """
    h = torch.zeros(4, DIM)
    h[1, 0] = h[2, 1] = h[3, 2] = 1.0
    return _graph(4, [(0, 2), (1, 3)]), (0, 1), h


def _seed_where(scenario: Scenario, predicate) -> Scenario:
    for seed in range(200):
        probe = replace(scenario, seed=seed)
        if predicate(measure(probe, probe.rule())):
            return probe
    raise AssertionError("no seed realises the configuration")


def test_one_root_moves_by_exactly_root_two_and_a_smaller_per_root_claim_is_caught() -> None:
    graph, edge, h = _swap_pair()
    scenario = _seed_where(
        Scenario(graph, edge, h, layers=1, fanout=1, batch_size=4),
        lambda m: m.largest_root_change > 1.4 and m.pass_distance**2 > 2.5,  # both endpoints swap
    )
    honest = measure(scenario, scenario.rule())
    assert honest.violations == []
    assert honest.largest_root_change == pytest.approx(math.sqrt(2), abs=1e-6)
    # a per-root bound of 1 (e.g. "normalised outputs move by at most their norm"):
    # S_pass² = 1 · N_e = 2, below the measured pass distance² = 2 + (2 − √2) (v* moves too)
    wrong = replace(scenario.rule(), sensitivity={"train": math.sqrt(edge_reach(1, 1, 0)), "eval": 0.0})
    assert any(v.startswith("(ii)") for v in measure(scenario, wrong).violations)


def test_the_projected_participation_bound_is_reached_and_the_papers_count_is_caught() -> None:
    graph, edge = PAIRS["full neighbourhoods at D = 3"]
    h = torch.eye(DIM)[torch.arange(graph.num_nodes) % DIM]
    for layers, reach in ((1, 4), (2, 12)):
        base = Scenario(graph, edge, h, layers=layers, fanout=0, degree_bound=3, batch_size=64)
        scenario = _seed_where(base, lambda m, reach=reach: m.changed_roots == reach)
        assert scenario.rule().edge_reach == reach == measure(scenario, scenario.rule()).changed_roots
    # Proposition 3 counts 2 Σ_{l<L} D^l = 2 + 2D = 8 nodes at L = 2: through the projection
    # one edge changes three, on four nodes, and 4D = 12 roots move
    papers = replace(scenario.rule(), edge_reach=2 * (1 + 3))
    assert any(v.startswith("(iii)") for v in measure(scenario, papers).violations)


def test_two_layers_on_the_raw_graph_reach_every_neighbour_of_a_hub() -> None:
    """L = 2 without a projection: every leaf that samples the hub v* moves, so N_e is
    unbounded (V5) and a step of n roots has S_step = √(2n) (V7). The paper's count with
    D = fanout (2(1 + D) = 8 roots) is caught."""
    graph = _graph(16, _star(1, range(2, 16)))  # v* = 1 with 14 leaves; u* = 0 isolated
    h = torch.zeros(16, DIM)
    h[0, 0] = 1.0  # u*'s vector reaches every leaf through v* (zero of its own)
    h[2:, 1] = 1.0
    base = Scenario(graph, (0, 1), h, layers=2, fanout=3, batch_size=16)
    scenario = _seed_where(base, lambda m: m.changed_roots >= 14)  # v* samples u* at layer 1
    honest = measure(scenario, scenario.rule())
    assert honest.violations == [] and scenario.rule().participation_bound is None
    papers = VfgnnCharge({"train": 2.0 * math.sqrt(8), "eval": 0.0}, 1, "per-pass", 8, "Proposition 3")
    assert any(v.startswith("(iii)") for v in measure(scenario, papers).violations)


def test_gcn_normalised_aggregation_would_break_n_e(monkeypatch) -> None:
    """GCN's sender coefficient c(d_u) moves with an endpoint's degree, so every node that
    samples an endpoint changes at layer 1: the sum/mean restriction is what keeps N_e = 2."""

    def gcn(block, m_src, aggregation):
        degree = torch.bincount(block.edge_dst, minlength=block.dst_count)
        sender = torch.zeros(m_src.shape[0])
        sender[: block.dst_count] = torch.rsqrt(degree.float() + 1)  # roots' degrees stand in for all
        weight = sender[block.edge_src]
        out = m_src.new_zeros(block.dst_count, m_src.shape[1])
        return out.index_add_(0, block.edge_dst, m_src[block.edge_src] * weight[:, None])

    graph, edge = PAIRS["two hubs"]
    h = torch.eye(DIM)[torch.arange(graph.num_nodes) % DIM]
    scenario = Scenario(graph, edge, h, layers=1, fanout=0, batch_size=64)
    assert measure(scenario, scenario.rule()).violations == []
    monkeypatch.setattr(vfgnn, "neighbour_aggregate", gcn)
    assert any(v.startswith("(iii)") for v in measure(scenario, scenario.rule()).violations)


# --------------------------------------------------------------------------------------
# The charge plan (eqs. V5-V7)
# --------------------------------------------------------------------------------------


def _roots(train: int, val: int, test: int) -> RootPlan:
    ids = torch.arange(train + val + test)
    return RootPlan(ids[:train], ids[train : train + val], ids[train + val :], steps_per_epoch=1, eval_chunks=2)


@pytest.mark.parametrize(
    "layers, degree_bound, form, bound, reach, s_train, s_eval",
    [
        (1, 0, "per-pass", 1, 2, 2.0, 2.0),
        (1, 5, "per-pass", 1, 4, math.sqrt(8), math.sqrt(8)),
        (2, 5, "per-pass", 1, 20, math.sqrt(40), math.sqrt(40)),
        (2, 0, "per-step", None, None, math.sqrt(2 * 32), math.sqrt(2 * 50)),
    ],
)
def test_charge_plan(layers, degree_bound, form, bound, reach, s_train, s_eval) -> None:
    graph, edge = PAIRS["two hubs"]
    scenario = Scenario(graph, edge, torch.rand(24, DIM), layers=layers, fanout=0 if degree_bound else 3,
                        degree_bound=degree_bound, batch_size=32)
    extractor = build(scenario, graph)
    plan = extractor.charge_plan(_roots(train=100, val=50, test=40))  # eval_chunk 4096 > 50
    assert [(r.kind, r.participation_bound, r.mechanism, r.noise_scale) for r in plan.rules] == [
        ("train", bound, "gaussian", 1.0), ("eval", bound, "gaussian", 1.0)
    ]
    assert plan.details["sensitivity_form"] == form and plan.details["edge_reach"] == reach
    assert plan.sensitivity == pytest.approx(s_train) and plan.participation_bound == bound
    assert plan.details["eval_sensitivity"] == pytest.approx(s_eval)
    extractor.bind(3.0)
    assert extractor.noise_std == pytest.approx({"train": 3.0 * s_train, "eval": 3.0 * s_eval})


def test_both_accountings_and_no_edge_sampling() -> None:
    spec = VfgnnExtractor.spec
    assert spec.name == "vfgnn" and spec.privacy_unit == "edge" and spec.cost_model == "per-step"
    assert spec.accountings == ("visible-batch", "hidden-batch") and not spec.edge_sampling


# --------------------------------------------------------------------------------------
# A's training reads the graph only through charged releases (section 2)
# --------------------------------------------------------------------------------------


def _trainable_pair(self_slice: bool) -> tuple[list[VfgnnExtractor], torch.Tensor]:
    graph, edge = PAIRS["two hubs"]
    scenario = Scenario(graph, edge, torch.rand(24, DIM), layers=2, fanout=3)
    pair = []
    for g in (graph, add_edge(graph, *edge)):
        ex = build(scenario, g, self_slice=self_slice)
        ex.charge_plan(_roots(train=20, val=2, test=2))
        torch.manual_seed(0)
        ex.encoder = MlpEncoder(DIM, DIM, DIM, 0.5)  # graph-free, trainable, with A's keyed dropout
        ex.encoder.requires_grad_(self_slice)
        ex.train(True)
        pair.append(ex)
    return pair, torch.tensor([0, 1, 2, 13])


def test_encoder_gradients_do_not_read_the_graph_and_dropout_draws_do_not_depend_on_it() -> None:
    pair, roots = _trainable_pair(self_slice=True)
    upstream = torch.randn(4, DIM, 2, generator=torch.Generator().manual_seed(3))
    grads, after = [], []
    for ex in pair:
        ex.bind(0.5)  # noise on: the gain's gradient may read õ, which is charged
        torch.manual_seed(5)
        released = ex.release(roots, "train")
        after.append(torch.rand(3))  # torch's RNG: the graph part must not consume it
        released.backward(upstream)
        grads.append([p.grad.clone() for p in ex.encoder.parameters()])
        graph_part = torch.autograd.grad(
            ex.release(roots, "train")[..., 1].sum(), list(ex.encoder.parameters()), allow_unused=True
        )
        assert all(g is None or not g.any() for g in graph_part)  # nothing flows from õ into the encoder
        assert not ex.graph_output(roots).requires_grad
    assert torch.equal(after[0], after[1])
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    assert pair[0].output_gain.grad is not None  # γ learns from õ


def test_without_the_self_slice_only_the_gain_trains() -> None:
    pair, roots = _trainable_pair(self_slice=False)
    ex = pair[0]
    assert ex.output_layers == 1 and ex.trainable_parameters() == [ex.output_gain]
    assert ex.release(roots, "train").shape == (4, DIM, 1)


def test_noise_has_standard_deviation_theta_on_the_output_slice_only() -> None:
    n = 400
    graph = _graph(n, [(i, i + 1) for i in range(n - 1)])
    scenario = Scenario(graph, (0, n - 1), torch.rand(n, DIM), layers=1, fanout=3, batch_size=n)
    ex = build(scenario, graph)
    ex.charge_plan(_roots(train=n, val=0, test=1))
    ex.bind(0.7)
    roots = torch.arange(n)
    with torch.no_grad():
        noisy = ex.release(roots, "train")
        subgraph = ex.sampler.sample(roots, [(0, 0)])  # degrees ≤ 2 < fanout: the seed does not matter
        clean = vfgnn.message_passing_output(subgraph, scenario.inputs[subgraph.input_nodes], "mean")
    gain = float(ex.output_gain.detach())
    assert gain == pytest.approx(1 / math.sqrt(1 + DIM * (0.7 * 2.0) ** 2))
    assert torch.equal(noisy[..., 0], scenario.inputs)  # h^(0) is sent as it is
    std = float(((noisy[..., 1] / gain) - clean).std())
    assert std == pytest.approx(0.7 * 2.0, rel=0.05)


def test_outputs_are_non_negative_with_norm_at_most_one() -> None:
    rng = random.Random(3)
    graph, _ = random_pair(rng, 40, 0.2)
    h = inputs("sparse zeros", 40, rng, (0, 1))
    for aggregation in ("mean", "sum"):
        ex = build(Scenario(graph, (0, 1), h, layers=2, fanout=2, aggregation=aggregation), graph)
        out = ex.graph_output(torch.arange(40))
        assert bool((out >= 0).all()) and float(out.norm(dim=1).max()) <= 1 + 1e-6


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu() -> None:
    graph, edge = random_pair(random.Random(10), 60, 0.1)
    scenario = Scenario(graph, edge, torch.rand(60, DIM), layers=2, fanout=4, degree_bound=0)
    roots = torch.tensor([0, 3, 8])
    outputs = []
    for device in ("cpu", "cuda"):
        ex = build(scenario, graph, device=device)
        ex.charge_plan(_roots(train=40, val=10, test=10))
        ex.bind(None)
        with torch.no_grad():
            outputs.append(ex.release(roots.to(device), "train").cpu())
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)
