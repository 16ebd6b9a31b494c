"""The one-run canary audit (docs/audit-canaries.md) and TFTS at party A.

Statistics: the ε lower bound of Steinke, Nasr and Jagielski's Theorem 3.1 against closed
forms and a brute-force evaluation; over many simulated randomised-response canaries the
bound exceeds the true ε no more often than its confidence allows; it rises toward the
truth as m grows; a mechanism weaker than claimed is caught.

Party A: candidates are disjoint pairs of low-degree training roots, no two endpoints
adjacent, from the public seed; the coins come from A's secret generator; planting adds
exactly the included pairs; TFTS refuses what its plan cannot cover and builds the
training extractor on the induced subgraph.

Per-release white-box statistics (party_a.canary_statistics): without noise both scores
tell every coin through a real extractor; on a simulated Gaussian mechanism of known ε the
linear test stays below ε, comes within 70 % of a perfect attack where ε is large, and is
at chance without a signal; noise smaller than charged is caught.

Through the services (one cluster): Cora with 200 canaries at ε = ∞ (both white-box scores
find every canary; the replay has no evaluation release to use; B's own similarity score
is reported) and at ε = 1 (charged exactly as the same run without canaries; every bound ≤
the accountant's ε); TFTS on a tiny graph (posteriors for train, val and test; a training
node whose only neighbour is a test node is released as if it had none); GAP under TFTS
refused before anything is charged. In one process: a trainer whose noise is cut after
calibration yields a bound above the ε it was charged.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from conftest import random_graph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from vesper.auditor.canary_replay import audit_canaries_replayed
from vesper.auditor.canary_scores import (
    audit_canaries,
    audit_canaries_white_box,
    load_statistics,
    mechanism_scores,
    release_scores,
)
from vesper.auditor.one_run_bound import (
    OneRunAudit,
    canary_audit,
    count_correct,
    epsilon_lower_bound,
    guess_from_scores,
    guess_grid,
    p_value,
)
from vesper.auditor.received_releases import ReceivedReleases
from vesper.common.config import DEFAULT_DELTA, RunConfig, RunSummary
from vesper.common.dataset_files import load_graph_part, resolve_dataset
from vesper.common.privacy.accounting import gaussian_epsilon
from vesper.party_a.canaries import (
    CanaryDraw,
    canary_generator,
    candidate_pairs,
    draw_canaries,
    draw_coins,
    plant,
    with_all_candidates,
    without_candidates,
)
from vesper.party_a.canary_statistics import (
    CanaryStatistics,
    observe_releases,
    unsupported_reason,
)
from vesper.party_a.extractors.base import ChargePlan, ExtractorSetup, RootPlan
from vesper.party_a.extractors.pmp_plugin import MlpPlugin, PmpGcnPlugin, PmpGinPlugin
from vesper.party_a.graph_store import Graph, build_graph, induced_subgraph
from vesper.party_a.membership_audit import check_tfts, same_charges
from vesper.party_b.release_record import ReleaseRecord

# -- the bound (auditor.one_run_bound) --------------------------------------------------


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


@given(r=st.integers(1, 2000), confidence=st.sampled_from([0.9, 0.95, 0.99]))
@settings(max_examples=30, deadline=None)
def test_all_guesses_right_matches_the_closed_form(r: int, confidence: float) -> None:
    """δ = 0, v = r: P[W̃ ≥ r] = q^r, so the bound is logit((1 − c)^{1/r})."""
    expected = _logit((1.0 - confidence) ** (1.0 / r))
    assert epsilon_lower_bound(r, r, 0.0, confidence) == pytest.approx(max(expected, 0.0), abs=1e-5)


def _brute_p_value(r: int, v: int, epsilon: float, delta: float, m: int) -> float:
    """Theorem 3.1's f(v) term by term, the max over every i ∈ [m] (no shortcut)."""
    q = math.exp(epsilon) / (1.0 + math.exp(epsilon))
    pmf = [math.comb(r, k) * q**k * (1 - q) ** (r - k) for k in range(r + 1)]
    tail = sum(pmf[k] for k in range(r + 1) if k >= v)
    alpha = max(sum(pmf[k] for k in range(r + 1) if v - i <= k < v) / i for i in range(1, m + 1))
    return min(1.0, tail + 2 * m * delta * alpha)


@given(
    r=st.integers(1, 14), data=st.data(), epsilon=st.floats(0.0, 5.0),
    delta=st.sampled_from([0.0, 1e-4, 1e-3, 0.02]),
)
@settings(max_examples=60, deadline=None)
def test_p_value_matches_a_brute_force_evaluation(r: int, data, epsilon: float, delta: float) -> None:
    v = data.draw(st.integers(0, r))
    m = data.draw(st.integers(r, 20))
    assert p_value(r, v, epsilon, delta, m) == pytest.approx(_brute_p_value(r, v, epsilon, delta, m), rel=1e-9, abs=1e-12)


def test_chance_level_guesses_bound_nothing_and_bad_counts_are_refused() -> None:
    assert epsilon_lower_bound(1000, 500, 1e-5) == 0.0
    assert epsilon_lower_bound(0, 0, 0.0) == 0.0
    assert epsilon_lower_bound(1000, 560, 0.0) > 0.0
    with pytest.raises(ValueError):
        epsilon_lower_bound(10, 11, 0.0)
    with pytest.raises(ValueError):
        epsilon_lower_bound(10, 5, 0.0, m=9)


def test_delta_costs_the_bound() -> None:
    """The 2mδ term: the same guesses bound less as δ (or m) grows."""
    pure = epsilon_lower_bound(600, 600, 0.0, 0.95, 1000)
    small = epsilon_lower_bound(600, 600, 1e-5, 0.95, 1000)
    large = epsilon_lower_bound(600, 600, 1e-3, 0.95, 1000)
    assert pure > small > large > 0
    assert epsilon_lower_bound(600, 600, 1e-3, 0.95, 600) > large


def _randomised_response(rng: np.random.Generator, m: int, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """ε-DP per canary: the score tells S_i truly with probability e^ε/(1+e^ε); ties broken at random."""
    included = rng.random(m) < 0.5
    truthful = rng.random(m) < (1.0 if math.isinf(epsilon) else 1.0 / (1.0 + math.exp(-epsilon)))
    told = np.where(truthful, included, ~included)
    return np.where(told, 1.0, -1.0) + 0.01 * rng.random(m), included


@given(epsilon=st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]), seed=st.integers(0, 2**31), delta=st.sampled_from([0.0, 1e-4]))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_bound_rarely_exceeds_the_true_epsilon(epsilon: float, seed: int, delta: float) -> None:
    """200 one-run audits of an ε-DP mechanism with the optimal attack: the reported bound
    (best of the grid) exceeds ε in at most 1 − c of them, plus sampling slack."""
    rng = np.random.default_rng(seed)
    above = sum(
        canary_audit(*_randomised_response(rng, 200, epsilon), delta, 0.95).epsilon_lower_bound > epsilon
        for _ in range(200)
    )
    assert above / 200 <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 200)


def test_the_bound_rises_toward_the_truth_as_m_grows() -> None:
    rng = np.random.default_rng(7)
    bounds = [canary_audit(*_randomised_response(rng, m, 2.0), 0.0).epsilon_lower_bound for m in (100, 1000, 20000)]
    assert bounds[0] < bounds[1] < bounds[2] <= 2.0
    assert bounds[2] > 1.8
    perfect = [canary_audit(*_randomised_response(rng, m, math.inf), 0.0).epsilon_lower_bound for m in (100, 1000, 10000)]
    assert perfect[0] < perfect[1] < perfect[2] and perfect[0] > 2.0  # k is fixed, so even a perfect attack errs


def test_a_mechanism_weaker_than_claimed_is_caught() -> None:
    """A planted bug: the code claims ε = 1 but releases ε = 3 randomised response."""
    audit = canary_audit(*_randomised_response(np.random.default_rng(3), 1000, 3.0), 1e-5)
    assert audit.epsilon_lower_bound > 1.0
    assert audit.confidence == 0.95 and audit.grid_size == len(guess_grid(1000))


def test_guesses_follow_the_scores_and_abstain_on_nan() -> None:
    scores = np.array([0.9, np.nan, 0.1, 0.5, -2.0, 3.0])
    guesses = guess_from_scores(scores, 2, 1)
    assert guesses.tolist() == [1, 0, 0, 0, -1, 1]
    included = np.array([True, True, False, False, False, False])
    assert count_correct(guesses, included) == 2  # canary 0 in, canary 4 out; canary 5 wrongly "in"
    audit = canary_audit(scores, included, 0.0)
    assert audit.scored == 5 and audit.m == 6 and audit.abstained == 6 - audit.guesses
    assert all(k_plus + k_minus <= 5 for k_plus, k_minus in guess_grid(5))


# -- party A's canaries (party_a.canaries) -----------------------------------------------------


@given(
    candidate_seed=st.integers(0, 2**32 - 1), graph_seed=st.integers(0, 1000), fanout=st.sampled_from([0, 3, 10]),
)
@settings(max_examples=25, deadline=None)
def test_candidates_are_low_degree_independent_training_roots(candidate_seed: int, graph_seed: int, fanout: int) -> None:
    graph = random_graph(random.Random(graph_seed), 80, 0.05)
    roots = np.random.default_rng(graph_seed).choice(80, 50, replace=False)
    pairs = candidate_pairs(graph, roots, 12, candidate_seed, fanout)
    endpoints = pairs.reshape(-1)
    degree = graph.degree.numpy()
    assert pairs.shape[0] <= 12 and np.unique(endpoints).size == endpoints.size  # no node in two pairs
    assert np.isin(endpoints, roots).all()  # training roots only: released every epoch
    edges = {(int(a), int(b)) for a, b in zip(graph.slot_rows.tolist(), graph.indices.tolist())}
    assert not any((int(a), int(b)) in edges for a in endpoints for b in endpoints)  # an independent set
    if fanout:
        assert (degree[endpoints] + 1 <= fanout).all()  # the canary keeps the whole neighbourhood in the sample
    # greedy by degree: a qualifying root of smaller degree than a chosen one is chosen or next to one
    qualifying = [r for r in roots.tolist() if not fanout or degree[r] + 1 <= fanout]
    if pairs.shape[0] == 12:
        top = degree[endpoints].max()
        chosen = set(endpoints.tolist())
        for r in qualifying:
            if degree[r] < top and r not in chosen:
                assert any((r, c) in edges for c in chosen)
    assert np.array_equal(pairs, candidate_pairs(graph, roots, 12, candidate_seed, fanout))


def test_a_draw_keeps_as_many_canaries_as_fit_and_refuses_none() -> None:
    graph = random_graph(random.Random(0), 20, 0.2)
    coins = draw_coins(50, torch.Generator().manual_seed(3))
    draw = draw_canaries(graph, coins, 0, np.arange(20))
    assert 0 < draw.m < 50 and np.array_equal(draw.included, coins[: draw.m])
    star = build_graph(torch.tensor([[0, i] for i in range(1, 8)]), 8)
    with pytest.raises(ValueError, match="canary endpoints"):
        draw_canaries(star, coins, 0, np.arange(8), fanout=1)  # fanout 1 needs isolated nodes; a star has none
    assert draw_canaries(star, coins, 0, np.arange(8), fanout=3).m == 3  # the leaves, never the hub


def test_the_coins_are_fair_and_come_from_the_secret_generator() -> None:
    coins = draw_coins(2000, torch.Generator().manual_seed(11))
    assert abs(coins.mean() - 0.5) < 4 * math.sqrt(0.25 / 2000)
    assert np.array_equal(coins, draw_coins(2000, torch.Generator().manual_seed(11)))
    assert not np.array_equal(coins, draw_coins(2000, torch.Generator().manual_seed(12)))
    graph = random_graph(random.Random(1), 400, 0.005)
    a = draw_canaries(graph, coins, 3, np.arange(400))
    b = draw_canaries(graph, draw_coins(2000, torch.Generator().manual_seed(12)), 3, np.arange(400))
    assert np.array_equal(a.pairs, b.pairs)  # the candidates do not depend on the secret
    # A's secret seed (tests only: secret_seed set) fixes the coins; another secret seed moves them
    assert canary_generator(5, 0).initial_seed() == canary_generator(5, 0).initial_seed()
    assert canary_generator(5, 0).initial_seed() != canary_generator(6, 0).initial_seed()


def test_planting_adds_exactly_the_included_pairs(tmp_path: Path) -> None:
    graph = random_graph(random.Random(2), 80, 0.05)
    before = (graph.indptr.clone(), graph.indices.clone())
    draw = draw_canaries(graph, draw_coins(30, torch.Generator().manual_seed(4)), 9, np.arange(80))
    planted = plant(graph, draw)
    assert torch.equal(graph.indptr, before[0]) and torch.equal(graph.indices, before[1])  # the original is untouched
    assert planted.num_edges == graph.num_edges + int(draw.included.sum())

    def edge_set(g: Graph) -> set[tuple[int, int]]:
        return {(a, b) for a, b in zip(g.slot_rows.tolist(), g.indices.tolist())}

    added = edge_set(planted) - edge_set(graph)
    expected = {(int(u), int(v)) for u, v in draw.pairs[draw.included]}
    assert added == expected | {(v, u) for u, v in expected}  # undirected, like every edge of the CSR
    # the two hypotheses the white-box statistics compare, neither of which reads the coins
    assert edge_set(without_candidates(planted, draw)) == edge_set(graph)
    every = {(int(u), int(v)) for u, v in draw.pairs}
    assert edge_set(with_all_candidates(graph, draw)) - edge_set(graph) == every | {(v, u) for u, v in every}
    draw.save(tmp_path / "canaries.npz")
    loaded = CanaryDraw.load(tmp_path / "canaries.npz")
    assert np.array_equal(loaded.pairs, draw.pairs) and np.array_equal(loaded.included, draw.included)
    assert loaded.candidate_seed == 9 and loaded.m == draw.m


# -- per-release white-box statistics (party_a.canary_statistics) ------------------------------


def _pmp(cls: type, graph: Graph, layers: int = 1) -> PmpGcnPlugin:
    config = RunConfig.model_validate({"extractor": {"name": cls.spec.name, "dropout": 0.0, "layers": layers}})
    setup = ExtractorSetup(
        config=config, params=cls.spec.params(), graph=graph,
        features=torch.rand(graph.num_nodes, 8, generator=torch.Generator().manual_seed(0)), device=torch.device("cpu"),
        sampling_generator=torch.Generator().manual_seed(1), noise_generator=torch.Generator().manual_seed(2), delta=1e-3,
    )
    return cls(setup)


def _received(record: ReleaseRecord) -> ReceivedReleases:
    empty = np.zeros(0, np.int64)
    return ReceivedReleases(
        record.train_sum.numpy(), record.train_count.numpy(), record.eval_embedding.numpy(), record.eval_seen.numpy(),
        empty, empty, np.zeros((0, 2), np.float32),
    )


@pytest.mark.parametrize("cls", [PmpGcnPlugin, PmpGinPlugin])
def test_without_noise_every_release_tells_the_coin(cls: type) -> None:
    """Noise 0, no dropout: each noisy aggregate is exactly a_in or a_out, so the mechanism
    statistic is ±‖Δ‖²/2 per release and both scores separate the canaries perfectly."""
    graph = random_graph(random.Random(0), 300, 0.01)
    draw = draw_canaries(graph, draw_coins(60, torch.Generator().manual_seed(1)), 0, np.arange(300), fanout=10)
    extractor = _pmp(cls, plant(graph, draw))
    extractor.bind(None)
    extractor.train()
    statistics = CanaryStatistics(draw, 300, 64, 1)
    observe_releases(extractor, statistics)
    record = ReleaseRecord(300, 64, 1)
    for _ in range(3):
        for batch in torch.randperm(300, generator=torch.Generator().manual_seed(5)).split(64):
            with torch.no_grad():
                record.add_training(batch, extractor.release(batch, "train"))
    stats = {"endpoints": statistics.endpoints, "mechanism": statistics.mechanism.numpy(),
             "delta_sum": statistics.delta_sum.numpy(), "mid_sum": statistics.mid_sum.numpy(),
             "releases": statistics.releases.numpy()}
    assert (stats["releases"] == 3).all()
    for scores in (mechanism_scores(draw, stats), release_scores(draw, stats, _received(record))):
        assert np.array_equal(scores > 0, draw.included) and (scores != 0).all()
    record.add_training(torch.tensor(draw.pairs[:1, 0]), torch.zeros(1, 64, 1))  # a release A did not count
    with pytest.raises(ValueError, match="different releases"):
        release_scores(draw, stats, _received(record))


def test_the_statistics_refuse_what_they_do_not_cover() -> None:
    graph = random_graph(random.Random(1), 40, 0.1)
    assert unsupported_reason(_pmp(PmpGcnPlugin, graph)) == ""
    assert "layers=2" in unsupported_reason(_pmp(PmpGcnPlugin, graph, layers=2))
    assert "not a per-step PMP" in unsupported_reason(_pmp(MlpPlugin, graph))


def _gaussian_run(
    rng: np.random.Generator, m: int, passes: int, z: float, signal: float = 1.0, noise_scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """The linear test on a simulated Gaussian mechanism, through CanaryStatistics: per pass, each
    canary's two endpoints are released once, together with sensitivity S = 1 (‖Δ_u‖ = ‖Δ_v‖ = 1/√2),
    noise std ``noise_scale`` · z. Returns (scores, coins)."""
    dim = 8
    included = rng.random(m) < 0.5
    draw = CanaryDraw(np.arange(2 * m).reshape(m, 2), included, 0)
    statistics = CanaryStatistics(draw, 2 * m, dim, 1)
    shape = (passes * 2 * m, dim)  # every pass's releases at once: the sums do not care about order
    a_out = rng.random(shape)
    direction = rng.standard_normal(shape)
    a_in = a_out + signal * direction / np.linalg.norm(direction, axis=1, keepdims=True) / math.sqrt(2)
    truth = np.tile(np.repeat(included, 2), passes)[:, None]
    noisy = np.where(truth, a_in, a_out) + noise_scale * z * rng.standard_normal(shape)
    a_out, a_in, noisy = (torch.from_numpy(x) for x in (a_out, a_in, noisy))
    statistics.add(torch.arange(2 * m).repeat(passes), noisy, a_out, a_in, a_out, a_in)
    stats = {"endpoints": statistics.endpoints, "mechanism": statistics.mechanism.numpy(), "releases": statistics.releases.numpy()}
    return mechanism_scores(draw, stats), included


def _perfect_bound(m: int, delta: float) -> float:
    """What a perfect attack on m canaries could show (the grid's k caps it, and δ's 2mδ term)."""
    included = np.arange(m) % 2 == 0
    return canary_audit(included + np.linspace(0, 1e-3, m), included, delta).epsilon_lower_bound


def test_the_linear_test_is_valid_and_strong_on_a_gaussian_mechanism() -> None:
    """The mechanism statistic on a known Gaussian mechanism (T = 21 passes at z: the true
    ε(δ) is one Gaussian's at z/√T). Where the truth is within reach of m = 400 canaries
    the bound stays below it (at most 1 − c of the audits may exceed it); where it is far
    above, the bound reaches 70 % of what a perfect attack could show; without a signal, 0."""
    rng = np.random.default_rng(0)
    delta, passes, m = 1e-4, 21, 400
    near = gaussian_epsilon(7.0 / math.sqrt(passes), delta)
    assert 1.5 < near < _perfect_bound(m, delta)
    bounds = [canary_audit(*_gaussian_run(rng, m, passes, 7.0), delta).epsilon_lower_bound for _ in range(8)]
    assert sum(b > near for b in bounds) <= 1 and max(bounds) > 0
    strong = [canary_audit(*_gaussian_run(rng, m, passes, 1.6), delta).epsilon_lower_bound for _ in range(2)]
    assert min(strong) > 0.7 * _perfect_bound(m, delta) and gaussian_epsilon(1.6 / math.sqrt(passes), delta) > 10
    blind = [canary_audit(*_gaussian_run(rng, m, passes, 1.6, signal=0.0), delta).epsilon_lower_bound for _ in range(5)]
    assert sum(b > 0 for b in blind) <= 1


def test_noise_smaller_than_charged_is_caught() -> None:
    """A planted bug: the accountant charges z, the mechanism adds z/8."""
    delta, passes, z = 1e-4, 21, 12.0
    charged = gaussian_epsilon(z / math.sqrt(passes), delta)
    honest = canary_audit(*_gaussian_run(np.random.default_rng(1), 400, passes, z), delta)
    buggy = canary_audit(*_gaussian_run(np.random.default_rng(1), 400, passes, z, noise_scale=0.125), delta)
    assert honest.epsilon_lower_bound <= charged < buggy.epsilon_lower_bound


# -- TFTS at party A (party_a.run.audit_hooks) ----------------------------------------------------------


def test_induced_subgraph_keeps_the_edges_inside_the_nodes() -> None:
    graph = random_graph(random.Random(3), 40, 0.2)
    nodes = torch.arange(0, 40, 3)
    sub = induced_subgraph(graph, nodes)
    inside = set(nodes.tolist())
    full = {(a, b) for a, b in zip(graph.slot_rows.tolist(), graph.indices.tolist())}
    kept = {(a, b) for a, b in zip(sub.slot_rows.tolist(), sub.indices.tolist())}
    assert kept == {(a, b) for a, b in full if a in inside and b in inside} and sub.num_nodes == 40


def _pmp_gcn(graph: Graph, config: RunConfig) -> PmpGcnPlugin:
    features = torch.rand(graph.num_nodes, 8, generator=torch.Generator().manual_seed(0))
    setup = ExtractorSetup(
        config=config, params=PmpGcnPlugin.spec.params(), graph=graph, features=features, device=torch.device("cpu"),
        sampling_generator=torch.Generator().manual_seed(1), noise_generator=torch.Generator().manual_seed(2), delta=1e-3,
    )
    return PmpGcnPlugin(setup)


def test_tfts_refuses_pate_and_plans_that_depend_on_the_graph() -> None:
    graph = random_graph(random.Random(4), 30, 0.2)
    config = RunConfig.model_validate({"extractor": {"name": "pmp-gcn"}, "audit": {"membership": True}})
    extractor = _pmp_gcn(graph, config)
    check_tfts(config, extractor)  # a per-step extractor is fine
    pate = config.model_copy(update={"label_privacy": config.label_privacy.model_copy(update={"mode": "pate"})})
    with pytest.raises(ValueError, match="pate"):
        check_tfts(pate, extractor)
    ids = torch.arange(30)
    roots = RootPlan(ids[:15], ids[15:22], ids[22:], 1, 2)
    on_subgraph = _pmp_gcn(induced_subgraph(graph, roots.train_ids), config).charge_plan(roots)
    same_charges(on_subgraph, extractor.charge_plan(roots), "pmp-gcn")  # PMP's charge does not read the graph
    other = ChargePlan(on_subgraph.rules, on_subgraph.sensitivity * 2)
    with pytest.raises(ValueError, match="sensitivity"):
        same_charges(on_subgraph, other, "x")


# -- through the services ---------------------------------------------------------------------

TINY_TRAIN, TINY_VAL, TINY_TEST = list(range(0, 6)), [6, 7, 8], [9, 10, 11]
# node 0's only neighbour is test node 9; the rest link training nodes and cross the split
TINY_EDGES = [(0, 9), (1, 2), (2, 3), (3, 4), (4, 5), (1, 6), (5, 10), (7, 8), (9, 11), (3, 11)]


def _tiny_dataset(path: Path) -> Path:
    rng = np.random.default_rng(0)
    n = 12
    masks = [np.isin(np.arange(n), ids)[None, :] for ids in (TINY_TRAIN, TINY_VAL, TINY_TEST)]
    np.savez(
        path, node_features=rng.random((n, 8)).astype(np.float32), node_labels=np.array([0, 1] * 6),
        edges=np.array(TINY_EDGES), train_masks=masks[0], val_masks=masks[1], test_masks=masks[2],
    )
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from vesper.coordinator.processes import LocalCluster

    workdir = tmp_path_factory.mktemp("canary-cluster")
    tiny = _tiny_dataset(workdir / "tiny.npz")
    with LocalCluster(workdir, party_a={"secret_seed": 7}, datasets={"tiny": str(tiny)}) as c:
        yield c


def _run(cluster, **config) -> RunSummary:
    from vesper.coordinator.run_client import drive_run

    base = {"dataset": "cora", "epochs": 1, "extractor": {"name": "pmp-gcn"}}
    summary = drive_run(cluster.party_a_address, RunConfig.model_validate({**base, **config}), Console(quiet=True))
    return summary


def _records(cluster, run_id: str) -> tuple[Path, ReceivedReleases]:
    run_dir = cluster.workdir / "party_a" / "runs" / run_id
    return run_dir, ReceivedReleases.load(cluster.workdir / "party_b" / "runs" / run_id / "received.npz")


CANARIES = {"canaries": 200, "canary_seed": 1, "record_releases": True}
EXACT = {"name": "pmp-gcn", "dropout": 0.0}  # no dropout: A's references are the releases' exact means


@pytest.mark.e2e
def test_canaries_without_noise_are_found(cluster) -> None:
    summary = _run(cluster, privacy={"epsilon": math.inf}, audit=CANARIES, extractor=EXACT)
    assert summary.status == "completed", summary.message
    run_dir, received = _records(cluster, summary.run_id)
    draw = CanaryDraw.load(run_dir / "canaries.npz")
    assert draw.m == 200 and 0 < draw.included.sum() < 200
    assert (received.train_count[draw.pairs] == 1).all()  # training roots, one epoch: one release each
    cora = load_graph_part(resolve_dataset("cora"))
    assert summary.delta == DEFAULT_DELTA  # declared: the planted edges move no public number
    stats = load_statistics(run_dir)
    for scores in (mechanism_scores(draw, stats), release_scores(draw, stats, received)):
        assert np.array_equal(scores > 0, draw.included)  # no noise: every canary told apart
    for audit in audit_canaries_white_box(draw, received, run_dir, summary.delta, 0.95):
        # m = 200 right guesses bound ε from below by more than 2 (docs, section 4); k₊ = k₋ = m/2 errs when S is unbalanced
        assert audit.epsilon_lower_bound > 2.0
    with pytest.raises(ValueError, match="evaluation pass"):  # the replay needs evaluation releases
        audit_canaries_replayed(draw, received, run_dir, cora.edges, cora.features, summary.delta, 0.95)
    b_view = audit_canaries(draw, received, summary.delta, 0.95)  # reported in docs/audit-canaries.md: weak
    assert isinstance(b_view, OneRunAudit) and b_view.scored == 200


@pytest.mark.e2e
def test_canaries_are_charged_like_any_edge_and_bounded_by_the_accountant(cluster) -> None:
    fixed = {"epsilon": 1.0, "delta": 1e-4}
    with_canaries = _run(cluster, privacy=fixed, audit=CANARIES)
    without = _run(cluster, privacy=fixed)
    for s in (with_canaries, without):
        assert s.status == "completed", s.message
    assert with_canaries.noise_multiplier == without.noise_multiplier
    assert with_canaries.epsilon_spent == pytest.approx(without.epsilon_spent) and without.epsilon_spent <= 1.0
    rows = [httpx.get(f"{cluster.status_url}/v1/runs/{s.run_id}/ledger", timeout=10).json() for s in (with_canaries, without)]
    assert rows[0]["run"]["rules"] == rows[1]["run"]["rules"]
    assert [(r["kind"], r["counted"]) for r in rows[0]["rows"]] == [(r["kind"], r["counted"]) for r in rows[1]["rows"]]
    run_dir, received = _records(cluster, with_canaries.run_id)
    draw = CanaryDraw.load(run_dir / "canaries.npz")
    for audit in (
        audit_canaries(draw, received, with_canaries.delta, 0.95),
        *audit_canaries_white_box(draw, received, run_dir, with_canaries.delta, 0.95),
    ):
        assert audit.epsilon_lower_bound <= with_canaries.epsilon_spent


@pytest.mark.e2e
def test_a_run_adding_less_noise_than_it_charges_is_caught(tmp_path: Path, monkeypatch) -> None:
    """A planted bug in the trainer's run (in one process): after calibration, the extractor's
    noise is cut to 1 % of what the accountant charged. The same run without the bug stays
    below the accountant's ε; with it, the white-box bound exceeds it."""
    from vesper.coordinator.in_process import InProcessCluster
    from vesper.party_a.extractors.pmp_plugin import PmpPlugin

    config = RunConfig.model_validate({
        "dataset": "cora", "epochs": 2, "extractor": EXACT, "privacy": {"epsilon": 1.0},
        "audit": {"canaries": 500, "canary_seed": 0, "record_releases": True},
    })
    honest_bind = PmpPlugin.bind
    with InProcessCluster(tmp_path, party_a={"secret_seed": 3}) as cluster:
        bounds = []
        for bug in (False, True):
            if bug:
                def buggy_bind(self: PmpPlugin, noise_multiplier: float | None) -> None:
                    honest_bind(self, noise_multiplier)
                    self.noise_std *= 0.01

                monkeypatch.setattr(PmpPlugin, "bind", buggy_bind)
            summary = cluster.drive(config)
            assert summary.status == "completed", summary.message
            run_dir = tmp_path / "party_a" / "runs" / summary.run_id
            received = ReceivedReleases.load(tmp_path / "party_b" / "runs" / summary.run_id / "received.npz")
            mechanism, _ = audit_canaries_white_box(
                CanaryDraw.load(run_dir / "canaries.npz"), received, run_dir, summary.delta, 0.95,
            )
            bounds.append((mechanism.epsilon_lower_bound, summary.epsilon_spent))
    (honest, spent), (caught, charged) = bounds
    assert spent == pytest.approx(1.0) and charged == pytest.approx(1.0)  # the accountant charged both alike
    assert honest <= spent < caught


@pytest.mark.e2e
def test_tfts_trains_on_the_induced_subgraph_and_releases_the_members(cluster) -> None:
    config = {
        "dataset": "tiny", "epochs": 1, "batch_size": 64, "privacy": {"epsilon": math.inf},
        "extractor": {"name": "pmp-gcn", "dropout": 0.0},
        "audit": {"membership": True, "record_releases": True},
    }
    summary = _run(cluster, **config)
    assert summary.status == "completed", summary.message
    _, received = _records(cluster, summary.run_id)
    for split, ids in (("train", TINY_TRAIN), ("val", TINY_VAL), ("test", TINY_TEST)):
        assert sorted(received.split_ids(split).tolist()) == ids
    # one step, before any update: node 0's training release is its release without neighbours
    trained = received.train_sum[0] / received.train_count[0]
    run_config = RunConfig.model_validate({**config, "epochs": 1})
    part = load_graph_part(cluster.workdir / "tiny.npz")
    features = torch.from_numpy(part.features)

    def release_of_node_0(edges: list[tuple[int, int]]) -> np.ndarray:
        setup = ExtractorSetup(
            config=run_config, params=PmpGcnPlugin.spec.params(), graph=build_graph(torch.tensor(edges).reshape(-1, 2), 12),
            features=features, device=torch.device("cpu"), sampling_generator=torch.Generator().manual_seed(0),
            noise_generator=torch.Generator().manual_seed(0), delta=1.0,
        )
        extractor = PmpGcnPlugin(setup)
        extractor.bind(None)
        extractor.train()
        with torch.no_grad():
            return extractor.release(torch.tensor([0]), "train")[0].numpy()

    assert np.allclose(trained, release_of_node_0([]), atol=1e-5)
    assert not np.allclose(trained, release_of_node_0(TINY_EDGES), atol=1e-3)  # the test node would have shown


@pytest.mark.e2e
def test_tfts_refuses_a_one_shot_extractor_before_anything_is_charged(cluster) -> None:
    summary = _run(cluster, extractor={"name": "gap"}, privacy={"epsilon": 4.0}, audit={"membership": True})
    assert summary.status == "failed" and "one-shot" in summary.message
    assert httpx.get(f"{cluster.status_url}/v1/runs/{summary.run_id}", timeout=10).status_code == 404
