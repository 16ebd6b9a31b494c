"""heterpoisson: the sampler, the charged appearance law, and the empirical node sensitivity.

Neighbouring graphs differ by one node v (replace-with-null, docs/extractors/heterpoisson.md
section 1): in G' v keeps its id but has zero features and no edges; both worlds use G's
degree table, the same public encoder initialisation and the same coins for every
(root, neighbour) pair. For each step the production code runs without noise in both
worlds, and with k = v's appearances in the step's sub-graphs:

  (S1)  forward rows move by ≤ √k · 2C_f, the clipped gradient sum by ≤ k · 2C_g, and the
        whitened joint shift by ≤ √(kρ + k²(1 − ρ)) per unit of 1/z;

on random and adversarial pairs, and deliberately too small claims (C_f or C_g per
appearance, or "one appearance") are caught. The dominating law (D1) is checked against
every degree, and the mixture monotonicity the accounting relies on is checked
numerically with dp-accounting's PLD.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from vesper.common.config import RunConfig
from vesper.common.privacy.ledger import counted_per_kind
from vesper.party_a.extractors.base import ExtractorSetup, RootPlan, overrides_root_batches
from vesper.party_a.extractors.heterpoisson import (
    HeterPoissonExtractor,
    HeterPoissonParams,
    appearance_survival,
    clipped_gradient_sum,
    dominating_law,
    eval_sensitivity,
    step_sensitivity,
)
from vesper.party_a.extractors.heterpoisson_sampler import (
    Coins,
    heter_poisson,
    neighbour_mean,
    poisson_root_batches,
    secret_coins,
)
from vesper.party_a.extractors.registry import validated_params
from vesper.party_a.graph_store import Graph, build_graph

TOLERANCE = 1e-5
DIM, HIDDEN, FEATURES = 4, 6, 5
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


# -- building the two worlds ------------------------------------------------------------------
def graph_from(edges: list[tuple[int, int]], n: int) -> Graph:
    return build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), n)


def star(leaves: int) -> Graph:
    """Node 0 is the hub, the only neighbour of every leaf."""
    return graph_from([(0, i) for i in range(1, leaves + 1)], leaves + 1)


def features_for(n: int, seed: int) -> torch.Tensor:
    return torch.randn((n, FEATURES), generator=torch.Generator().manual_seed(seed))


def null_world(graph: Graph, features: torch.Tensor, v: int) -> tuple[Graph, torch.Tensor]:
    """G' of replace-with-null: v's edges removed, v's features zero, its id kept."""
    rows = torch.repeat_interleave(torch.arange(graph.num_nodes), graph.degree)
    keep = (rows != v) & (graph.indices != v)
    reduced = build_graph(torch.stack([rows[keep], graph.indices[keep]], 1), graph.num_nodes)
    nulled = features.clone()
    nulled[v] = 0.0
    return reduced, nulled


def extractor(
    graph: Graph, features: torch.Tensor, params: dict, *, degrees: torch.Tensor | None = None,
    batch: int = 4, seed: int = 0, device: str = "cpu",
) -> HeterPoissonExtractor:
    """The production extractor, noise off (z = None), as the trainer builds it."""
    config = RunConfig(
        epochs=1, batch_size=batch, seed=seed,
        extractor={"name": "heterpoisson", "dim": DIM, "encoder_hidden": HIDDEN, "params": params},
    )
    setup = ExtractorSetup(
        config, HeterPoissonParams.model_validate(params), graph.to(device), features.to(device),
        torch.device(device), torch.Generator().manual_seed(1), torch.Generator(device=device).manual_seed(2), 1e-3,
    )
    ex = HeterPoissonExtractor(setup)
    if degrees is not None:  # the null world reads G's (public) degree table
        ex.degrees = degrees.to(device)
    n = graph.num_nodes
    ex.charge_plan(RootPlan(torch.arange(n), torch.arange(0), torch.arange(n), math.ceil(n / batch), 1))
    ex.bind(None)
    return ex


def coupled(table: torch.Tensor) -> Coins:
    """The same coin for the pair (root, neighbour) in both worlds."""
    return lambda roots, neighbours: table.to(neighbours.device)[roots, neighbours]


@dataclass(frozen=True)
class Pair:
    """A neighbouring pair (G, G' = G with v nulled), one step's roots and its coins."""

    graph: Graph
    features: torch.Tensor
    v: int
    roots: torch.Tensor
    params: dict
    seed: int = 0
    same_reply: bool = False  # B answers every root with the same gradient (aligns their changes)

    def worlds(self) -> tuple[HeterPoissonExtractor, HeterPoissonExtractor]:
        g_null, x_null = null_world(self.graph, self.features, self.v)
        real = extractor(self.graph, self.features, self.params, seed=self.seed)
        null = extractor(g_null, x_null, self.params, degrees=self.graph.degree, seed=self.seed)
        n = self.graph.num_nodes
        table = torch.rand((n, n), generator=torch.Generator().manual_seed(self.seed + 11), dtype=torch.float64)
        real.coins = null.coins = coupled(table)
        return real, null


@dataclass(frozen=True)
class Shift:
    """What one step moved between the worlds, and v's appearances in the real world."""

    appearances: int
    forward: float  # ‖Δ forward release‖_F before noise
    gradient: float  # ‖Δ Σ_r ψ̂_r‖ before noise


def measure(pair: Pair, gain: float = 50.0) -> Shift:
    """Both worlds' pre-noise forward release and clipped gradient sum, B's gradient shared
    (B's reply is a function of what it received, so conditioned on it, it is the same)."""
    real, null = pair.worlds()
    batches = real.sample(pair.roots), null.sample(pair.roots)
    forward = [ex.release_batch(b, "eval") for ex, b in zip((real, null), batches, strict=True)]
    size = pair.roots.numel()
    rows = reply(1 if pair.same_reply else size, pair.seed, gain).expand(size, DIM)
    b_gradient = rows[:, :, None] / size  # B's loss is the batch mean
    sums = []
    for ex, batch in zip((real, null), batches, strict=True):
        for p in ex.encoder.parameters():
            p.grad = None
        ex.release_batch(batch, "train").backward(b_gradient)
        sums.append(torch.cat([p.grad.reshape(-1) * size for p in ex.encoder.parameters()]))
    return Shift(
        batches[0].appearances(pair.v), float((forward[0] - forward[1]).norm()), float((sums[0] - sums[1]).norm())
    )


def reply(rows: int, seed: int, gain: float = 50.0) -> torch.Tensor:
    """B's gradient of each root's own loss: large, so that every clip binds."""
    return gain * torch.randn((rows, DIM), generator=torch.Generator().manual_seed(seed + 7))


def check(pair: Pair) -> Shift:
    p = HeterPoissonParams.model_validate(pair.params)
    shift, rho = measure(pair), p.forward_share
    k = shift.appearances
    assert shift.forward <= math.sqrt(k) * 2 * p.embedding_clip + TOLERANCE
    assert shift.gradient <= k * 2 * p.grad_clip + TOLERANCE
    # (S1): the whitened joint shift, in units of 1/z, against the charged sensitivity
    whitened = (shift.forward * math.sqrt(rho) / (2 * p.embedding_clip)) ** 2
    whitened += (shift.gradient * math.sqrt(1 - rho) / (2 * p.grad_clip)) ** 2
    assert math.sqrt(whitened) <= float(step_sensitivity(np.array([k]), rho)[0]) + TOLERANCE
    # k lies in the support the accountant is charged for (≥ 1 whenever v touches the step)
    counts, _ = dominating_law(p.multiplier, pair.graph.num_nodes)
    assert k <= int(counts.max())
    if k == 0:
        assert shift.forward <= TOLERANCE and shift.gradient <= TOLERANCE
    return shift


# -- the sampler ---------------------------------------------------------------------------------
def test_neighbours_are_kept_at_rate_min_1_m_over_their_degree() -> None:
    """Algorithm 3: roots 0..29; node 30 + d has degree d + 1 (roots 0..d), kept w.p. min(1, M/(d+1))."""
    roots, multiplier, trials = 30, 3.0, 400
    edges = [(r, 30 + d) for d in range(roots) for r in range(d + 1)]
    graph = graph_from(edges, 2 * roots)
    root_ids = torch.arange(roots)
    kept = torch.zeros(graph.num_nodes)
    coins = secret_coins(torch.Generator().manual_seed(3))
    for _ in range(trials):
        batch = heter_poisson(graph, graph.degree, root_ids, multiplier, coins)
        kept += torch.bincount(batch.peripherals, minlength=graph.num_nodes)
    for d in range(roots):
        node, degree = 30 + d, d + 1
        rate = min(1.0, multiplier / degree)
        observed = float(kept[node]) / (trials * degree)  # `degree` roots can keep it each trial
        assert abs(observed - rate) <= 5 * math.sqrt(rate * (1 - rate) / (trials * degree)) + 1e-12, (d, observed, rate)


@pytest.mark.parametrize("device", DEVICES)
def test_no_root_is_a_peripheral_and_peripherals_are_neighbours(device: str) -> None:
    rng = torch.Generator().manual_seed(5)
    n = 60
    edges = torch.randint(0, n, (240, 2), generator=rng)
    graph = build_graph(edges, n).to(device)
    for trial in range(20):
        roots = torch.nonzero(torch.rand(n, generator=rng) < 0.3).flatten().to(device)
        batch = heter_poisson(graph, graph.degree, roots, 2.0, secret_coins(torch.Generator().manual_seed(trial)))
        assert batch.peripherals.device == batch.owner.device == graph.device
        assert not torch.isin(batch.peripherals, roots).any()
        for owner, node in zip(batch.owner.tolist(), batch.peripherals.tolist(), strict=True):
            assert node in graph.neighbours(int(roots[owner])).tolist()


def test_roots_are_poisson_at_q_b_and_the_epoch_has_the_planned_steps() -> None:
    n, q, batches = 2000, 0.05, 300
    ids = torch.arange(n)
    samples = poisson_root_batches(ids, q, batches, torch.Generator().manual_seed(0))
    sizes = torch.tensor([s.numel() for s in samples], dtype=torch.float64)
    assert len(samples) == batches
    assert abs(float(sizes.mean()) - n * q) <= 5 * math.sqrt(n * q * (1 - q) / batches)
    assert float(sizes.var()) == pytest.approx(n * q * (1 - q), rel=0.25)  # independent memberships
    inclusion = torch.zeros(n)
    for s in samples:
        inclusion[s] += 1
    assert abs(float(inclusion.mean()) / batches - q) < 0.005
    # the hook: ceil(|train| / batch_size) batches at q_b = batch_size / |train| by default
    ex = extractor(star(6), features_for(7, 0), {})
    assert overrides_root_batches(ex)
    epoch = ex.root_batches(torch.arange(100, 110), 3, torch.Generator().manual_seed(1))
    assert len(epoch) == 4 and all(torch.isin(b, torch.arange(100, 110)).all() for b in epoch)
    assert ex.root_rate(10, 3) == pytest.approx(0.3)
    assert extractor(star(6), features_for(7, 0), {"root_rate": 0.9}).root_rate(10, 3) == 0.9


@pytest.mark.parametrize("device", DEVICES)
def test_every_tensor_of_a_release_is_on_the_graphs_device(device: str) -> None:
    ex = extractor(star(5), features_for(6, 0), {"multiplier": 2.0}, device=device)
    ex.bind(1.5)
    out = ex.release(torch.tensor([1, 2, 3], device=device), "train")
    assert out.device.type == device and out.shape == (3, DIM, 1)
    out.backward(torch.ones_like(out))
    assert all(p.grad is not None and p.grad.device.type == device for p in ex.encoder.parameters())


# -- the dominating law (D1) --------------------------------------------------------------------
@pytest.mark.parametrize(("multiplier", "cap"), [(2.0, 50), (0.7, 5), (6.0, 1000), (1.0, 9), (3.5, 40)])
def test_the_law_dominates_every_degree_and_the_root_case(multiplier: float, cap: int) -> None:
    counts, mass = dominating_law(multiplier, cap)
    assert math.fsum(mass) == pytest.approx(1.0, abs=1e-12) and (mass > 0).all() and counts.min() >= 1
    assert counts.max() <= cap
    survival = appearance_survival(multiplier, cap)
    assert survival[0] == 1.0  # the root case: exactly one appearance, no mass at 0 credited
    j = np.arange(1, survival.size + 1)
    for degree in [*range(1, 400), 1000, 10_000, 1_000_000]:
        tail = stats.binom.sf(j - 1, degree, min(1.0, multiplier / degree))
        tail[j > cap] = 0.0
        assert (survival >= tail - 1e-15).all(), degree
    poisson = stats.poisson.sf(j - 1, multiplier)
    beyond = (j > math.ceil(multiplier)) & (j <= cap)
    assert survival[beyond] == pytest.approx(poisson[beyond], abs=1e-15)  # and no larger than that


def test_the_law_reads_no_statistic_of_the_graph() -> None:
    """The charged law is a function of M and the public cap alone (it is in the run record)."""
    hub = build_graph(torch.tensor([[0, j] for j in range(1, 60)]), 60)
    path = build_graph(torch.tensor([[j, j + 1] for j in range(59)]), 60)
    plans = []
    for graph in (hub, path, build_graph(torch.empty(0, 2, dtype=torch.int64), 60)):
        ex = extractor(graph, features_for(60, 0), {}, batch=8)
        plans.append(ex.charge_plan(RootPlan(torch.arange(60), torch.arange(0), torch.arange(60), 8, 1)))
    assert plans[0].rules == plans[1].rules == plans[2].rules
    assert plans[0].details == plans[1].details == plans[2].details


INTERVAL = 5e-3  # dp-accounting's mixture PLD costs ~1 ms per point: coarse, and pessimistic on both sides


def _curve(sensitivities: np.ndarray, probabilities: np.ndarray, z: float) -> Callable[[int], float]:
    """ε at δ = 1e-5 of `count` runs of MixtureOfGaussians(z, sensitivities, probabilities) (dp-accounting PLD)."""
    pld = pld_lib.from_mixture_gaussian_mechanism(
        z, list(sensitivities), list(probabilities), value_discretization_interval=INTERVAL
    )
    return lambda count: float(pld.self_compose(count).get_epsilon_for_delta(1e-5))


@pytest.mark.parametrize("z", [4.0, 8.0])
def test_the_dominating_mixture_costs_at_least_every_individual_degree(z: float) -> None:
    """(c) of the docs: a first-order larger appearance law costs more, checked with the PLD.

    Each case is what one node costs in one step: the root case (k = 1) and, for a node of
    degree D with all its neighbours among the roots, k ~ Bin(D, min(1, M/D)). Both sides
    are pessimistic estimates, each above the truth by at most about count · INTERVAL.
    """
    multiplier, rho = 2.0, 0.5
    counts, mass = dominating_law(multiplier, 100)
    charged = _curve(step_sensitivity(counts, rho), mass, z)
    cases = {"root": _curve(np.array([1.0]), np.array([1.0]), z)}
    for degree in (1, 3, 8, 200):
        k = np.arange(degree + 1)
        pmf = stats.binom.pmf(k, degree, min(1.0, multiplier / degree))
        cases[f"D={degree}"] = _curve(step_sensitivity(k, rho), pmf / pmf.sum(), z)
    for count in (1, 3):
        total = charged(count)
        for name, case in cases.items():
            assert total >= case(count) - count * INTERVAL, (name, count)
    # the comparison can fail: charging the root case alone (one appearance per step, the
    # paper's "sensitivity 1/2" case) is below a degree-3 node's cost
    assert cases["root"](3) < cases["D=3"](3) - 3 * INTERVAL


# -- the empirical node sensitivity (S1) ----------------------------------------------------------
@st.composite
def random_pairs(draw: st.DrawFn) -> Pair:
    n = draw(st.integers(3, 12))
    edges = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))
    roots = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=n, unique=True))
    params = {
        "multiplier": draw(st.sampled_from([0.5, 1.0, 3.0, 100.0])),
        "embedding_clip": draw(st.sampled_from([0.5, 1.0, 2.0])),
        "grad_clip": draw(st.sampled_from([0.3, 1.0])),
        "forward_share": draw(st.sampled_from([0.2, 0.5, 0.9])),
    }
    seed = draw(st.integers(0, 1000))
    return Pair(graph_from(edges, n), features_for(n, seed), draw(st.integers(0, n - 1)),
                torch.tensor(sorted(roots)), params, seed)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_pairs())
def test_random_pairs_stay_within_the_charged_step_sensitivity(pair: Pair) -> None:
    check(pair)


def adversarial_hub(leaves: int, params: dict, candidates: int = 64) -> Pair:
    """A hub v with every leaf a root and M ≥ deg(v), so v is in all `leaves` sub-graphs.

    The leaves are identical (features 0), so their changes add up in the gradient sum;
    v's features are the candidate (large, random) that moves one leaf's embedding and
    clipped gradient most, searched on the production encoder.
    """
    graph = star(leaves)
    base = Pair(graph, torch.zeros((leaves + 1, FEATURES)), 0, torch.arange(1, leaves + 1), params)
    real, _ = base.worlds()
    g = reply(1, base.seed)
    zero = torch.zeros((1, FEATURES))
    with torch.no_grad():
        h0 = real.encoder(zero, zero)
    psi0 = clipped_gradient_sum(real.encoder, zero, zero, g, real.params.grad_clip, 1)
    best, best_score = None, -1.0
    for c in range(candidates):
        x_v = 30.0 * torch.randn((1, FEATURES), generator=torch.Generator().manual_seed(100 + c))
        with torch.no_grad():
            dh = float((real.encoder(zero, x_v) - h0).norm()) / real.params.embedding_clip
        psi = clipped_gradient_sum(real.encoder, zero, x_v, g, real.params.grad_clip, 1)
        dg = math.sqrt(sum(float((psi[k] - psi0[k]).pow(2).sum()) for k in psi)) / real.params.grad_clip
        if min(dh, dg) > best_score:
            best, best_score = x_v, min(dh, dg)
    features = torch.zeros((leaves + 1, FEATURES))
    features[0] = best[0]
    return Pair(graph, features, 0, torch.arange(1, leaves + 1), params, seed=base.seed, same_reply=True)


HUB = {"multiplier": 100.0, "forward_share": 0.5}


@pytest.mark.parametrize("pair", [
    Pair(star(8), features_for(9, 3), 0, torch.arange(0, 9), {"multiplier": 2.0}),  # hub is a root: masked
    Pair(star(8), features_for(9, 4), 0, torch.arange(1, 9), {"multiplier": 100.0}),  # hub in 8 sub-graphs
    Pair(star(8), features_for(9, 5), 3, torch.tensor([0, 1, 3]), {"multiplier": 1.0}),  # a leaf root
    Pair(graph_from([(1, 2), (2, 3)], 5), features_for(5, 6), 4, torch.tensor([1, 4]), {}),  # isolated root
    Pair(graph_from([(1, 2), (2, 3)], 5), features_for(5, 6), 4, torch.tensor([1, 2]), {}),  # isolated, absent
], ids=["hub-root", "hub-peripheral", "leaf-root", "isolated-root", "isolated-absent"])
def test_adversarial_pairs_stay_within_the_charged_step_sensitivity(pair: Pair) -> None:
    check(pair)


def test_the_hub_nearly_attains_the_bounds_and_too_small_claims_are_caught() -> None:
    """The checks can fail: v in k = 6 sub-graphs moves them past every smaller claim."""
    pair = adversarial_hub(6, HUB)
    shift = check(pair)
    k, c = shift.appearances, 1.0
    assert k == 6
    assert shift.forward > math.sqrt(k) * c * 1.2  # "C_f per appearance" is caught
    assert shift.gradient > k * c * 1.2  # "C_g per appearance" is caught
    assert shift.gradient > 2 * c * 2  # "one appearance (2C_g)" — the paper's root case — is caught
    assert shift.gradient > math.sqrt(k) * 2 * c  # √k for the gradient sum (as for the rows) is caught


def test_the_root_case_moves_one_row_only() -> None:
    pair = adversarial_hub(5, HUB)
    as_root = Pair(pair.graph, pair.features, 0, torch.arange(0, 6), HUB, same_reply=True)
    shift = check(as_root)
    assert shift.appearances == 1 and shift.forward <= 2.0 + TOLERANCE


# -- plumbing ------------------------------------------------------------------------------------
def test_the_private_gradient_is_the_exact_gradient_when_nothing_clips() -> None:
    """(G1-G2) with a huge C_g and no noise equals autograd's gradient of ⟨e, g⟩."""
    ex = extractor(star(5), features_for(6, 9), {"multiplier": 3.0, "grad_clip": 1e6})
    roots = torch.tensor([1, 2, 4])
    ex.coins = coupled(torch.rand((6, 6), generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    batch = ex.sample(roots)
    g = torch.randn((3, DIM, 1), generator=torch.Generator().manual_seed(0))
    ex.release_batch(batch, "train").backward(g)
    private = [p.grad.clone() for p in ex.encoder.parameters()]
    for p in ex.encoder.parameters():
        p.grad = None
    (ex.encoder(ex.features[roots], neighbour_mean(ex.features, batch)) * g[:, :, 0]).sum().backward()
    for mine, reference in zip(private, [p.grad for p in ex.encoder.parameters()], strict=True):
        assert torch.allclose(mine, reference, atol=1e-5)


def test_bound_noise_has_the_derived_standard_deviations() -> None:
    p = {"embedding_clip": 0.5, "grad_clip": 2.0, "forward_share": 0.25}
    ex = extractor(star(30), features_for(31, 0), p)
    ex.bind(3.0)
    assert ex.forward_std == pytest.approx(3.0 * 2 * 0.5 / math.sqrt(0.25))
    assert ex.gradient_std == pytest.approx(3.0 * 2 * 2.0 / math.sqrt(0.75))
    roots = torch.arange(31)
    ex.coins = coupled(torch.zeros((31, 31), dtype=torch.float64))
    batch = ex.sample(roots)
    with torch.no_grad():
        noise = ex.release_batch(batch, "eval")[:, :, 0] - ex.encoder(ex.features[roots], torch.zeros((31, FEATURES)))
    assert float(noise.std()) == pytest.approx(ex.forward_std, rel=0.3)


def test_forward_share_one_trains_nothing() -> None:
    ex = extractor(star(4), features_for(5, 0), {"forward_share": 1.0})
    ex.bind(2.0)
    assert ex.trainable_parameters() == [] and ex.gradient_std == 0.0
    assert not ex.release(torch.tensor([1, 2]), "train").requires_grad
    rules = {r.kind: r for r in ex.charge_plan(RootPlan(torch.arange(5), torch.arange(0), torch.arange(5), 2, 1)).rules}
    counts, _ = dominating_law(ex.params.multiplier, 5)  # k ≤ |train| = 5 appearances per step
    assert rules["train"].sensitivities == pytest.approx(list(eval_sensitivity(counts)))


def test_the_plan_charges_every_step_and_chunk_as_a_dominating_mixture() -> None:
    graph = star(7)
    ex = extractor(graph, features_for(8, 0), {"multiplier": 2.0, "forward_share": 0.6})
    roots = RootPlan(torch.arange(4), torch.arange(4, 6), torch.arange(6, 8), 2, 1)
    plan = ex.charge_plan(roots)
    rules = {r.kind: r for r in plan.rules}
    assert set(rules) == {"train", "eval"} and plan.participation_bound is None
    counts, mass = dominating_law(2.0, 4)
    train, evaluation = rules["train"], rules["eval"]
    assert train.mechanism == evaluation.mechanism == "mixture-of-gaussians"
    assert train.participation_bound is None and evaluation.participation_bound is None
    assert train.noise_scale == 1.0 and evaluation.noise_scale == pytest.approx(1 / math.sqrt(0.6))
    assert train.sensitivities == pytest.approx(list(step_sensitivity(counts, 0.6)))
    assert train.sampling_probs == pytest.approx(list(mass))
    # M = 2: a degree-2 node whose neighbours are both roots is kept by both, so k ≥ 2 dominates
    assert counts[0] == 2 and train.sensitivities[0] == pytest.approx(math.sqrt(2 * 0.6 + 4 * 0.4))
    event = train.event(3.0)
    assert isinstance(event, MixtureOfGaussiansDpEvent) and event.standard_deviation == 3.0
    assert "REPLACE_SPECIAL" in plan.details["neighbouring"] and plan.details["root_sampling_credit"].startswith("none")
    assert plan.sensitivity == pytest.approx(2.0 / math.sqrt(0.6))  # σ_f per unit of z
    counted = counted_per_kind(plan.passes(3, roots), {r.kind: r.participation_bound for r in plan.rules})
    assert counted == {"train": 6, "eval": 1}


def _config(**privacy: object) -> RunConfig:
    return RunConfig(extractor={"name": "heterpoisson", "params": privacy.pop("params", {})}, privacy=privacy)


@pytest.mark.parametrize(("params", "problem"), [
    ({"multiplier": 0}, "multiplier"),
    ({"forward_share": 0.0}, "forward_share"),
    ({"forward_share": 1.5}, "forward_share"),
    ({"root_rate": 1.2}, "root_rate"),
    ({"embedding_clip": -1}, "embedding_clip"),
    ({"fanout": 3}, "fanout"),
])
def test_bad_parameters_are_refused_by_name(params: dict, problem: str) -> None:
    with pytest.raises(ValueError, match=f"extractor.params.{problem}"):
        validated_params(HeterPoissonExtractor.spec, _config(params=params))


def test_the_rdp_accountant_is_refused() -> None:
    with pytest.raises(ValueError, match="pld only"):
        validated_params(HeterPoissonExtractor.spec, _config(accountant="rdp"))
    assert validated_params(HeterPoissonExtractor.spec, _config(accountant="pld")) == HeterPoissonParams()


def test_the_spec_names_the_node_unit_and_its_relation() -> None:
    spec = HeterPoissonExtractor.spec
    assert spec.privacy_unit == "node" and spec.cost_model == "per-step" and spec.accountants == ("pld",)
    assert "replace-with-null" in spec.relation and "degree table is public" in spec.relation
