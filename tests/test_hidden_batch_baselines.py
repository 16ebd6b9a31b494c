"""Hidden-batch accounting of the GAP and VFGNN baselines (VESPER Theorem 2.1, a reproduction).

VFGNN (docs/extractors/vfgnn.md, section 5): every training step is charged
PoissonSampled(γ, Gaussian(θ/S_step)) with γ of Theorem 2.1 and S_step² = 2 min(N_e, n)
(eq. V8), every step counted; the evaluation sweep keeps its visible-batch rule. GAP
(docs/extractors/gap.md, section 4.1): its hops are released once over the whole graph, so
the hidden-batch plan is the visible-batch plan.

The empirical check runs the production VFGNN extractor (projection, sampler, ``release``
with the noise off, the encoder replaced by the identity so the layer-0 inputs are
adversarial) on G' and G = G' + (u*, v*) with the same secret seeds, over random batches
and over one batch holding every node, and compares each step's L2 change with the
per-step sensitivity the hidden-batch rule uses.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import dp_accounting as dpa
import pytest
import torch
from e2e import fast_run, ledger, vesper
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vesper.accountant.budget import Accountant
from vesper.common.config import ExtractorConfig, PrivacyConfig, RunConfig
from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.events import event_from_json
from vesper.common.privacy.hidden_batch_reproduction import theorem21_gamma
from vesper.common.privacy.ledger import (
    ChargeRule,
    PlanRule,
    Spent,
    check_hidden_batch_events,
    composed_event,
    counted_per_kind,
    spent,
)
from vesper.coordinator.processes import LocalCluster
from vesper.party_a.encoder import GivenEncoding
from vesper.party_a.extractors.base import ChargePlan, ExtractorSetup, RootPlan
from vesper.party_a.extractors.gap import HIDDEN_BATCH_NOTE, GapExtractor
from vesper.party_a.extractors.registry import validated_params
from vesper.party_a.extractors.vfgnn import (
    ROOT_BOUND,
    VfgnnExtractor,
    charge,
    edge_reach,
    hidden_batch_charge,
    step_sensitivity,
)
from vesper.party_a.graph_store import Graph, add_edge, build_graph

DIM = 6
TOLERANCE = 1e-5
ACCOUNTINGS = ("visible-batch", "hidden-batch")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _graph(n: int, edges: list[tuple[int, int]]) -> Graph:
    return build_graph(torch.tensor(edges, dtype=torch.int64).reshape(-1, 2), n)


def _setup(
    config: RunConfig, cls: type[VfgnnExtractor | GapExtractor], graph: Graph, features: torch.Tensor, seed: int
) -> ExtractorSetup:
    return ExtractorSetup(
        config=config, params=validated_params(cls.spec, config), graph=graph, features=features,
        device=torch.device("cpu"), sampling_generator=torch.Generator().manual_seed(seed),
        noise_generator=torch.Generator().manual_seed(seed + 1), delta=1e-5,
    )


def vfgnn_extractor(
    graph: Graph, features: torch.Tensor, accounting: str, *, layers: int = 1, fanout: int = 3,
    degree_bound: int = 0, batch_size: int = 4, seed: int = 0,
) -> VfgnnExtractor:
    """The production extractor, its encoder replaced by the identity (inputs = m^(0))."""
    config = RunConfig(
        extractor=ExtractorConfig(
            name="vfgnn", layers=layers, fanout=fanout, degree_bound=degree_bound, dim=features.shape[1],
            encoder_hidden=8, dropout=0.0,
        ),
        batch_size=batch_size, privacy=PrivacyConfig(accounting=accounting),
    )
    extractor = VfgnnExtractor(_setup(config, VfgnnExtractor, graph, features, seed))
    extractor.encoder = GivenEncoding()
    return extractor.train(False)


def gap_extractor(accounting: str, hops: int = 2) -> GapExtractor:
    graph = _graph(6, [(0, 1), (1, 2), (2, 3), (4, 5)])
    config = RunConfig(
        extractor=ExtractorConfig(name="gap", layers=hops, dim=4, encoder_hidden=8, dropout=0.0,
                                  params={"encoder_epochs": 3}),
        privacy=PrivacyConfig(accounting=accounting),
    )
    return GapExtractor(_setup(config, GapExtractor, graph, torch.rand(6, 5), 0))


def roots(train: int, val: int = 50, test: int = 40, batch_size: int = 4, eval_chunk: int = 4096) -> RootPlan:
    ids = torch.arange(train + val + test)
    chunks = math.ceil(val / eval_chunk) + math.ceil(test / eval_chunk)
    return RootPlan(ids[:train], ids[train: train + val], ids[train + val:],
                    steps_per_epoch=math.ceil(train / batch_size), eval_chunks=chunks)


TINY = _graph(8, [(0, 1), (0, 2), (1, 3), (2, 3), (4, 5), (5, 6)])


def vfgnn_plans(
    layers: int, fanout: int, degree_bound: int, train: int, batch: int
) -> dict[str, tuple[ChargePlan, RootPlan]]:
    """The extractor's plan under each accounting, for a split of ``train`` training roots."""
    plan_roots = roots(train, batch_size=batch)
    return {
        mode: (vfgnn_extractor(TINY, torch.rand(8, DIM), mode, layers=layers, fanout=fanout,
                               degree_bound=degree_bound, batch_size=batch).charge_plan(plan_roots), plan_roots)
        for mode in ACCOUNTINGS
    }


def charged(
    mode: str, plan: ChargePlan, plan_roots: RootPlan, z: float, epochs: int, delta: float, accountant: str
) -> Spent:
    """What the ledger would charge for the whole planned run at noise multiplier z."""
    counted = counted_per_kind(plan.passes(epochs, plan_roots), {r.kind: r.participation_bound for r in plan.rules})
    return spent(mode, accountant, delta, {r.kind: r.event(z) for r in plan.rules}, counted)


def events_epsilon(plan: ChargePlan, plan_roots: RootPlan, z: float, epochs: int, delta: float) -> float:
    """dp-accounting's ε of the plan's events (no bound (6)): defined for every γ, including 1."""
    counted = counted_per_kind(plan.passes(epochs, plan_roots), {r.kind: r.participation_bound for r in plan.rules})
    return epsilon_of(composed_event({r.kind: r.event(z) for r in plan.rules}, counted), delta).epsilon


def calibrated_z(
    mode: str, plan: ChargePlan, plan_roots: RootPlan, target: float, epochs: int, delta: float, accountant: str
) -> float:
    passes = plan.passes(epochs, plan_roots)
    return Accountant.calibrate_gaussian(passes, plan.rules, target, delta, mode, accountant)[0]


def _one_shot_hidden_batch_supported() -> bool:
    """Whether the accountant accepts a one-shot Gaussian release under hidden-batch.

    GAP's hidden-batch runs need that change in common/privacy/ledger.py (reported with this
    file); until it lands, the tests that send GAP's plan through the ledger are skipped.
    """
    try:
        check_hidden_batch_events({"train": dpa.NoOpDpEvent(), "one-shot": dpa.GaussianDpEvent(1.0)})
    except ValueError:
        return False
    return True


needs_one_shot_hidden_batch = pytest.mark.skipif(
    not _one_shot_hidden_batch_supported(),
    reason="the ledger refuses one-shot releases under hidden-batch (see the change to common/privacy/ledger.py)",
)


# --------------------------------------------------------------------------------------
# The plans
# --------------------------------------------------------------------------------------

# (layers, fanout, degree_bound, gamma covers N_e): γ counts 2 Σ_{l<L} D^l roots; vesper's
# N_e is 2 at L = 1 on the raw graph (covered), unbounded at L = 2 on it, 4 and 4D on P(G)
PLAN_SETTINGS = [(1, 3, 0, True), (2, 3, 0, False), (1, 0, 3, False), (2, 0, 3, False)]


@pytest.mark.parametrize("setting", PLAN_SETTINGS, ids=lambda s: "L{}-f{}-D{}".format(*s))
def test_vfgnn_hidden_batch_samples_training_steps_with_theorem_21_gamma(setting) -> None:
    layers, fanout, degree_bound, covers = setting
    train, batch = 200, 16
    plans = vfgnn_plans(layers, fanout, degree_bound, train, batch)
    (visible, _), (hidden, _) = plans["visible-batch"], plans["hidden-batch"]
    gamma = theorem21_gamma(train, batch, degree_bound or fanout, layers)
    assert 0 < gamma < 1
    by_kind = {rule.kind: rule for rule in hidden.rules}
    assert set(by_kind) == {"train", "eval"}
    train_rule, eval_rule = by_kind["train"], by_kind["eval"]
    assert train_rule.participation_bound is None and train_rule.sampling_probability == gamma
    assert train_rule.mechanism == "gaussian" and train_rule.noise_scale == 1.0
    assert train_rule.event(2.0) == dpa.PoissonSampledDpEvent(gamma, dpa.GaussianDpEvent(2.0))
    # the evaluation sweep is charged as under visible-batch
    assert eval_rule == next(rule for rule in visible.rules if rule.kind == "eval")
    read = 0 if degree_bound else fanout  # a projection is read whole
    assert hidden.sensitivity == pytest.approx(step_sensitivity(layers, read, degree_bound, batch))
    assert hidden.sensitivity <= visible.sensitivity * (1 + 1e-12)
    assert hidden.participation_bound is None
    details = hidden.details
    assert details["gamma"] == gamma and details["gamma_covers_reach"] is covers
    assert details["eval_sensitivity"] == visible.details["eval_sensitivity"]
    assert details["edge_reach"] == edge_reach(layers, read, degree_bound)


@given(
    layers=st.integers(1, 3), fanout=st.integers(0, 12), degree_bound=st.integers(0, 12),
    roots_per_release=st.integers(1, 2000),
)
@settings(max_examples=100, deadline=None)
def test_step_sensitivity_is_two_min_reach_and_roots_and_never_above_the_pass(
    layers: int, fanout: int, degree_bound: int, roots_per_release: int
) -> None:
    """Eq. V8: S_step² = 2 min(N_e, n) ≤ S_pass² = 2 N_e, and √(2n) where N_e is unbounded (V7)."""
    read = 0 if degree_bound else fanout
    s = step_sensitivity(layers, read, degree_bound, roots_per_release)
    reach = edge_reach(layers, read, degree_bound)
    n = roots_per_release
    assert s == pytest.approx(ROOT_BOUND * math.sqrt(n if reach is None else min(reach, n)))
    visible = charge(layers, read, degree_bound, {"train": n, "eval": n})
    assert s <= visible.sensitivity["train"] * (1 + 1e-12)
    if reach is not None and reach <= n:
        assert s == pytest.approx(visible.sensitivity["train"])  # no gain: the step can hold all of R


def test_gap_hidden_batch_plan_is_the_visible_batch_plan() -> None:
    assert GapExtractor.spec.accountings == ("visible-batch", "hidden-batch")
    plan_roots = roots(30)
    visible, hidden = (gap_extractor(mode).charge_plan(plan_roots) for mode in ACCOUNTINGS)
    assert hidden.rules == visible.rules
    assert (hidden.sensitivity, hidden.one_shot_releases, hidden.stages, hidden.participation_bound) == (
        visible.sensitivity, visible.one_shot_releases, visible.stages, visible.participation_bound
    )
    assert hidden.passes(5, plan_roots) == visible.passes(5, plan_roots)
    assert hidden.details == {**visible.details, "hidden_batch": HIDDEN_BATCH_NOTE}
    assert "hidden_batch" not in visible.details
    assert "equals its visible-batch ε" in HIDDEN_BATCH_NOTE and "not comparable" in HIDDEN_BATCH_NOTE


@needs_one_shot_hidden_batch
def test_gap_hidden_batch_spends_and_calibrates_exactly_as_visible_batch() -> None:
    plan_roots, delta = roots(30), 1 / 5278
    plans = {mode: gap_extractor(mode).charge_plan(plan_roots) for mode in ACCOUNTINGS}
    for z in (0.7, 1.3, 4.0):
        visible, hidden = (charged(mode, plans[mode], plan_roots, z, 3, delta, "pld") for mode in ACCOUNTINGS)
        assert hidden.epsilon == visible.epsilon == epsilon_of(
            dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(z), 2), delta).epsilon
    z_visible, z_hidden = (calibrated_z(mode, plans[mode], plan_roots, 4.0, 3, delta, "pld") for mode in ACCOUNTINGS)
    assert z_hidden == z_visible  # the same noise std z · √2 per hop


# --------------------------------------------------------------------------------------
# What hidden-batch charges VFGNN, against visible-batch
# --------------------------------------------------------------------------------------


def test_amplification_lowers_vfgnn_epsilon_and_noise_where_batches_are_a_small_fraction() -> None:
    """4,000 training roots in batches of 32 (γ = 0.016): hidden-batch ε at a fixed z is below
    visible-batch's, and so is the calibrated noise std, in training and in the sweep.

    ε falls as z grows under both modes, and calibration returns the smallest z within the
    target: hidden-batch meeting the target at visible-batch's calibrated z proves z_hidden ≤ z_visible.
    """
    delta, epochs, target = 1e-5, 2, 4.0
    plans = vfgnn_plans(1, 10, 0, 4000, 32)
    (visible, plan_roots), (hidden, _) = plans["visible-batch"], plans["hidden-batch"]
    assert hidden.details["gamma"] == pytest.approx(0.01594, abs=1e-5)
    assert hidden.sensitivity == visible.sensitivity  # N_e = 2 ≤ n: S_step = S_pass = 2
    v = charged("visible-batch", visible, plan_roots, 1.0, epochs, delta, "pld")
    h = charged("hidden-batch", hidden, plan_roots, 1.0, epochs, delta, "rdp")
    assert h.epsilon < v.epsilon and h.epsilon_events < v.epsilon  # measured 5.19 (bound 6) against 8.39
    z_visible = calibrated_z("visible-batch", visible, plan_roots, target, epochs, delta, "pld")
    at_visible_noise = charged("hidden-batch", hidden, plan_roots, z_visible, epochs, delta, "rdp")
    assert at_visible_noise.epsilon < 0.75 * target  # so z_hidden < z_visible (measured 1.25 against 1.87)
    for s_visible, s_hidden in ((visible.sensitivity, hidden.sensitivity),
                                (visible.details["eval_sensitivity"], hidden.details["eval_sensitivity"])):
        assert s_hidden <= s_visible  # θ = z · S: smaller z, no larger S


@pytest.mark.parametrize("train, batch", [(300, 300), (300, 299)])
def test_gamma_one_amplifies_nothing_and_is_refused(train: int, batch: int) -> None:
    """N_T − N_e < B: every batch holds an endpoint and γ = 1. Charged as Theorem 2.1 would
    (every step a Gaussian), the events equal visible-batch's with one batch per epoch and
    exceed them with two; bound (6) is then above any budget, so the plugin refuses the plan
    with a clear message instead of letting the accountant fail on it."""
    delta, epochs = 1e-5, 3
    plan_roots = roots(train, batch_size=batch)
    largest = {"train": batch, "eval": 50}
    hidden = hidden_batch_charge(1, 10, 0, train, batch, largest, 10)
    assert hidden.gamma == 1.0 and hidden.train_sensitivity == pytest.approx(2.0)
    as_theorem_21 = ChargePlan(
        [PlanRule(kind="train", participation_bound=None, sampling_probability=hidden.gamma),
         PlanRule(kind="eval", participation_bound=hidden.evaluation.participation_bound)],
        hidden.train_sensitivity,
    )
    plugin = {mode: vfgnn_extractor(TINY, torch.rand(8, DIM), mode, fanout=10, batch_size=batch) for mode in ACCOUNTINGS}
    visible = plugin["visible-batch"].charge_plan(plan_roots)
    for z in (1.0, 4.0):
        v, h = (events_epsilon(p, plan_roots, z, epochs, delta) for p in (visible, as_theorem_21))
        if plan_roots.steps_per_epoch == 1:
            assert h == pytest.approx(v, rel=1e-12)
        else:
            assert h > v
    with pytest.raises(ValueError, match="γ = 1 .* use visible-batch"):
        plugin["hidden-batch"].charge_plan(plan_roots)


def test_bound_6_makes_hidden_batch_dearer_on_a_cora_sized_split() -> None:
    """1,354 training roots in batches of 256 (Cora's split), 20 epochs: γ = 0.34 and bound (6)
    does not fall below ε ≈ 7.2 however large z is (its j ≥ 3 terms tend to 2 γ^j C(α, j),
    not to 0), so hidden-batch charges more than visible-batch at every z and cannot be
    calibrated to ε = 4 at all (docs/extractors/vfgnn.md, section 5.3). Bound (6) falls as z
    grows, so exceeding 4 at z = 10^6 (calibration's ceiling) means no z reaches 4."""
    delta, epochs = 1 / 5278, 20
    plans = vfgnn_plans(1, 10, 0, 1354, 256)
    (visible, plan_roots), (hidden, _) = plans["visible-batch"], plans["hidden-batch"]
    for z in (1.0, 1e6):
        v = charged("visible-batch", visible, plan_roots, z, epochs, delta, "pld")
        h = charged("hidden-batch", hidden, plan_roots, z, epochs, delta, "rdp")
        assert h.epsilon > v.epsilon and h.epsilon_bound6 > 7.1 > 4.0, z
    assert calibrated_z("visible-batch", visible, plan_roots, 4.0, epochs, delta, "pld") == pytest.approx(4.2, abs=0.1)


# --------------------------------------------------------------------------------------
# Empirical per-step sensitivity (eq. V8)
# --------------------------------------------------------------------------------------


def largest_step_ratio(
    graph: Graph, edge: tuple[int, int], inputs: torch.Tensor, *, layers: int, fanout: int, degree_bound: int,
    batch_size: int, batches: int, seed: int,
) -> float:
    """max over steps of ‖release(G) − release(G')‖ / S_step(n) (no noise), for one batch of
    every node and ``batches`` random batches of ``batch_size`` roots; ≤ 1 iff V8 holds."""
    pair = [vfgnn_extractor(g, inputs, "hidden-batch", layers=layers, fanout=fanout, degree_bound=degree_bound,
                            batch_size=batch_size, seed=seed)
            for g in (graph, add_edge(graph, *edge))]
    read = 0 if degree_bound else fanout
    order = torch.Generator().manual_seed(seed)
    n = graph.num_nodes
    steps = [torch.arange(n)] + [torch.randperm(n, generator=order)[: min(batch_size, n)] for _ in range(batches)]
    worst = 0.0
    with torch.no_grad():
        for batch in steps:
            before, after = (ex.release(batch, "train") for ex in pair)  # z never bound: no noise
            assert torch.equal(before[..., 0], after[..., 0])  # h^(0) reads no edge
            distance = float((after - before).norm())
            worst = max(worst, distance / step_sensitivity(layers, read, degree_bound, batch.numel()))
    return worst


def _star(centre: int, leaves: range) -> list[tuple[int, int]]:
    return [(centre, leaf) for leaf in leaves]


def _one_hot(n: int, rng: random.Random, zero: tuple[int, ...] = ()) -> torch.Tensor:
    h = torch.zeros(n, DIM)
    for node in range(n):
        if node not in zero:
            h[node, rng.randrange(DIM)] = 1.0
    return h


def test_hidden_batch_step_sensitivity_holds_on_adversarial_pairs_and_half_of_it_is_exceeded() -> None:
    rng = random.Random(3)
    # u* = 0 ~ 2, v* = 1 ~ 3 at fanout 1: u* (zero of its own) can swap 2 for v*, turning by √2
    swap = _graph(4, [(0, 2), (1, 3)])
    swap_inputs = torch.zeros(4, DIM)
    swap_inputs[1, 0] = swap_inputs[2, 1] = swap_inputs[3, 2] = 1.0
    # u*, v*, u' = 2, v' = 3 with D = 3 neighbours each: the projection's T1 moves 4 roots (12 at L = 2)
    full = _graph(12, [(0, 2), (0, 4), (0, 5), (1, 3), (1, 6), (1, 7), (2, 8), (2, 9), (3, 10), (3, 11)])
    hub = _graph(16, _star(1, range(2, 16)))  # L = 2 on the raw graph: every leaf that samples v* moves
    hub_inputs = torch.zeros(16, DIM)
    hub_inputs[0, 0] = 1.0  # only u* carries a vector: every leaf's output turns from 0 to it
    cases = {
        "swap at fanout 1": (swap, (0, 1), swap_inputs, dict(layers=1, fanout=1, degree_bound=0, batch_size=2)),
        "T1 on P(G), L = 1": (full, (0, 1), _one_hot(12, rng, (0, 1)),
                              dict(layers=1, fanout=0, degree_bound=3, batch_size=4)),
        "T1 on P(G), L = 2": (full, (0, 1), _one_hot(12, rng, (0, 1)),
                              dict(layers=2, fanout=0, degree_bound=3, batch_size=8)),
        "hub, L = 2, raw": (hub, (0, 1), hub_inputs, dict(layers=2, fanout=3, degree_bound=0, batch_size=6)),
    }
    worst = {}
    for name, (graph, edge, inputs, kw) in cases.items():
        worst[name] = max(largest_step_ratio(graph, edge, inputs, batches=8, seed=seed, **kw) for seed in range(4))
        assert worst[name] <= 1 + TOLERANCE, (name, worst[name])
    # a deliberately halved per-step sensitivity is exceeded: the bound is not vacuous
    assert worst["swap at fanout 1"] > 0.55 and worst["hub, L = 2, raw"] > 0.55, worst


@st.composite
def neighbouring_pairs(draw: st.DrawFn) -> tuple[Graph, tuple[int, int], torch.Tensor, dict]:
    n = draw(st.integers(2, 12))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    present = draw(st.lists(st.booleans(), min_size=len(pairs), max_size=len(pairs)))
    edges = [p for p, keep in zip(pairs, present) if keep]
    missing = [p for p, keep in zip(pairs, present) if not keep] or [edges.pop()]
    edge = draw(st.sampled_from(missing))
    zero = draw(st.sets(st.integers(0, n - 1), max_size=n // 2))
    inputs = _one_hot(n, random.Random(draw(st.integers(0, 1 << 20))), tuple(zero))
    layers = draw(st.integers(1, 2))
    projected = draw(st.booleans())
    # hidden-batch needs a fanout or a degree bound (the D of Theorem 2.1)
    kw = dict(layers=layers, fanout=0 if projected else draw(st.integers(1, 3)),
              degree_bound=draw(st.integers(2, 3)) if projected else 0, batch_size=draw(st.integers(1, 6)))
    return _graph(n, edges), edge, inputs, kw


@given(neighbouring_pairs(), st.integers(0, 1000))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_hidden_batch_step_sensitivity_holds_on_random_pairs(pair, seed: int) -> None:
    graph, edge, inputs, kw = pair
    assert largest_step_ratio(graph, edge, inputs, batches=3, seed=seed, **kw) <= 1 + TOLERANCE


# --------------------------------------------------------------------------------------
# End to end: one hidden-batch run of each through the services
# --------------------------------------------------------------------------------------


def _train_hidden(cluster: LocalCluster, out: Path, *flags: str) -> dict:
    args = fast_run("--accounting", "hidden-batch", "--epsilon", "4", *flags)
    args[args.index("--epochs") + 1] = "1"
    code, output = vesper("train", "--party-a", cluster.party_a_address, *args, "--json-out", str(out))
    summary = json.loads(out.read_text())
    assert code == 0 and summary["status"] == "completed", output
    assert summary["accounting"] == "hidden-batch" and "ASSUMES party B cannot tell" in summary["assumption"]
    assert 0 < summary["epsilon_spent"] <= summary["epsilon_budget"] == 4
    # the live progress line and the summary table name the mode of every ε they show
    table_row = next(line for line in output.splitlines() if line.strip().startswith(summary["run_id"]))
    assert "/ 4 (hidden-batch)" in output.splitlines()[0] and table_row.rstrip().endswith("/ 4 (hidden-batch)"), output
    assert "visible-batch" not in output, output
    code, output = vesper("ledger", "verify", summary["run_id"], "--url", cluster.status_url)
    assert code == 0, output
    return summary


@pytest.mark.e2e
def test_vfgnn_hidden_batch_run_through_the_services(cluster: LocalCluster, tmp_path: Path) -> None:
    # rdp: under hidden-batch every step is counted, and pld would recompose ~0.2 s per charge
    summary = _train_hidden(cluster, tmp_path / "vfgnn.json", "--extractor", "vfgnn", "--accountant", "rdp")
    record = ledger(cluster.status_url, summary["run_id"])
    details, rules = record["run"]["details"], {r["kind"]: r for r in record["run"]["rules"]}
    z = summary["noise_multiplier"]
    assert details["gamma"] == theorem21_gamma(details["train_nodes"], 256, 10, 1)
    assert event_from_json(rules["train"]["release_event"]) == dpa.PoissonSampledDpEvent(
        details["gamma"], dpa.GaussianDpEvent(z))
    assert rules["train"]["participation_bound"] is None
    assert event_from_json(rules["eval"]["release_event"]) == dpa.GaussianDpEvent(z)
    assert rules["eval"]["participation_bound"] == 1  # the sweep's visible-batch per-pass rule
    assert summary["noise_std"] == pytest.approx(2.0 * z)  # S_step = √(2 min(N_e, n)) = 2
    train_rows = [r for r in record["rows"] if r["kind"] == "train"]
    assert len(train_rows) == summary["steps"] > 0 and all(r["counted"] for r in train_rows)
    assert summary["epsilon_spent"] == max(summary["epsilon_events"], summary["epsilon_bound6"])


@pytest.mark.e2e
@needs_one_shot_hidden_batch
def test_gap_hidden_batch_run_through_the_services(cluster: LocalCluster, tmp_path: Path) -> None:
    summary = _train_hidden(cluster, tmp_path / "gap.json", "--extractor", "gap", "--param", "encoder_epochs=1")
    record = ledger(cluster.status_url, summary["run_id"])
    rules = {r["kind"]: ChargeRule.model_validate(r) for r in record["run"]["rules"]}
    z = summary["noise_multiplier"]
    assert event_from_json(rules["one-shot"].release_event) == dpa.GaussianDpEvent(z)
    assert record["run"]["details"]["hidden_batch"] == HIDDEN_BATCH_NOTE
    # K = 1 hop: ε is one Gaussian's, exactly what visible-batch charges (gaussian-exact)
    assert summary["epsilon_spent"] == pytest.approx(epsilon_of(dpa.GaussianDpEvent(z), summary["delta"]).epsilon, rel=1e-12)
    assert summary["epsilon_spent"] == pytest.approx(4.0, rel=1e-6)
