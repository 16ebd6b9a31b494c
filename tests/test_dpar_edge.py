"""DPAR at edge level: the charged sensitivities hold empirically, and the extractor charges first.

What is noised is the clipped APPR score matrix {u_sj} over all sources (self excluded).
Over neighbouring graphs G, G ± e we measure, from the ISTA scores actually computed:

* A₁ = Σ_s ‖Δp_s‖₁ and A_∞ = Σ_s ‖Δp_s‖_∞ against Theorem 1 (docs/extractors/dpar.md, D1-D2),
* ‖ΔU‖_F (what the Gaussian variant is charged for, eq. G) and √(Σ_s ‖Δu_s‖_∞²) (the
  exponential variant, eq. E) against :func:`appr.edge_level_sensitivity`,

on random pairs (hypothesis, steered towards the bounds) and adversarial ones (hubs,
isolated nodes, bridges). Claiming the paper's per-vector sensitivity C for the whole
release is caught.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings, target
from hypothesis import strategies as st
from pydantic import ValidationError

from vesper.common.config import RunConfig
from vesper.party_a.extractors import appr, dpar_edge
from vesper.party_a.extractors.base import ExtractorSetup, RootPlan
from vesper.party_a.extractors.dpar_edge import DparEdgeExtractor, DparEdgeParams
from vesper.party_a.graph_store import Graph, build_graph


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny sparse products: intra-op threads only add contention on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- measuring what is noised --------------------------------------------------------------
@dataclass(frozen=True)
class Change:
    l1: float  # Σ_s ‖Δp_s‖₁
    linf: float  # Σ_s ‖Δp_s‖_∞
    gaussian: float  # ‖ΔU‖_F over the candidates (self excluded)
    exponential: float  # √(Σ_s ‖Δu_s‖_∞²)


def _graph(n: int, edges: list[tuple[int, int]]) -> Graph:
    return build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), n)


def measure(n: int, edges: list[tuple[int, int]], edge: tuple[int, int], alpha: float, rho: float, iterations: int, clip: float) -> Change:
    """The change of the scores between G' = ``edges`` without ``edge`` and G = G' + ``edge``."""
    base = [e for e in edges if set(e) != set(edge)]
    scores = []
    for graph in (_graph(n, base), _graph(n, [*base, edge])):
        p = appr.ista_appr(appr.walk_operator(graph, torch.float64), torch.arange(n), alpha, rho, iterations)
        scores.append(p)
    dp = scores[1] - scores[0]
    du = scores[1].clamp(max=clip) - scores[0].clamp(max=clip)
    du.fill_diagonal_(0.0)  # the source is not a candidate: −∞ in both graphs
    return Change(
        l1=float(dp.abs().sum()),
        linf=float(dp.abs().amax(1).sum()),
        gaussian=float(du.norm()),
        exponential=float(du.abs().amax(1).norm()),
    )


def violations(change: Change, alpha: float, rho: float, clip: float, n: int, claimed: appr.Sensitivity | None = None) -> list[str]:
    bound = claimed or appr.edge_level_sensitivity(alpha, rho, clip, n)
    slack = 1 + 1e-9
    found = []
    if change.l1 > bound.change.l1 * slack + 1e-12:
        found.append(f"A1 {change.l1} > {bound.change.l1}")
    if change.linf > bound.change.linf * slack + 1e-12:
        found.append(f"Ainf {change.linf} > {bound.change.linf}")
    if change.gaussian > bound.gaussian * slack + 1e-12:
        found.append(f"S_G {change.gaussian} > {bound.gaussian}")
    if change.exponential > bound.exponential * slack + 1e-12:
        found.append(f"S_EM {change.exponential} > {bound.exponential}")
    return found


@dataclass(frozen=True)
class Pair:
    n: int
    edges: list[tuple[int, int]]
    edge: tuple[int, int]
    alpha: float
    rho: float
    iterations: int
    clip: float

    def change(self) -> Change:
        return measure(self.n, self.edges, self.edge, self.alpha, self.rho, self.iterations, self.clip)


@st.composite
def pairs(draw: st.DrawFn) -> Pair:
    n = draw(st.integers(2, 18))
    density = draw(st.sampled_from([0.0, 0.1, 0.25, 0.6]))
    all_pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = [e for e in all_pairs if draw(st.floats(0, 1)) < density]
    edge = draw(st.sampled_from(all_pairs))
    return Pair(
        n, edges, edge,
        alpha=draw(st.sampled_from([0.05, 0.25, 0.5, 0.8, 0.95])),
        rho=draw(st.sampled_from([0.0, 0.0, 1e-3, 0.05])),
        iterations=draw(st.sampled_from([1, 2, 3, 4, 8, 40])),
        clip=draw(st.sampled_from([0.01, 0.05, 0.2, 1.0])),
    )


@given(pair=pairs())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_neighbouring_graphs_stay_within_the_charged_sensitivities(pair: Pair) -> None:
    change = pair.change()
    bound = appr.edge_level_sensitivity(pair.alpha, pair.rho, pair.clip, pair.n)
    target(change.gaussian / bound.gaussian, label="S_G measured / charged")
    target(change.exponential / bound.exponential, label="S_EM measured / charged")
    target(change.l1 / bound.change.l1, label="A1 measured / bound")
    assert violations(change, pair.alpha, pair.rho, pair.clip, pair.n) == []


def _star(centre: int, leaves: range) -> list[tuple[int, int]]:
    return [(centre, leaf) for leaf in leaves]


def _clique(nodes: range) -> list[tuple[int, int]]:
    return [(i, j) for i in nodes for j in nodes if i < j]


ADVERSARIAL: dict[str, tuple[int, list[tuple[int, int]], tuple[int, int]]] = {
    # name: (n, edges of G', the edge)
    "both isolated": (2, [], (0, 1)),
    "hub and isolated node": (17, _star(0, range(1, 16)), (0, 16)),
    "two hubs": (24, _star(0, range(2, 13)) + _star(1, range(13, 24)), (0, 1)),
    "two leaves of one hub": (12, _star(0, range(1, 12)), (1, 2)),
    "leaf of a hub and an isolated node": (13, _star(0, range(1, 12)), (1, 12)),
    "bridge between two cliques": (12, _clique(range(6)) + _clique(range(6, 12)), (5, 6)),
    "pendant on a clique and a path": (14, _clique(range(6)) + [(i, i + 1) for i in range(6, 13)], (0, 13)),
    "the last edge of a clique": (7, _clique(range(7)), (0, 1)),
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_pairs_stay_within_the_charged_sensitivities(name: str) -> None:
    n, edges, edge = ADVERSARIAL[name]
    for alpha in (0.05, 0.25, 0.8):
        for rho in (0.0, 0.01):
            for iterations in (3, 40):
                for clip in (0.02, 0.2, 1.0):
                    change = measure(n, edges, edge, alpha, rho, iterations, clip)
                    assert violations(change, alpha, rho, clip, n) == [], (alpha, rho, iterations, clip)
                    # removal is the same pair read backwards: |Δ| is symmetric by construction
    assert measure(n, edges, edge, 0.25, 0.0, 3, 0.05).gaussian > 0  # the pair does change what is noised


def test_the_papers_per_vector_sensitivity_is_caught() -> None:
    """Charging the whole release the sensitivity C of one score vector (DPAR Theorem 1's Δ(u) = C₂).

    Joining two isolated nodes changes both endpoints' vectors by C: √2·C in both norms.
    """
    alpha, rho, clip = 0.25, 0.0, 0.05
    honest = appr.edge_level_sensitivity(alpha, rho, clip, 2)
    wrong = appr.Sensitivity(gaussian=clip, exponential=clip, change=honest.change)
    change = measure(2, [], (0, 1), alpha, rho, 3, clip)
    assert violations(change, alpha, rho, clip, 2, honest) == []
    caught = violations(change, alpha, rho, clip, 2, wrong)
    assert any(v.startswith("S_G") for v in caught) and any(v.startswith("S_EM") for v in caught)
    assert change.exponential == pytest.approx(math.sqrt(2) * clip)


def test_a_per_vector_claim_is_found_by_search() -> None:
    """Hypothesis finds, among random pairs, one that breaks S = C."""

    def breaks(pair: Pair) -> bool:
        honest = appr.edge_level_sensitivity(pair.alpha, pair.rho, pair.clip, pair.n)
        wrong = appr.Sensitivity(gaussian=pair.clip, exponential=pair.clip, change=honest.change)
        return bool(violations(pair.change(), pair.alpha, pair.rho, pair.clip, pair.n, wrong))

    search = settings(max_examples=200, database=None, phases=[Phase.generate])  # no shrinking: any pair will do
    assert breaks(find(pairs(), breaks, settings=search))


# -- the extractor: what it charges, and that it charges first -----------------------------
def _setup(params: dict | None = None, epsilon: float = 4.0, **extractor: object) -> ExtractorSetup:
    config = RunConfig.model_validate({
        "privacy": {"epsilon": epsilon},
        "extractor": {"name": "dpar-edge", "dim": 8, "encoder_hidden": 16, "dropout": 0.0, "params": params or {}, **extractor},
    })
    graph = _graph(30, _clique(range(6)) + [(i, i + 1) for i in range(6, 29)] + [(0, 20)])
    features = torch.randn(30, 5, generator=torch.Generator().manual_seed(0))
    return ExtractorSetup(
        config=config, params=DparEdgeParams.model_validate(params or {}), graph=graph, features=features,
        device=torch.device("cpu"), sampling_generator=torch.Generator().manual_seed(1),
        noise_generator=torch.Generator().manual_seed(2), delta=1e-3,
    )


ROOTS = RootPlan(
    train_ids=torch.arange(0, 20), val_ids=torch.arange(20, 25), test_ids=torch.arange(25, 30),
    steps_per_epoch=2, eval_chunks=2,
)


class Refused(RuntimeError):
    pass


class FakeSession:
    def __init__(self, refuse: bool = False) -> None:
        self.roots = ROOTS
        self.refuse = refuse
        self.charges: list[tuple[int, int]] = []
        self.messages: list[str] = []

    def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
        if self.refuse:
            raise Refused("budget")
        self.charges.append((index, node_ids.numel()))

    def train_stage(self, *args: object) -> None:  # pragma: no cover - dpar-edge has no stage
        raise AssertionError("no stages")

    def progress(self, message: str) -> None:
        self.messages.append(message)


def test_gaussian_plan_is_one_gaussian_release_then_post_processing() -> None:
    ex = DparEdgeExtractor(_setup())
    plan = ex.charge_plan(ROOTS)
    kinds = {rule.kind: rule for rule in plan.rules}
    assert kinds["one-shot"].mechanism == "gaussian" and kinds["one-shot"].participation_bound is None
    assert kinds["train"].mechanism == "no-op" and kinds["eval"].mechanism == "no-op"
    assert plan.one_shot_releases == 1
    p = DparEdgeParams()
    assert plan.sensitivity == pytest.approx(appr.edge_level_sensitivity(p.alpha, p.rho, p.clip, 30).gaussian)
    ex.bind(2.0)
    assert ex.noise == pytest.approx(2.0 * plan.sensitivity)
    assert ex.output_layers == 2


def test_exponential_plan_is_k_zcdp_rounds() -> None:
    ex = DparEdgeExtractor(_setup({"mechanism": "exponential", "top_k": 3}))
    plan = ex.charge_plan(ROOTS)
    rule = next(r for r in plan.rules if r.kind == "one-shot")
    assert rule.mechanism == "exponential" and plan.one_shot_releases == 3
    event = rule.event(2.0)  # each round over all sources is (1/z)-bounded-range: ρ = 1/(8 z²)
    assert event.rho == pytest.approx(1 / 32) and event.xi == 0
    p = DparEdgeParams()
    s_em = appr.edge_level_sensitivity(p.alpha, p.rho, p.clip, 30).exponential
    assert plan.sensitivity == pytest.approx(2 * s_em)
    ex.bind(2.0)
    assert ex.noise == pytest.approx(4 * s_em)  # Gumbel scale b = 2 z S_EM


def test_an_unnoised_exponential_release_keeps_its_mechanism() -> None:
    ex = DparEdgeExtractor(_setup({"mechanism": "exponential"}, epsilon=math.inf))
    rule = next(r for r in ex.charge_plan(ROOTS).rules if r.kind == "one-shot")
    assert rule.mechanism == "exponential"  # the trainer records NonPrivateDpEvent for any costly rule at ε = ∞


@pytest.mark.parametrize("mechanism", ["gaussian", "exponential"])
def test_prepare_charges_every_release_before_reading_the_graph(monkeypatch: pytest.MonkeyPatch, mechanism: str) -> None:
    ex = DparEdgeExtractor(_setup({"mechanism": mechanism, "top_k": 3}))
    ex.charge_plan(ROOTS)
    ex.bind(1.0)
    session = FakeSession()
    real = dpar_edge.private_top_k

    def checked(*args: object, **kwargs: object) -> appr.TopK:
        assert len(session.charges) == (3 if mechanism == "exponential" else 1), "computed before charging"
        return real(*args, **kwargs)

    monkeypatch.setattr(dpar_edge, "private_top_k", checked)
    ex.prepare(session)
    assert [c[1] for c in session.charges] == [30] * len(session.charges)
    out = ex.release(torch.tensor([0, 7, 29]), "train")
    assert out.shape == (3, 8, 2)


def test_a_refused_charge_computes_and_releases_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    ex = DparEdgeExtractor(_setup())
    ex.charge_plan(ROOTS)
    ex.bind(1.0)
    monkeypatch.setattr(dpar_edge, "private_top_k", lambda *a, **k: pytest.fail("computed after a refusal"))
    with pytest.raises(Refused):
        ex.prepare(FakeSession(refuse=True))
    with pytest.raises(RuntimeError, match="prepare"):
        ex.release(torch.tensor([0]), "train")


@pytest.mark.parametrize("weights", ["uniform", "noisy-scores"])
def test_releases_read_the_graph_only_through_the_charged_neighbourhoods(weights: str) -> None:
    """After prepare, a release and A's gradient are functions of N_K, the features and the encoder."""
    ex = DparEdgeExtractor(_setup({"weights": weights}))
    ex.charge_plan(ROOTS)
    ex.bind(0.5)
    ex.prepare(FakeSession())
    roots = torch.tensor([3, 11, 24])
    before = ex.release(roots, "train")
    before.sum().backward()
    grads = [p.grad.clone() for p in ex.trainable_parameters()]
    assert all(g.abs().sum() > 0 for g in grads)  # B's gradient reaches the encoder
    # another graph entirely: nothing A releases or learns changes
    ex.setup = replace(ex.setup, graph=_graph(30, _clique(range(30))))
    for p in ex.trainable_parameters():
        p.grad = None
    after = ex.release(roots, "train")
    after.sum().backward()
    assert torch.equal(before, after)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, ex.trainable_parameters(), strict=True))
    weights_rows = ex.weights[roots]
    assert torch.allclose(weights_rows.sum(1), torch.ones(3)) and (weights_rows >= 0).all()
    assert not (ex.neighbours[roots] == roots[:, None]).any()


def test_configuration_errors() -> None:
    with pytest.raises(ValidationError, match="noisy-scores needs mechanism=gaussian"):
        DparEdgeParams(mechanism="exponential", weights="noisy-scores")
    with pytest.raises(ValueError, match="degree bound"):
        DparEdgeExtractor(_setup(degree_bound=5, fanout=0))
    ex = DparEdgeExtractor(_setup())
    ex.charge_plan(RootPlan(torch.arange(5), torch.arange(5, 6), torch.arange(6, 7), 1, 1))
    ex.bind(None)
    ex.prepare(FakeSession())
    with pytest.raises(ValueError, match="outside party B's split"):
        ex.release(torch.tensor([20]), "eval")
