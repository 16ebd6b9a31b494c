"""ProGAP (party_a.extractors.progap): its stages, its charges and its empirical sensitivity.

Hop k + 1 aggregates h_k = f_k(...), the embedding stage k trained; f_k ends in a row
normalisation, so each hop is GAP's, with GAP's S = √2 (docs/extractors/progap.md). The
sensitivity checks run the extractor's own hop (``release_hop`` with the noise off) on
neighbouring graphs G' and G = G' + (u*, v*) from the same h (adaptive composition: h is
a function of the features and the hops already released, the same under both graphs).
The whole release on neighbouring graphs is tests/test_release_independence.py's.
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import random_graph

from vesper.common.config import ExtractorConfig, RunConfig
from vesper.common.privacy.ledger import counted_per_kind
from vesper.party_a.extractors import gap as gap_module
from vesper.party_a.extractors.base import ExtractorSetup, RootPlan, Stage
from vesper.party_a.extractors.gap import HOP_SENSITIVITY, row_normalise
from vesper.party_a.extractors.progap import ProgapExtractor
from vesper.party_a.extractors.registry import lookup, validated_params, with_run_defaults
from vesper.party_a.graph_store import Graph, add_edge, build_graph
from vesper.party_a.peers import BudgetRefused

TOLERANCE = 1e-5  # float32 sums of unit rows

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_extractor(
    graph: Graph, features: torch.Tensor, *, hops: int = 2, dim: int = 8, stage_epochs: int = 1, seed: int = 0,
    hop_norm: bool = True,
) -> ProgapExtractor:
    config = RunConfig(
        seed=seed,
        extractor=ExtractorConfig(
            name="progap", layers=hops, dim=dim, encoder_hidden=16, dropout=0.5, params={"stage_epochs": stage_epochs, "hop_norm": hop_norm},
        ),
    )
    setup = ExtractorSetup(
        config=config, params=validated_params(ProgapExtractor.spec, config), graph=graph, features=features,
        device=torch.device("cpu"), sampling_generator=torch.Generator().manual_seed(1),
        noise_generator=torch.Generator().manual_seed(7), delta=1e-5,
    )
    return ProgapExtractor(setup)


class FakeSession:
    """A PrepareSession that records stages, hop charges and what each stage released."""

    def __init__(self, num_nodes: int, log: list | None = None, refuse_at: int | None = None) -> None:
        ids = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(0))
        third = num_nodes // 3
        self.roots = RootPlan(ids[:third], ids[third: 2 * third], ids[2 * third:], steps_per_epoch=3, eval_chunks=2)
        self.log = [] if log is None else log
        self.refuse_at = refuse_at
        self.charges: list[tuple[int, torch.Tensor]] = []
        self.stage_outputs: list[torch.Tensor] = []

    def charge_one_shot(self, index: int, node_ids: torch.Tensor) -> None:
        if index == self.refuse_at:
            raise BudgetRefused(f"one-shot release {index} does not fit")
        self.log.append(("charge", index))
        self.charges.append((index, node_ids.clone()))

    def train_stage(self, stage: Stage, release, parameters) -> None:
        parameters = list(parameters)
        self.log.append(("stage", stage.name, stage.layers, len(parameters)))
        out = release(self.roots.train_ids)
        assert out.shape[-1] == stage.layers
        out.sum().backward()  # B's gradient reaches every base the stage trains
        assert all(p.grad is not None for p in parameters)
        self.stage_outputs.append(out.detach())

    def progress(self, message: str) -> None:
        pass


def prepared(graph: Graph, features: torch.Tensor, z: float | None = 0.5, **kwargs) -> tuple[ProgapExtractor, FakeSession]:
    ex = make_extractor(graph, features, **kwargs)
    ex.bind(z)
    session = FakeSession(graph.num_nodes)
    ex.prepare(session)
    return ex, session


def test_registered_with_k_plus_one_slices_and_two_hops_by_default() -> None:
    assert lookup("progap") is ProgapExtractor
    bare = RunConfig.model_validate({"dataset": "tolokers", "extractor": {"name": "progap"}})
    applied, _ = with_run_defaults(bare)
    assert (applied.extractor.layers, applied.extractor.dim, applied.epochs) == (2, 16, 20)
    ex = make_extractor(random_graph(random.Random(0), 12, 0.3), torch.rand(12, 4), hops=3)
    assert ex.output_layers == 4


def test_charge_plan_is_k_gaussian_hops_and_k_free_stages() -> None:
    ex = make_extractor(random_graph(random.Random(0), 12, 0.3), torch.rand(12, 4), hops=3, stage_epochs=5)
    plan = ex.charge_plan(FakeSession(12).roots)
    assert plan.one_shot_releases == 3 and plan.sensitivity == HOP_SENSITIVITY
    assert [(s.name, s.epochs, s.layers) for s in plan.stages] == [("stage-0", 5, 1), ("stage-1", 5, 2), ("stage-2", 5, 3)]
    rules = {rule.kind: rule for rule in plan.rules}
    assert rules["one-shot"].mechanism == "gaussian" and rules["one-shot"].participation_bound is None
    assert rules["train"].mechanism == "no-op" and rules["eval"].mechanism == "no-op"
    passes = plan.passes(epochs=10, roots=FakeSession(12).roots)
    bounds = {rule.kind: rule.participation_bound for rule in plan.rules}
    counted = counted_per_kind(passes, bounds)
    assert counted["one-shot"] == 3  # K hops, whatever the epochs: the stages' and the run's are no-op


def test_each_stage_trains_before_its_hop_and_each_hop_is_charged_before_any_use(monkeypatch) -> None:
    log: list = []
    real = gap_module.aggregate

    def logged(adjacency: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        log.append(("aggregate",))
        return real(adjacency, x)

    monkeypatch.setattr(gap_module, "aggregate", logged)
    graph = random_graph(random.Random(1), 24, 0.2)
    ex = make_extractor(graph, torch.rand(24, 5), hops=2)
    ex.bind(0.5)
    session = FakeSession(24, log)
    ex.prepare(session)
    encoder, base = len(list(ex.encoder.parameters())), len(list(ex.bases[0].parameters()))
    assert log == [
        ("stage", "stage-0", 1, encoder), ("aggregate",), ("charge", 0),
        ("stage", "stage-1", 2, encoder + base), ("aggregate",), ("charge", 1),
    ]
    assert all(torch.equal(nodes, torch.arange(24)) for _, nodes in session.charges)


def test_a_refused_hop_leaves_nothing_to_release() -> None:
    graph = random_graph(random.Random(1), 24, 0.2)
    ex = make_extractor(graph, torch.rand(24, 5), hops=3)
    ex.bind(0.5)
    session = FakeSession(24, refuse_at=1)
    with pytest.raises(BudgetRefused):
        ex.prepare(session)
    assert [entry for entry in session.log if entry[0] == "charge"] == [("charge", 0)]
    with pytest.raises(RuntimeError, match="prepare"):
        ex.release(torch.arange(5), "train")


def test_the_first_stage_reads_no_edge() -> None:
    features = torch.rand(30, 6)
    graph = random_graph(random.Random(2), 30, 0.3)
    edgeless = build_graph(torch.empty(0, 2, dtype=torch.int64), 30)
    outputs = [prepared(g, features)[1].stage_outputs[0] for g in (graph, edgeless)]
    assert torch.equal(outputs[0], outputs[1])


def test_the_run_releases_every_stage_and_trains_every_base() -> None:
    graph = random_graph(random.Random(3), 30, 0.2)
    ex, _ = prepared(graph, torch.rand(30, 5), hops=2)
    assert set(map(id, ex.trainable_parameters())) == set(map(id, ex.parameters()))
    ex.train()
    roots = torch.tensor([4, 0, 29])
    out = ex.release(roots, "train")
    assert out.shape == (3, 8, 3)
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in ex.parameters())
    ex.train(False)
    with torch.no_grad():
        assert torch.equal(ex.release(roots, "eval"), ex.release(roots, "eval"))  # no dropout in evaluation
        assert torch.allclose(ex.release(roots, "eval").norm(dim=1), torch.ones(3, 3), atol=1e-5)


@pytest.mark.parametrize("hop_norm", [True, False])
def test_without_noise_a_hop_is_the_normalised_sum_of_the_neighbours_embeddings(hop_norm: bool) -> None:
    """x̃_1 = A h_0 / ‖A h_0‖, and (hop_norm) log(1 + ‖A h_0‖) as one more column: f_1's input."""
    graph = random_graph(random.Random(4), 20, 0.25)
    ex, _ = prepared(graph, torch.rand(20, 5), z=None, hops=1, hop_norm=hop_norm)
    ex.train(False)
    h = ex.last_embedding(0)  # f_0 is not trained by the run before this read
    summed = torch.stack([h[graph.neighbours(v)].sum(0) for v in range(20)])
    expected = row_normalise(summed)
    if hop_norm:
        expected = torch.cat([expected, torch.log1p(summed.norm(dim=-1, keepdim=True))], dim=-1)
    assert ex.released.shape == (20, 8 + hop_norm, 1) and ex.bases[0].net[0].in_features == 8 + hop_norm
    assert torch.allclose(ex.released[:, :, 0], expected, atol=1e-5)
    assert float(expected[:, -1].std()) > 0 or not hop_norm  # the degrees differ: the column carries them


@pytest.mark.parametrize("seed", range(4))
def test_the_extractors_own_hops_change_by_at_most_root_two(seed: int) -> None:
    """Through ProgapExtractor.release_hop on G' and G, noise off: from the same h (any rows,
    even of norm > 1: the hop normalises them), exactly rows u*, v* move, by ≤ √2 in all."""
    rng = random.Random(seed)
    graph = random_graph(rng, 30, 0.15)
    u, v = rng.sample(range(30), 2)
    while v in graph.neighbours(u).tolist():
        u, v = rng.sample(range(30), 2)
    features = torch.rand(30, 5, generator=torch.Generator().manual_seed(seed))
    without, with_edge = (make_extractor(g, features, hops=2) for g in (graph, add_edge(graph, u, v)))
    h = 3.0 * torch.randn(30, 8, generator=torch.Generator().manual_seed(seed))
    moved = []
    for ex in (without, with_edge):
        ex.bind(None)
        session = FakeSession(30)
        pre_normalise = ex.noisy_hop(row_normalise(h))
        released = ex.release_hop(h, 1, session, torch.arange(30))
        assert torch.allclose(released[:, :-1], row_normalise(pre_normalise))  # and its norm's log: post-processing
        assert torch.allclose(released[:, -1], torch.log1p(pre_normalise.norm(dim=-1)))
        moved.append(pre_normalise)
    delta = moved[1] - moved[0]
    assert set(delta.abs().sum(1).nonzero().flatten().tolist()) <= {u, v}
    assert float(delta.norm()) <= HOP_SENSITIVITY + TOLERANCE
    assert float(delta.norm()) > 1.0  # two unit rows: the bound is nearly attained, not vacuous
