"""The edge-free path (issue #21 item 1; docs/privacy.md section 2.5): every edge-level
extractor's release carries the MLP's layers, and B keeps the better head by validation."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from vesper.common.config import DecoderConfig, ExtractorConfig, OptimizerConfig, PrivacyConfig, RunConfig
from vesper.common.dataset_files import resolve_dataset
from vesper.party_a.extractors.base import ExtractorSetup, RootPlan, Stage
from vesper.party_a.extractors.edge_free_path import (
    PATH_STAGE,
    WithEdgeFreePath,
    baseline_epochs,
    build_extractor,
    edge_free_layers,
    unwrapped,
)
from vesper.party_a.extractors.pmp_plugin import MlpPlugin
from vesper.party_a.extractors.registry import installed, lookup, validated_params
from vesper.party_a.graph_store import build_graph
from vesper.party_b.decoders import FallbackDecoder, build_decoder
from vesper.party_b.label_data import load_labels
from vesper.party_b.session import LabelSession, SplitScores

NODES = 30


def _setup(
    name: str, path: bool = True, seed: int = 4, epochs: int = 50, edge_free_key: tuple[int, int] | None = None,
    **extractor: Any,
) -> ExtractorSetup:
    edges = torch.tensor([[i, (i + 1) % NODES] for i in range(NODES)] + [[i, (i + 7) % NODES] for i in range(NODES)])
    config = RunConfig(
        dataset="tiny", seed=3, epochs=epochs, privacy=PrivacyConfig(epsilon=8.0, edge_bound=200),
        extractor=ExtractorConfig(**{
            "name": name, "layers": 2, "fanout": 3, "dim": 5, "encoder_hidden": 7, "dropout": 0.5, "noise_multiplier": 1.0,
            "edge_free_path": path, "params": {"encoder_epochs": 0} if name == "gap" else {}, **extractor,
        }),
    )
    return ExtractorSetup(
        config=config, params=validated_params(lookup(name).spec, config), graph=build_graph(edges, NODES),
        features=torch.randn(NODES, 6, generator=torch.Generator().manual_seed(0)), device=torch.device("cpu"),
        sampling_generator=torch.Generator().manual_seed(seed), noise_generator=torch.Generator().manual_seed(seed + 1),
        delta=1e-6, edge_free_key=edge_free_key,
    )


ROOTS = RootPlan(torch.arange(0, 10), torch.arange(10, 20), torch.arange(20, 30), steps_per_epoch=2, eval_chunks=2)


def test_every_edge_level_extractor_that_reads_edges_carries_the_path_and_no_other_does() -> None:
    for found in installed():
        spec = found.extractor.spec
        expected = spec.privacy_unit == "edge" and spec.cost_model != "none"
        extractor = build_extractor(found.extractor, _setup(spec.name)) if spec.name in ("mlp", "pmp-gcn", "gap") else None
        if extractor is not None:
            assert isinstance(extractor, WithEdgeFreePath) is expected, spec.name
    off = build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn", path=False))
    assert not isinstance(off, WithEdgeFreePath) and edge_free_layers(off) == 0


def test_the_release_is_the_extractor_s_then_the_mlp_s_and_the_charges_are_the_extractor_s() -> None:
    wrapped = build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn"))
    alone = lookup("pmp-gcn")(_setup("pmp-gcn", path=False))
    mlp = MlpPlugin(_setup("mlp"))
    assert unwrapped(wrapped).spec.name == "pmp-gcn"
    assert wrapped.output_layers == alone.output_layers + mlp.output_layers == 4
    assert edge_free_layers(wrapped) == 2
    plan, plain = wrapped.charge_plan(ROOTS), alone.charge_plan(ROOTS)
    assert plan.rules == plain.rules and plan.sensitivity == plain.sensitivity
    assert plan.details["edge_free_path"]["layers"] == 2
    for extractor in (wrapped, alone):
        extractor.bind(1.0)
        extractor.train(False)
    roots = torch.arange(5)
    # the extractor draws first: its part of the release is what it releases without the path
    assert torch.equal(wrapped.release(roots, "eval")[..., :2], alone.release(roots, "eval"))
    mlp.train(False)
    free = wrapped.release(torch.arange(5, 9), "eval")[..., 2:]
    mlp.load_state_dict(wrapped.path.state_dict())
    assert torch.allclose(free, mlp.release(torch.arange(5, 9), "eval"))


def test_the_path_draws_the_mlp_run_s_dropout_keys_whatever_the_extractor_draws() -> None:
    """Common random numbers: with the same edge-free secret, the path's training releases are the
    MLP run's, bit for bit, though PMP-GCN draws its samples from the sampling generator first;
    its stream's position is part of the state dict (checkpoints, workers)."""
    key = (0x1234, 0xBEEF)
    wrapped = build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn", edge_free_key=key))
    mlp = build_extractor(lookup("mlp"), _setup("mlp", seed=99, edge_free_key=key))  # its sampling generator: unused
    legacy = build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn"))  # keys from the sampling generator, as before
    for extractor in (wrapped, mlp, legacy):
        extractor.bind(1.0)
        extractor.train()
    batches = [torch.arange(0, 6), torch.arange(6, 12), torch.arange(3, 9)]
    with torch.no_grad():
        for roots in batches:
            free, alone, old = wrapped.release(roots, "train")[..., 2:], mlp.release(roots, "train"), legacy.release(roots, "train")[..., 2:]
            assert torch.equal(free, alone)
            assert not torch.equal(old, alone)  # dropout at p = 0.5 under other keys: another release
    assert int(wrapped.state_dict()["path.stream_position"]) == int(mlp.state_dict()["stream_position"]) == 3
    # a checkpoint's state goes on with the stream where it stood
    resumed = build_extractor(lookup("mlp"), _setup("mlp", edge_free_key=(1, 2)))
    resumed.load_state_dict(mlp.state_dict())
    resumed.bind(1.0)
    resumed.train()
    with torch.no_grad():
        assert torch.equal(resumed.release(batches[0], "train"), mlp.release(batches[0], "train"))
    # another secret, other masks
    first, other = (build_extractor(lookup("mlp"), _setup("mlp", edge_free_key=k)) for k in (key, (key[0] + 1, key[1])))
    for extractor in (first, other):
        extractor.bind(1.0)
        extractor.train()
    with torch.no_grad():
        assert not torch.equal(other.release(batches[0], "train"), first.release(batches[0], "train"))


def test_the_stream_s_secret_is_kept_for_a_resume_and_a_run_recorded_before_it_keeps_its_keys() -> None:
    """SecretGenerators.edge_free: drawn under its own label, from the resume record on resume;
    a record without it (a run begun before the stream) resumes with the sampling generator's
    keys and no stream buffers, so its checkpoints load."""
    from vesper.common.config import PartyAConfig
    from vesper.party_a.run.secrets import SecretGenerators

    cpu = torch.device("cpu")
    fresh = SecretGenerators(PartyAConfig(), 3, cpu)  # no secret_seed: OS randomness
    assert fresh.edge_free is not None and fresh.edge_free != SecretGenerators(PartyAConfig(), 3, cpu).edge_free
    record = {"sampling": fresh.sampling.get_state(), "noise": fresh.noise.get_state()}
    assert SecretGenerators(PartyAConfig(), 3, cpu, {**record, "edge_free": fresh.edge_free}).edge_free == fresh.edge_free
    assert SecretGenerators(PartyAConfig(), 3, cpu, record).edge_free is None
    legacy = build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn"))
    assert not any("stream" in key for key in legacy.state_dict())
    build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn")).load_state_dict(legacy.state_dict())


def test_a_path_wider_than_the_run_is_released_as_slices_b_s_concat_decoder_reads_as_the_mlp_s() -> None:
    """d_f = 2 d: each layer of the path goes out as 2 slices of d, and B's concat decoder reads
    the very vector the MLP run's decoder reads (same numbers, same order, same first layer)."""
    key = (5, 6)
    wrapped = build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn", edge_free_key=key, edge_free_path_dim=10))
    mlp = build_extractor(lookup("mlp"), _setup("mlp", edge_free_key=key, dim=10))
    assert wrapped.fold == 2 and edge_free_layers(wrapped) == 2 * 2 and wrapped.output_layers == 2 + 4
    assert wrapped.charge_plan(ROOTS).details["edge_free_path"] | {} == {
        "layers": 4, "width": 10, "charged": "nothing: the MLP's layers read no edge", "stage_epochs": 0,
    }
    for extractor in (wrapped, mlp):
        extractor.bind(1.0)
        extractor.train()
    roots = torch.arange(7)
    with torch.no_grad():
        free, alone = wrapped.release(roots, "train")[..., 2:], mlp.release(roots, "train")
    assert free.shape == (7, 5, 4) and alone.shape == (7, 10, 2)
    assert torch.equal(free[:, :, 1], alone[:, 5:, 0]) and torch.equal(free[:, :, 2], alone[:, :5, 1])
    config = DecoderConfig(hidden_dim=8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        head = FallbackDecoder(config, 5, 6, 4, 3).edge_free
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        baseline = build_decoder(config, 10, 2, 3)
    assert torch.equal(head.net[0].weight, baseline.net[0].weight)
    assert torch.equal(head(free), baseline(alone))
    with pytest.raises(ValueError, match="not a multiple of extractor.dim = 5"):
        build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn", edge_free_path_dim=12))


def test_where_an_extractor_s_defaults_narrow_the_run_its_path_keeps_the_mlp_s_settings() -> None:
    """GAP's d = 16 and progap's L = 2 are theirs, not the MLP baseline's (d = 64, L = 1): the run
    records the baseline's for the path; what the run sets itself, the path takes too."""
    from vesper.party_a.extractors.registry import with_run_defaults

    def path(extractor: dict) -> tuple[int | None, int | None]:
        config, _ = with_run_defaults(RunConfig.model_validate({"extractor": extractor}))
        return config.extractor.edge_free_path_layers, config.extractor.edge_free_path_dim

    assert path({"name": "gap"}) == (None, 64)  # GAP's L = 1 is the MLP's
    assert path({"name": "progap"}) == (1, 64)
    assert path({"name": "gap", "dim": 32}) == (None, None)  # the run's d = 32 is the MLP run's too
    assert path({"name": "gap", "edge_free_path": False}) == (None, None)
    assert path({"name": "gap", "edge_free_path_dim": 16}) == (None, 16)  # set by the run: kept
    assert path({"name": "pmp-gcn"}) == (None, None)
    assert path({"name": "heterpoisson"}) == (None, None)  # node-level: it carries no path at all


def test_b_s_gradient_trains_the_path_even_when_the_extractor_trains_nothing() -> None:
    """GAP trains nothing after its stage; with the path, A's optimiser has the MLP's parameters."""
    extractor = build_extractor(lookup("gap"), _setup("gap"))
    assert unwrapped(extractor).trainable_parameters() == []
    parameters = extractor.trainable_parameters()
    assert parameters and all(any(p is q for q in extractor.path.parameters()) for p in parameters)
    extractor.bind(1.0)

    class Session:
        roots = ROOTS

        def charge_one_shot(self, index, node_ids):
            pass

        def progress(self, message):
            pass

    extractor.prepare(Session())
    extractor.train()
    release = extractor.release(torch.arange(6), "train")
    assert release.requires_grad and release.shape == (6, 5, 3 + 2)  # x̃_0 and two hops; the MLP's two layers
    before = [p.detach().clone() for p in parameters]
    optimizer = torch.optim.SGD(parameters, lr=0.5)
    release.backward(torch.ones_like(release))
    optimizer.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, parameters, strict=True))


def test_a_one_shot_extractor_s_path_first_trains_alone_for_the_rest_of_the_baseline_s_epochs() -> None:
    """GAP stops at 20 epochs to spare its fixed noise; its path then trains 30 alone first, so A's
    MLP layers train the baseline's 50 in all. Free: a stage's releases are no-op, the rules unchanged."""
    assert baseline_epochs() == 50
    short = build_extractor(lookup("gap"), _setup("gap", epochs=20))
    plan, unstaged = short.charge_plan(ROOTS), build_extractor(lookup("gap"), _setup("gap", epochs=50)).charge_plan(ROOTS)
    assert plan.stages == (Stage(name=PATH_STAGE, epochs=30, layers=2, continues=True),) and unstaged.stages == ()
    assert plan.rules == unstaged.rules and plan.one_shot_releases == unstaged.one_shot_releases
    assert plan.details["edge_free_path"]["stage_epochs"] == 30
    assert sum(p.kind == "train" for p in plan.passes(20, ROOTS)) == 30 + 20  # calibration covers the stage
    set_ = build_extractor(lookup("gap"), _setup("gap", epochs=20, edge_free_path_epochs=4)).charge_plan(ROOTS)
    assert [s.epochs for s in set_.stages] == [4]
    assert build_extractor(lookup("gap"), _setup("gap", epochs=20, edge_free_path_epochs=0)).charge_plan(ROOTS).stages == ()
    # a per-step extractor's path trains with its charged steps: no stage, and asking for one is refused
    assert build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn", epochs=5)).charge_plan(ROOTS).stages == ()
    with pytest.raises(ValueError, match="only an extractor released once"):
        build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn", edge_free_path_epochs=3))
    # an extractor without a path ignores it: the demo's MLP baseline copies the run's settings
    assert not isinstance(build_extractor(lookup("mlp"), _setup("mlp", edge_free_path_epochs=3)), WithEdgeFreePath)


def test_the_path_s_stage_trains_its_mlp_alone_after_the_extractor_s_preparation() -> None:
    extractor = build_extractor(lookup("gap"), _setup("gap", epochs=48))
    extractor.bind(1.0)
    calls: list[str] = []

    class Session:
        roots = ROOTS

        def charge_one_shot(self, index, node_ids):
            calls.append(f"hop {index}")

        def progress(self, message):
            pass

        def train_stage(self, stage, release, parameters):
            calls.append(stage.name)
            parameters = list(parameters)
            assert stage.epochs == 2 and parameters == extractor.path.trainable_parameters()
            out = release(torch.arange(4))
            assert out.shape == (4, 5, 2) and out.requires_grad  # the path's L_f slices alone
            before = [p.detach().clone() for p in parameters]
            optimizer = torch.optim.SGD(parameters, lr=0.5)
            out.sum().backward()
            optimizer.step()
            assert any(not torch.equal(b, p) for b, p in zip(before, parameters, strict=True))

    extractor.prepare(Session())
    assert calls == ["hop 0", "hop 1", PATH_STAGE]  # after the hops: their noise is drawn as without the path


def test_the_run_s_edge_free_head_goes_on_from_the_path_stage_s_decoder() -> None:
    """B: the run's edge-free head starts from the stage's decoder and optimiser state, so that its
    next step is the step the stage's decoder would have taken (one training, E_pre + E epochs)."""
    store = load_labels(resolve_dataset("cora"), split_seed=0)
    # with dropout: the head's masks go on from the stage's stream too
    config, cpu = DecoderConfig(hidden_dim=16, dropout=0.5), torch.device("cpu")
    stage = LabelSession("r.edge-free-path", store, config, OptimizerConfig(), 8, 1, "float32", 0, cpu)
    run = LabelSession("r", store, config, OptimizerConfig(), 8, 3, "float32", 1, cpu, edge_free_layers=1)
    ids = torch.from_numpy(store.split.train[:16])
    draws = torch.Generator().manual_seed(0)
    for _ in range(3):
        stage.train_step(ids, torch.rand(16, 8, 1, generator=draws))
    assert not torch.equal(run.decoder.edge_free.net[0].weight, stage.decoder.net[0].weight)

    assert run.start_edge_free_head(stage)
    for mine, theirs in zip(run.decoder.edge_free.parameters(), stage.decoder.parameters(), strict=True):
        assert torch.equal(mine, theirs) and mine is not theirs
    # one more step of each: the run's head moves exactly as the stage's decoder does (Adam's state went on)
    path_slice = torch.rand(16, 8, 1, generator=draws)
    stage.train_step(ids, path_slice)
    run.train_step(ids, torch.cat([torch.rand(16, 8, 2, generator=draws), path_slice], dim=-1))
    for mine, theirs in zip(run.decoder.edge_free.parameters(), stage.decoder.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6)

    # a session that has trained keeps its own head (a resumed run restored its checkpoint)
    before = [p.detach().clone() for p in run.decoder.edge_free.parameters()]
    stage.train_step(ids, path_slice)
    assert not run.start_edge_free_head(stage)
    assert all(torch.equal(b, p) for b, p in zip(before, run.decoder.edge_free.parameters(), strict=True))
    # another architecture, or a session without the path, is refused with what differs
    fresh = LabelSession("r", store, config, OptimizerConfig(), 8, 3, "float32", 1, cpu, edge_free_layers=1)
    wide = LabelSession("r.edge-free-path", store, config, OptimizerConfig(), 8, 2, "float32", 0, cpu)
    with pytest.raises(ValueError, match="is not the edge-free head of r"):
        fresh.start_edge_free_head(wide)
    plain = LabelSession("r", store, config, OptimizerConfig(), 8, 3, "float32", 1, cpu)
    with pytest.raises(ValueError, match="has no edge-free head"):
        plain.start_edge_free_head(stage)
    other = LabelSession("q", store, config, OptimizerConfig(), 8, 3, "float32", 1, cpu, edge_free_layers=1)
    with pytest.raises(ValueError, match="is not a stage of run q"):
        other.start_edge_free_head(stage)


def test_a_s_optimiser_goes_on_from_the_path_stage_s_state() -> None:
    """A: the run's optimiser (extractor and path) takes the stage's Adam state for the path's
    parameters; the extractor's own start afresh."""
    from vesper.party_a.run.preparation import continue_optimiser

    extractor = build_extractor(lookup("pmp-gcn"), _setup("pmp-gcn"))
    path = extractor.path.trainable_parameters()
    stage = torch.optim.Adam(path, lr=0.01)
    for _ in range(2):
        stage.zero_grad()
        sum(p.sum() for p in path).backward()
        stage.step()
    run = torch.optim.Adam(extractor.trainable_parameters(), lr=0.01)
    continue_optimiser(run, [stage])
    assert set(map(id, run.state)) == set(map(id, path))
    for p in path:
        assert torch.equal(run.state[p]["exp_avg"], stage.state[p]["exp_avg"]) and float(run.state[p]["step"]) == 2
        assert run.state[p]["exp_avg"] is not stage.state[p]["exp_avg"]


def test_each_part_of_the_release_learns_from_its_own_head_only() -> None:
    """A's extractor learns from the graph head, A's edge-free layers from the edge-free head (the
    MLP baseline, trained as it would be); the combined head reads everything detached."""
    torch.manual_seed(0)
    decoder = FallbackDecoder(DecoderConfig(hidden_dim=8), dim=4, layers=3, edge_free=1, classes=3)
    embeddings = torch.randn(10, 4, 3, requires_grad=True)
    targets = torch.randint(0, 3, (10,))
    free_logits, graph_logits, combined_logits = decoder.heads(embeddings)
    F.cross_entropy(graph_logits, targets).backward()
    assert embeddings.grad[..., -1].abs().sum() == 0 and embeddings.grad[..., :2].abs().sum() > 0
    embeddings.grad = None
    F.cross_entropy(free_logits, targets).backward()
    assert embeddings.grad[..., :2].abs().sum() == 0 and embeddings.grad[..., -1].abs().sum() > 0
    embeddings.grad = None
    F.cross_entropy(combined_logits, targets).backward()
    assert embeddings.grad is None
    assert [p.grad is not None for p in decoder.combined.parameters()] == [True] * 4


def _session(edge_free: int) -> LabelSession:
    store = load_labels(resolve_dataset("cora"), split_seed=0)
    return LabelSession(
        "r", store, DecoderConfig(hidden_dim=16), OptimizerConfig(), 8, 3, "float32", 0, torch.device("cpu"),
        edge_free_layers=edge_free,
    )


@pytest.mark.parametrize("informative", ["graph", "edge-free", "combined"])
def test_b_keeps_the_head_that_reads_the_labels(informative: str) -> None:
    """Embeddings where one part, or only both together, carry the labels: B keeps that head
    (or the combined head, which reads that part too), and reports its metrics."""
    session = _session(edge_free=1)
    labels = session.store.labels
    generator = torch.Generator().manual_seed(1)

    def embeddings(ids: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(ids.numel(), 8, 3, generator=generator)
        classes = labels[ids].clamp(min=0)
        if informative == "combined":  # the class is (graph part's bit) xor-coded with the free part's
            half = torch.randint(0, 2, classes.shape, generator=generator)
            noise[..., 0] += F.one_hot(half, 8).float() * 3
            noise[..., 2] += F.one_hot((classes + half) % 8, 8).float() * 3
            return noise
        column = slice(0, 2) if informative == "graph" else slice(2, 3)
        noise[..., column] += F.one_hot(classes, 8).float()[..., None] * 3
        return noise

    train = torch.from_numpy(session.store.split.train)
    for _ in range(60):
        batch = train[torch.randint(0, train.numel(), (64,), generator=generator)]
        session.train_step(batch, embeddings(batch))
    scores = {}
    for split in ("val", "test"):
        ids = torch.from_numpy(getattr(session.store.split, split))
        scores.setdefault(split, SplitScores()).add(ids, session.logits(embeddings(ids)))
    evaluation = session.evaluate(scores)
    # the combined head reads the informative part too, so it may tie or edge ahead; never the blind head
    assert evaluation.chosen in {informative, "combined"} and session.decoder.chosen == evaluation.chosen
    blind = {"graph": "edge-free", "edge-free": "graph", "combined": "graph"}[informative]
    validation = {head: {s: v for s, _, v, _ in rows}["val"] for head, rows in evaluation.heads.items()}
    assert validation[informative] > validation[blind] + 0.2
    kept = dict((s, v) for s, _, v, _ in evaluation.results)
    assert kept == {s: v for s, _, v, _ in evaluation.heads[evaluation.chosen]}
    # the edge-free head is kept unless another leads it by more than the paired noise (party_b.head_choice)
    assert evaluation.chosen == "edge-free" or kept["val"] > validation["edge-free"]
    # the kept head is what the saved decoder serves
    ids = torch.arange(5)
    inputs = embeddings(ids)
    assert torch.equal(session.decoder(inputs), session.logits(inputs)[evaluation.chosen])


def test_one_head_without_a_path() -> None:
    session = _session(edge_free=0)
    assert not isinstance(session.decoder, FallbackDecoder)
    ids = torch.from_numpy(session.store.split.val)
    scores = {"val": SplitScores()}
    scores["val"].add(ids, session.logits(torch.randn(ids.numel(), 8, 3)))
    evaluation = session.evaluate(scores)
    assert evaluation.chosen == "" and evaluation.head == "model" and evaluation.heads == {}


def test_a_run_recorded_before_the_path_resumes_and_predicts_without_it() -> None:
    from vesper.party_a.extractors.edge_free_path import recorded_run_config

    new = RunConfig(dataset="cora").model_dump(mode="json")
    assert recorded_run_config(new).extractor.edge_free_path is True
    old = {**new, "extractor": {k: v for k, v in new["extractor"].items() if k != "edge_free_path"}}
    assert recorded_run_config(old).extractor.edge_free_path is False
    assert "edge_free_path" not in old["extractor"]  # the record itself is left as it is


def test_the_run_line_says_which_head_b_kept_and_why() -> None:
    from vesper.common.config import Metric, RunSummary
    from vesper.coordinator.cli.summaries import head_line

    summary = RunSummary(
        run_id="r", status="completed", dataset="cora", extractor="gap", decoder="concat", accounting="visible-batch",
        epsilon_budget=4.0, epsilon_spent=4.0, delta=1e-6, decoder_head="edge-free",
        head_metrics={f"val@{h}": Metric(name="accuracy", value=v) for h, v in
                      (("graph", 0.70), ("edge-free", 0.75), ("combined", 0.72))},
    )
    assert head_line(summary) == (
        "B kept the edge-free head (the MLP's slices): validation graph 0.7000, edge-free 0.7500, combined 0.7200"
    )
    level = summary.model_copy(update={
        "head_metrics": {**summary.head_metrics, "val@graph": Metric(name="accuracy", value=0.76)},
        "head_errors": {f"val@{h}": Metric(name="accuracy", value=v) for h, v in (("graph", 0.012), ("combined", 0.02))},
    })
    assert head_line(level).endswith(
        "graph 0.7600, edge-free 0.7500, combined 0.7200 (graph led it by 0.0100, within the paired noise on those "
        "nodes, SE of the paired difference 0.0120)"
    )
    graph = level.model_copy(update={"decoder_head": "graph"})
    assert head_line(graph).endswith("combined 0.7200 (graph led the edge-free head by 0.0100, SE of the paired difference 0.0120)")
    older = level.model_copy(update={"head_errors": {}})  # a summary written before B reported the SE
    assert head_line(older).endswith("(graph led it by 0.0100, within the paired noise on those nodes)")
