"""Relational pre-training (party_a.extractors.relational, relational_gap): sampling, sensitivity, charges.

The empirical sensitivity checks run the production steps (relation_tuples, then the
clipped gradient sums of either per-tuple path) on neighbouring graphs G' and G = G' + e*
with the same secret coins, and compare ‖Σ clipped(G) − Σ clipped(G')‖ with the C the
accountant charges (docs/extractors/relational.md, eq. R-S). Every coin is keyed by the
step's secret key and the pair it is about, so every candidate of G' draws the same
keep/orientation coins in G, and every tuple the same negatives, wherever e* sits among the
candidates (most tests put it last, which also keeps the tuples in the same order).
"""

from __future__ import annotations

import math
import random

import dp_accounting as dpa
import pytest
import torch
from conftest import random_graph
from torch import nn

from vesper.common.config import ExtractorConfig, RunConfig
from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.ledger import counted_per_kind, spent
from vesper.party_a.extractors import relational as rel
from vesper.party_a.extractors.base import ExtractorSetup, RootPlan, Stage
from vesper.party_a.extractors.gap import HOP_SENSITIVITY, encode_all, row_normalise
from vesper.party_a.extractors.registry import lookup, validated_params
from vesper.party_a.extractors.relational import (
    RelationalEncoder,
    RelationalExtractor,
    clipped_gradient_sum,
    edge_candidates,
    linear_encoder,
    low_rank_clipped_gradient_sum,
    low_rank_layers,
    mlp_encoder,
    privatise,
    relation_tuples,
    sample_negative_entities,
    sample_positive_relations,
    step_keys,
)
from vesper.party_a.extractors.relational_gap import RelationalGapExtractor
from vesper.party_a.graph_store import Graph, add_edge, build_graph
from vesper.party_a.noise import NoiseSource
from vesper.party_a.peers import BudgetRefused

TOLERANCE = 1e-5


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- helpers ---------------------------------------------------------------------------------
def make(
    graph: Graph, features: torch.Tensor, name: str = "relational", *, dim: int = 8, hidden: int = 16,
    hops: int = 1, seed: int = 0, sampling_seed: int = 1, noise_seed: int = 7, edge_bound: int | None = None,
    **params: object,
) -> RelationalExtractor | RelationalGapExtractor:
    params.setdefault("expected_batch", 8)  # the default 512 is more than these graphs' edges
    params.setdefault("pretrain_steps", 4)
    if name == "relational-gap":
        params.setdefault("encoder_epochs", 0)  # GAP's stage only where a test asks for it
    # the operator's public bound on |E|; here the test knows the graph and declares its size
    bound = max(1, graph.num_edges) if edge_bound is None else edge_bound or None
    config = RunConfig(
        seed=seed, privacy={"edge_bound": bound},
        extractor=ExtractorConfig(name=name, layers=hops, dim=dim, encoder_hidden=hidden, dropout=0.0, params=params),
    )
    cls = lookup(name)
    setup = ExtractorSetup(
        config=config, params=validated_params(cls.spec, config), graph=graph, features=features,
        device=torch.device("cpu"), sampling_generator=torch.Generator().manual_seed(sampling_seed),
        noise_generator=torch.Generator().manual_seed(noise_seed), delta=1e-5,
    )
    return cls(setup)


def root_plan(num_nodes: int) -> RootPlan:
    ids = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(0))
    third = num_nodes // 3
    return RootPlan(ids[:third], ids[third : 2 * third], ids[2 * third :], steps_per_epoch=3, eval_chunks=2)


class FakeSession:
    """A PrepareSession that records charges, steps and stages instead of talking to services."""

    def __init__(self, num_nodes: int, log: list | None = None, refuse: tuple[str, int] | None = None) -> None:
        self.roots = root_plan(num_nodes)
        self.log = [] if log is None else log
        self.refuse = refuse
        self.charged: list[tuple[str, int, torch.Tensor]] = []
        self.stages: list[Stage] = []

    def _charge(self, kind: str, index: int, node_ids: torch.Tensor) -> None:
        if self.refuse == (kind, index):
            raise BudgetRefused(f"{kind} release {index} does not fit")
        self.log.append((kind, index))
        self.charged.append((kind, index, node_ids.clone()))

    def charge_pre_train(self, index: int, node_ids: torch.Tensor) -> None:
        self._charge("pre-train", index, node_ids)

    def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
        self._charge("one-shot", index, node_ids)

    def train_stage(self, stage, release, parameters) -> None:
        self.log.append(("stage", stage.name))
        self.stages.append(stage)
        release(self.roots.train_ids).sum().backward()

    def progress(self, message: str) -> None:
        pass


def with_last_edge(graph: Graph) -> tuple[Graph, tuple[int, int]]:
    """G = G' + e* with e* = (N−2, N−1): the last candidate in (u, v) order, so coins couple."""
    n = graph.num_nodes
    if (n - 1) in graph.neighbours(n - 2).tolist():
        raise ValueError("G' already has the edge")
    return add_edge(graph, n - 2, n - 1), (n - 2, n - 1)


def without_last_edge(graph: Graph) -> Graph:
    """G' = graph minus the edge (N−2, N−1), if present."""
    n = graph.num_nodes
    pairs = edge_candidates(graph)
    keep = ~((pairs[:, 0] == n - 2) & (pairs[:, 1] == n - 1))
    return build_graph(pairs[keep], n)


def step_sum(
    graph: Graph, features: torch.Tensor, encoder: RelationalEncoder, *, q: float, k: int, clip: float,
    seed: int, path: str, candidates: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """One production step's un-noised clipped gradient sum (steps I-IV) with coins ``seed``."""
    pairs = edge_candidates(graph) if candidates is None else candidates
    tuples = relation_tuples(pairs, graph.num_nodes, q, k, torch.Generator().manual_seed(seed))
    if path == "vmap":
        return clipped_gradient_sum(encoder, features, tuples, 0.2, clip, 16)
    return low_rank_clipped_gradient_sum(encoder, low_rank_layers(encoder), features, tuples, 0.2, clip, 16)


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((a[n] - b[n]).pow(2).sum()) for n in a))


def encoder_for(features: torch.Tensor, kind: str = "mlp", seed: int = 0) -> RelationalEncoder:
    torch.manual_seed(seed)
    return RelationalEncoder(rel.ENCODERS[kind](features.shape[1], 16, 8))


def neighbouring_cases() -> list[tuple[str, Graph, torch.Tensor]]:
    """G' (without e* = (N−2, N−1)), each with features: random, hubs, isolated endpoints."""
    gen = torch.Generator().manual_seed(3)
    cases = []
    for seed in range(6):
        graph = without_last_edge(random_graph(random.Random(seed), 24, 0.2))
        cases.append((f"random {seed}", graph, torch.randn(24, 6, generator=gen)))
    n = 30
    hub = build_graph(torch.tensor([[n - 1, leaf] for leaf in range(n - 2)]), n)
    cases.append(("hub gains a leaf", hub, torch.randn(n, 6, generator=gen)))
    both = build_graph(torch.tensor([[n - 1, i] for i in range(12)] + [[n - 2, i] for i in range(12, 26)]), n)
    cases.append(("two hubs joined", both, torch.randn(n, 6, generator=gen)))
    isolated = build_graph(torch.tensor([[0, 1], [2, 3], [4, 5]]), 12)
    cases.append(("isolated endpoints", isolated, torch.randn(12, 6, generator=gen)))
    same = torch.randn(1, 6, generator=gen).repeat(10, 1)
    cases.append(("identical features", without_last_edge(random_graph(random.Random(9), 10, 0.4)), same))
    return cases


def sensitivity_violations(claim: float, *, q: float, path: str, clip: float = 0.5, steps: int = 3) -> list[str]:
    found = []
    for name, small, features in neighbouring_cases():
        big, _ = with_last_edge(small)
        encoder = encoder_for(features)
        for seed in range(steps):
            change = distance(
                step_sum(big, features, encoder, q=q, k=4, clip=clip, seed=seed, path=path),
                step_sum(small, features, encoder, q=q, k=4, clip=clip, seed=seed, path=path),
            )
            if change > claim + TOLERANCE:
                found.append(f"{name}, coins {seed}: ‖Δ‖ = {change:.6f} > {claim:.6f}")
    return found


# -- the plugins -------------------------------------------------------------------------------
def test_defaults_are_the_measured_ones() -> None:
    """docs/extractors/relational.md, section 7."""
    gap = lookup("relational-gap").spec.params()
    assert (gap.hop_noise_scale, gap.encoder_epochs) == (0.5, 50)
    relational = lookup("relational").spec.params()
    assert (relational.pretrain_steps, relational.expected_batch, relational.fine_tune) == (100, 512, False)


def test_registered_with_edge_unit_and_one_shot_cost() -> None:
    for name, cls in (("relational", RelationalExtractor), ("relational-gap", RelationalGapExtractor)):
        assert lookup(name) is cls
        spec = cls.spec
        assert (spec.name, spec.privacy_unit, spec.cost_model) == (name, "edge", "one-shot")
        assert spec.accountings == ("visible-batch",) and spec.docs == "docs/extractors/relational.md"
    graph = random_graph(random.Random(0), 20, 0.3)
    assert make(graph, torch.rand(20, 5)).output_layers == 1
    assert make(graph, torch.rand(20, 5), "relational-gap", hops=2).output_layers == 3


def test_bad_params_are_refused_with_the_problem_named() -> None:
    graph = random_graph(random.Random(0), 20, 0.3)  # about 57 edges
    features = torch.rand(20, 5)
    with pytest.raises(ValueError, match="extractor.params.hop_count"):
        make(graph, features, hop_count=2)
    with pytest.raises(ValueError, match="unknown encoder 'bert'"):
        make(graph, features, encoder="bert")
    with pytest.raises(ValueError, match="steps_per_charge is set but pretrain_steps = 0"):
        make(graph, features, pretrain_steps=0, steps_per_charge=3)
    with pytest.raises(ValueError, match="steps_per_charge 30 exceeds pretrain_steps 20"):
        make(graph, features, pretrain_steps=20, steps_per_charge=30)
    with pytest.raises(ValueError, match=r"expected_batch 1000 exceeds privacy.edge_bound 60"):
        make(graph, features, expected_batch=1000, edge_bound=60)
    with pytest.raises(ValueError, match="declare a public upper bound on party A's edges, privacy.edge_bound"):
        make(graph, features, edge_bound=0)
    with pytest.raises(ValueError, match="negatives 20 needs more nodes"):
        make(graph, features, expected_batch=8, negatives=20)
    make(graph, features, expected_batch=8, negatives=19)  # every node but the anchor
    # a graph without edges is handled like any other: its schedule is a function of public settings
    edgeless = build_graph(torch.empty(0, 2, dtype=torch.int64), 20)
    session = FakeSession(20)
    empty = make(edgeless, features, expected_batch=1, edge_bound=60)
    assert empty.charge_plan(session.roots).rules == make(graph, features, expected_batch=1, edge_bound=60).charge_plan(
        session.roots
    ).rules
    empty.bind(1.0)
    empty.prepare(session)  # DP-SGD on noise alone: nothing to sample
    with pytest.raises(ValueError, match="hop_noise_scale"):
        make(graph, features, "relational-gap", expected_batch=8, hop_noise_scale=0)
    with pytest.raises(ValueError, match="fine_tune"):
        make(graph, features, "relational-gap", expected_batch=8, fine_tune=True)
    with pytest.raises(ValueError, match="degree_bound"):
        config = RunConfig(extractor=ExtractorConfig(name="relational-gap", degree_bound=4, params={"expected_batch": 8}))
        RelationalGapExtractor(ExtractorSetup(
            config=config, params=validated_params(RelationalGapExtractor.spec, config), graph=graph,
            features=features, device=torch.device("cpu"), sampling_generator=torch.Generator(),
            noise_generator=torch.Generator(), delta=1e-5,
        ))


# -- steps I and II: decoupled sampling --------------------------------------------------------------
def test_each_undirected_edge_is_one_candidate() -> None:
    graph = random_graph(random.Random(1), 40, 0.2)
    pairs = edge_candidates(graph)
    assert pairs.shape == (graph.num_edges, 2)
    assert bool((pairs[:, 0] < pairs[:, 1]).all())
    assert len({tuple(p) for p in pairs.tolist()}) == graph.num_edges
    for u, v in pairs.tolist():
        assert v in graph.neighbours(u).tolist()


def test_poisson_rate_and_random_orientation() -> None:
    graph = random_graph(random.Random(2), 60, 0.3)
    pairs = edge_candidates(graph)
    m, q, steps = pairs.shape[0], 0.1, 400
    index = {(u, v): i for i, (u, v) in enumerate(pairs.tolist())}
    secret = torch.Generator().manual_seed(0)
    kept = torch.zeros(m)
    total = anchors_low = 0
    for _ in range(steps):
        batch = sample_positive_relations(pairs, q, step_keys(secret)[0])  # a fresh key per step
        unordered = [(min(u, v), max(u, v)) for u, v in batch.tolist()]
        assert len(set(unordered)) == len(unordered)  # an edge enters a step at most once
        kept[[index[pair] for pair in unordered]] += 1
        total += batch.shape[0]
        anchors_low += int((batch[:, 0] < batch[:, 1]).sum())
    assert abs(total / steps - m * q) < 4 * math.sqrt(m * q * (1 - q) / steps)
    assert abs(anchors_low / total - 0.5) < 4 * math.sqrt(0.25 / total)
    # every candidate at rate q: the per-edge counts are Binomial(steps, q)
    assert abs(float(kept.std()) - math.sqrt(steps * q * (1 - q))) < 0.2 * math.sqrt(steps * q * (1 - q))


def test_negatives_are_distinct_uniform_and_never_the_anchor() -> None:
    anchors = torch.randint(0, 12, (6000,), generator=torch.Generator().manual_seed(0))
    positives = torch.stack([anchors, torch.arange(6000)], dim=1)  # 6000 distinct relations (u, v)
    negatives = sample_negative_entities(positives, 12, 5, (1, 2))
    assert negatives.shape == (6000, 5) and int(negatives.min()) >= 0 and int(negatives.max()) < 12
    assert not bool((negatives == anchors[:, None]).any())
    assert bool((negatives.sort(dim=1).values.diff(dim=1) > 0).all())  # without replacement
    # given its anchor, every other node is a negative with probability k/(N−1) = 5/11
    for a in range(12):
        rows = negatives[anchors == a]
        freq = torch.bincount(rows.flatten(), minlength=12).double() / rows.shape[0]
        others = torch.ones(12, dtype=torch.bool)
        others[a] = False
        tol = 5 * math.sqrt((5 / 11) * (6 / 11) / rows.shape[0])
        assert float((freq[others] - 5 / 11).abs().max()) < tol and float(freq[a]) == 0.0


@pytest.mark.parametrize("name", ["random 0", "hub gains a leaf", "isolated endpoints"])
def test_the_same_coins_give_the_same_tuples_on_neighbouring_graphs(name: str) -> None:
    """Decoupled sampling: G = G' + e* draws G's tuples plus at most e*'s; negatives never read E."""
    small, _ = next((g, f) for n, g, f in neighbouring_cases() if n == name)
    big, edge = with_last_edge(small)
    n = small.num_nodes
    for q, seed in ((1.0, 0), (0.5, 1), (0.5, 2), (0.2, 3)):
        t_small = relation_tuples(edge_candidates(small), n, q, 4, torch.Generator().manual_seed(seed))
        t_big = relation_tuples(edge_candidates(big), n, q, 4, torch.Generator().manual_seed(seed))
        assert torch.equal(t_big[: t_small.shape[0]], t_small)  # same positives, orientations and negatives
        extra = t_big[t_small.shape[0] :]
        assert extra.shape[0] <= 1
        if extra.shape[0]:
            assert sorted(extra[0, :2].tolist()) == list(edge)
        if q == 1.0:
            assert extra.shape[0] == 1


def test_the_coins_couple_wherever_the_extra_edge_sits() -> None:
    """Keyed coins (docs/privacy.md, section 2.3): an extra edge among the first candidates
    leaves every other tuple as it was."""
    small = without_last_edge(random_graph(random.Random(3), 30, 0.2))
    present = set(map(tuple, edge_candidates(small).tolist()))
    edge = next((0, v) for v in range(1, 30) if (0, v) not in present)  # node 0: among the first candidates
    big = add_edge(small, *edge)
    for q, seed in ((1.0, 0), (0.5, 1), (0.3, 2)):
        t_small = relation_tuples(edge_candidates(small), 30, q, 4, torch.Generator().manual_seed(seed))
        t_big = relation_tuples(edge_candidates(big), 30, q, 4, torch.Generator().manual_seed(seed))
        rows_small = {tuple(row) for row in t_small.tolist()}
        extra = [row for row in t_big.tolist() if tuple(row) not in rows_small]
        assert rows_small <= {tuple(row) for row in t_big.tolist()} and len(extra) <= 1
        assert all(sorted(row[:2]) == list(edge) for row in extra)
        assert len(extra) == 1 or q < 1.0


# -- steps III and IV --------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["mlp", "linear"])
def test_low_rank_per_tuple_gradients_equal_vmap(kind: str) -> None:
    """Section 3.3's low-rank form and torch.func's vmap(grad) give the same clipped sums."""
    features = torch.randn(50, 30, generator=torch.Generator().manual_seed(0))
    encoder = encoder_for(features, kind)
    tuples = torch.randint(0, 50, (40, 6), generator=torch.Generator().manual_seed(1))
    for clip in (1e-3, 0.3, 1e3):  # everything clipped, some, nothing
        exact = clipped_gradient_sum(encoder, features, tuples, 0.2, clip, 16)
        fast = low_rank_clipped_gradient_sum(encoder, low_rank_layers(encoder), features, tuples, 0.2, clip, 7)
        assert set(exact) == set(fast)
        for name in exact:
            assert torch.allclose(exact[name], fast[name], atol=1e-6, rtol=1e-4), name


def test_only_row_wise_linear_encoders_take_the_low_rank_path() -> None:
    assert len(low_rank_layers(RelationalEncoder(mlp_encoder(5, 4, 3)))) == 2
    assert len(low_rank_layers(RelationalEncoder(linear_encoder(5, 4, 3)))) == 1
    assert low_rank_layers(RelationalEncoder(nn.Sequential(nn.Linear(5, 3), nn.LayerNorm(3)))) is None
    assert low_rank_layers(RelationalEncoder(nn.Sequential(nn.Linear(5, 3), nn.BatchNorm1d(3)))) is None


def test_privatise_adds_z_c_noise_from_the_secret_generator_and_divides_by_b() -> None:
    zero = {"w": torch.zeros(200, 100)}
    draws = [privatise(zero, 1.5, 10, NoiseSource(torch.Generator().manual_seed(s)))["w"] for s in (4, 4, 5)]
    assert float(draws[0].std()) == pytest.approx(0.15, rel=0.03)
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    assert torch.equal(privatise({"w": torch.ones(3)}, 0.0, 4, NoiseSource(torch.Generator()))["w"], torch.full((3,), 0.25))


# -- empirical edge sensitivity ----------------------------------------------------------------
@pytest.mark.parametrize("path", ["low-rank", "vmap"])
def test_neighbouring_graphs_move_the_clipped_sum_by_at_most_c_and_reach_it(path: str) -> None:
    clip = 0.5
    assert sensitivity_violations(clip, q=1.0, path=path, clip=clip, steps=1) == []
    assert sensitivity_violations(clip, q=0.4, path=path, clip=clip, steps=3) == []
    # attained: with q = 1 e* is always a tuple, and its gradient (norm far above 0.5) is clipped to C
    small, features = next((g, f) for n, g, f in neighbouring_cases() if n == "hub gains a leaf")
    big, _ = with_last_edge(small)
    encoder = encoder_for(features)
    change = distance(
        step_sum(big, features, encoder, q=1.0, k=4, clip=clip, seed=0, path=path),
        step_sum(small, features, encoder, q=1.0, k=4, clip=clip, seed=0, path=path),
    )
    assert change == pytest.approx(clip, rel=1e-4)


def test_a_claim_of_half_c_is_caught() -> None:
    assert sensitivity_violations(0.25, q=1.0, path="low-rank", clip=0.5, steps=1)


def test_both_orientations_as_candidates_would_need_2c() -> None:
    """Why one undirected edge is ONE candidate: with (u, v) and (v, u) both candidates, e*
    enters a step twice and the sum moves by up to 2C, which the charged C does not cover."""
    small, features = next((g, f) for n, g, f in neighbouring_cases() if n == "two hubs joined")
    big, edge = with_last_edge(small)
    encoder = encoder_for(features)
    pairs = edge_candidates(small)
    both_small = torch.cat([pairs, pairs.flip(1)])
    star = torch.tensor([edge])
    both_big = torch.cat([both_small, star, star.flip(1)])  # e*'s two rows last: the other coins stay coupled
    change = distance(
        step_sum(big, features, encoder, q=1.0, k=4, clip=0.5, seed=0, path="low-rank", candidates=both_big),
        step_sum(small, features, encoder, q=1.0, k=4, clip=0.5, seed=0, path="low-rank", candidates=both_small),
    )
    assert 0.5 + 0.1 < change <= 1.0 + TOLERANCE


# -- charging --------------------------------------------------------------------------------------
def schedule_graph() -> tuple[Graph, torch.Tensor]:
    """About 120 edges: ⌈|E|/20⌉ steps per epoch at expected_batch 20."""
    graph = random_graph(random.Random(5), 40, 0.15)
    return graph, torch.rand(40, 6, generator=torch.Generator().manual_seed(0))


def epoch_steps(graph: Graph) -> int:
    return math.ceil(graph.num_edges / 20)


def test_relational_plan_is_pre_train_poisson_gaussians_and_free_training() -> None:
    graph, features = schedule_graph()
    m = graph.num_edges
    per_epoch = epoch_steps(graph)
    ex = make(graph, features, pretrain_steps=3 * per_epoch, expected_batch=20)
    plan = ex.charge_plan(root_plan(40))
    rules = {rule.kind: rule for rule in plan.rules}
    assert set(rules) == {"pre-train", "train", "eval"}
    assert rules["train"].mechanism == rules["eval"].mechanism == "no-op"
    pre = rules["pre-train"]
    assert (pre.participation_bound, pre.repeats, pre.sampling_probability) == (None, per_epoch, pytest.approx(20 / m))
    z = 1.3
    assert pre.event(z) == dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(20 / m, dpa.GaussianDpEvent(z)), per_epoch)
    assert plan.pre_train_releases == 3 and plan.one_shot_releases == 0 and plan.stages == ()
    assert plan.sensitivity == 1.0 and plan.participation_bound == 0
    assert plan.passes(5, root_plan(40))[0].kind == "pre-train"


def test_relational_gap_plan_adds_k_one_shot_gaussians_at_the_hop_scale() -> None:
    graph, features = schedule_graph()
    ex = make(graph, features, "relational-gap", hops=2, pretrain_steps=2 * epoch_steps(graph), expected_batch=20,
              hop_noise_scale=0.6, encoder_epochs=3)
    plan = ex.charge_plan(root_plan(40))
    rules = {rule.kind: rule for rule in plan.rules}
    assert set(rules) == {"pre-train", "one-shot", "train", "eval"}
    assert rules["one-shot"].event(2.0) == dpa.GaussianDpEvent(1.2)
    assert rules["one-shot"].participation_bound is None
    assert plan.one_shot_releases == 2 and plan.pre_train_releases == 2
    assert plan.stages == (Stage(name="encoder", epochs=3, layers=1),)
    assert plan.sensitivity == pytest.approx(0.6 * math.sqrt(2))


@pytest.mark.parametrize("name", ["relational", "relational-gap"])
def test_epsilon_is_the_composed_pre_training_and_hops_whatever_the_epochs(name: str) -> None:
    graph, features = schedule_graph()
    ex = make(graph, features, name, hops=2, pretrain_steps=2 * epoch_steps(graph), expected_batch=20,
              **({"hop_noise_scale": 0.7} if name == "relational-gap" else {}))
    roots = root_plan(40)
    plan = ex.charge_plan(roots)
    z, delta = 1.1, 1e-5
    events = {rule.kind: rule.event(z) for rule in plan.rules}
    bounds = {rule.kind: rule.participation_bound for rule in plan.rules}
    epsilons = {
        epochs: spent("visible-batch", "pld", delta, events, counted_per_kind(plan.passes(epochs, roots), bounds)).epsilon
        for epochs in (1, 5, 50)
    }
    q, repeats = 20 / graph.num_edges, math.ceil(graph.num_edges / 20)
    parts = [dpa.SelfComposedDpEvent(dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), repeats), 2)]
    if name == "relational-gap":
        parts.append(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(0.7 * z), 2))
    expected = epsilon_of(dpa.ComposedDpEvent(parts), delta).epsilon
    assert epsilons[1] == epsilons[5] == epsilons[50] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("steps", "per_charge"), [(30, None), (30, 4), (30, 30), (3, None)])
def test_every_planned_step_is_charged_and_every_charged_step_runs(
    steps: int, per_charge: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph, features = schedule_graph()
    spc = per_charge or min(epoch_steps(graph), steps)  # default: one epoch, at most T
    releases = math.ceil(steps / spc)  # rounded up: a partial chunk is charged, and run, whole
    params: dict[str, object] = {"pretrain_steps": steps, "expected_batch": 20}
    if per_charge:
        params["steps_per_charge"] = per_charge
    ex = make(graph, features, **params)
    plan = ex.charge_plan(root_plan(40))
    assert plan.pre_train_releases == releases and plan.rules[-1].repeats == spc
    log: list = []
    real = rel.RelationalPretraining.step
    monkeypatch.setattr(rel.RelationalPretraining, "step", lambda self, opt: log.append(("step",)) or real(self, opt))
    ex.bind(1.0)
    ex.prepare(FakeSession(40, log))
    run = sum(1 for entry in log if entry == ("step",))
    assert run == releases * spc >= steps
    # write-ahead: chunk i's charge comes before each of its steps
    assert log[:: spc + 1] == [("pre-train", i) for i in range(releases)]
    assert len(log) == releases * (spc + 1)


def test_a_refused_chunk_stops_pre_training_and_nothing_is_released() -> None:
    graph, features = schedule_graph()
    for name in ("relational", "relational-gap"):
        ex = make(graph, features, name, pretrain_steps=3 * epoch_steps(graph), expected_batch=20)
        ex.bind(1.0)
        session = FakeSession(40, refuse=("pre-train", 1))
        with pytest.raises(BudgetRefused):
            ex.prepare(session)
        assert [(k, i) for k, i, _ in session.charged] == [("pre-train", 0)]
        with pytest.raises(RuntimeError, match="prepare"):
            ex.release(torch.arange(5), "train")


# -- what B receives ---------------------------------------------------------------------------
@pytest.mark.parametrize("fine_tune", [False, True])
def test_relational_serves_unit_per_node_embeddings(fine_tune: bool) -> None:
    graph, features = schedule_graph()
    ex = make(graph, features, expected_batch=20, fine_tune=fine_tune)
    ex.bind(0.8)
    before = {n: p.detach().clone() for n, p in ex.encoder.named_parameters()}
    session = FakeSession(40)
    ex.prepare(session)
    assert all(torch.equal(nodes, torch.arange(40)) for _, _, nodes in session.charged)
    assert any(not torch.equal(before[n], p) for n, p in ex.encoder.named_parameters())  # pre-training moved Θ
    roots = torch.tensor([3, 0, 39, 3])
    out = ex.release(roots, "train")
    assert out.shape == (4, 8, 1)
    assert torch.allclose(out.norm(dim=1), torch.ones(4, 1), atol=1e-5)
    assert out.requires_grad == fine_tune and not ex.release(roots, "eval").requires_grad
    assert bool(ex.trainable_parameters()) == fine_tune
    # per node, no neighbour aggregation: a node's row reads its own features only
    assert torch.allclose(out[1, :, 0], ex.encoder(features[0:1])[0], atol=1e-6)


def test_pre_training_then_stage_then_hops_in_that_order() -> None:
    graph, features = schedule_graph()
    ex = make(graph, features, "relational-gap", hops=2, pretrain_steps=2 * epoch_steps(graph), expected_batch=20,
              encoder_epochs=1)
    ex.bind(0.7)
    assert ex.noise_std == pytest.approx(0.5 * 0.7 * math.sqrt(2))  # the default s = 0.5
    session = FakeSession(40)
    ex.prepare(session)
    assert session.log == [("pre-train", 0), ("pre-train", 1), ("stage", "encoder"), ("one-shot", 0), ("one-shot", 1)]
    out = ex.release(torch.arange(40), "train")
    assert out.shape == (40, 8, 3) and not out.requires_grad and ex.trainable_parameters() == []
    assert torch.allclose(out[:, :, 0], encode_all(ex.encoder, features), atol=1e-6)  # x̃_0: the frozen encoder


def test_relational_gap_hops_change_by_at_most_root_two() -> None:
    """GAP's hop through the pre-trained encoder's x̃_0 on G' and G: only rows u*, v* move, ≤ √2."""
    small = without_last_edge(random_graph(random.Random(6), 30, 0.15))
    big, (u, v) = with_last_edge(small)
    features = torch.rand(30, 6, generator=torch.Generator().manual_seed(1))
    exs = [make(g, features, "relational-gap", expected_batch=5) for g in (small, big)]
    for ex in exs:
        ex.bind(None)
    x0 = row_normalise(encode_all(exs[0].encoder, features))
    delta = exs[1].noisy_hop(x0) - exs[0].noisy_hop(x0)
    assert set(delta.abs().sum(1).nonzero().flatten().tolist()) <= {u, v}
    assert float(delta.norm()) <= HOP_SENSITIVITY + TOLERANCE
    assert float(delta.norm()) == pytest.approx(math.sqrt(2), abs=1e-5)


def test_at_infinite_epsilon_nothing_is_noised() -> None:
    graph, features = schedule_graph()
    runs = []
    for noise_seed in (1, 2):
        ex = make(graph, features, expected_batch=20, noise_seed=noise_seed)
        ex.bind(None)
        assert ex.pretraining.noise_std == 0.0
        ex.prepare(FakeSession(40))
        runs.append(ex.release(torch.arange(40), "eval"))
    assert torch.equal(runs[0], runs[1])  # A's noise generator was never read
