"""PMP-GIN, truncated PMP-GCN and the MLP extractor (Algorithms 1 and 2, vesper's form)."""

import math
import random

import pytest
import torch
from conftest import random_graph

from vesper.common.config import ExtractorConfig
from vesper.party_a.extractors.pmp import PmpExtractor, gcn_aggregate, gin_aggregate
from vesper.party_a.graph_store import Graph
from vesper.party_a.noise import NoiseSource
from vesper.party_a.sampler import (
    KeyedOrder,
    NeighbourSampler,
    edgeless_subgraph,
    make_block,
    sample_neighbours,
)


def _full_block(graph: Graph, fanout: int, seed=(1, 2)):
    nodes = torch.arange(graph.num_nodes)
    edge_dst, neighbours = sample_neighbours(KeyedOrder.of(graph, (7, 8)), nodes, fanout, seed)
    return make_block(nodes, edge_dst, neighbours)


def _capped(graph: Graph, fanout: int) -> torch.Tensor:
    return graph.degree.clamp(max=fanout) if fanout else graph.degree


@pytest.mark.parametrize("fanout", [0, 3])
def test_gin_aggregate_is_the_sum_over_sampled_neighbours(fanout: int) -> None:
    graph = random_graph(random.Random(0), 30, 0.2)
    block = _full_block(graph, fanout)
    h = torch.rand(30, 4)
    expected = torch.zeros(30, 4)
    for d, s in zip(block.edge_dst.tolist(), block.edge_src.tolist()):
        expected[d] += h[block.src_nodes[s]]
    assert torch.allclose(gin_aggregate(block, h[block.src_nodes]), expected, atol=1e-6)


@pytest.mark.parametrize("fanout, d_min", [(0, 0), (4, 1), (4, 3), (0, 5)])
def test_gcn_aggregate_matches_equation_33_with_truncation(fanout: int, d_min: int) -> None:
    graph = random_graph(random.Random(1), 30, 0.2)
    block = _full_block(graph, fanout)
    capped = _capped(graph, fanout)
    h = torch.rand(30, 4)
    expected = torch.zeros(30, 4)
    for d, s in zip(block.edge_dst.tolist(), block.edge_src.tolist()):
        v, u = int(block.src_nodes[d]), int(block.src_nodes[s])
        if capped[v] >= d_min:
            expected[d] += h[u] / math.sqrt((capped[v] + 1) * (capped[u] + 1))
    got = gcn_aggregate(block, h[block.src_nodes], capped, d_min)
    assert torch.allclose(got, expected, atol=1e-6)
    # nodes below D_min receive nothing (Algorithm 2, step 6)
    below = capped[block.dst_nodes] < d_min
    assert torch.all(got[below] == 0)


def _model(name: str, layers: int = 1, fanout: int = 4, spectral_norm: bool = True, graph: Graph | None = None) -> PmpExtractor:
    torch.manual_seed(0)
    config = ExtractorConfig(name=name, layers=layers, fanout=fanout, dim=8, encoder_hidden=16, dropout=0.0, spectral_norm=spectral_norm)
    capped = None if graph is None else _capped(graph, fanout)
    return PmpExtractor(config, in_features=6, capped_degree=capped)


@pytest.mark.parametrize("name", ["pmp-gin", "pmp-gcn", "mlp"])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_output_is_b_by_d_by_l_non_negative_and_unit_norm(name: str, layers: int) -> None:
    graph = random_graph(random.Random(2), 50, 0.1)
    model = _model(name, layers, graph=graph)
    sampler = NeighbourSampler(graph, 4, layers, (7, 8))
    roots = torch.tensor([3, 7, 9, 30])
    subgraph = sampler.sample(roots, sampler.layer_seeds(torch.Generator().manual_seed(1)))
    out = model(subgraph, torch.rand(50, 6), 0.5, NoiseSource(torch.Generator().manual_seed(2)))
    assert out.shape == (4, 8, layers)
    assert torch.all(out >= 0)
    norms = out.norm(dim=1)
    assert torch.all((norms - 1).abs() < 1e-5) or torch.all(norms <= 1 + 1e-5)


def test_noise_has_standard_deviation_theta() -> None:
    graph = random_graph(random.Random(4), 400, 0.02)
    model = _model("pmp-gin", graph=graph).eval()  # no dropout: only the noise differs
    sampler = NeighbourSampler(graph, 4, 1, (7, 8))
    subgraph = sampler.sample(torch.arange(400), sampler.layer_seeds(torch.Generator().manual_seed(0)))
    features = torch.rand(400, 6)
    clean = model.noisy_aggregates(subgraph, features, 0.0, None)[0]
    noisy = model.noisy_aggregates(subgraph, features, 2.5, NoiseSource(torch.Generator().manual_seed(3)))[0]
    residual = (noisy - clean).flatten()
    n = residual.numel()  # 3200 draws: standard errors 2.5/√n of the mean, 2.5/√(2n) of the std; bounds at 5 of them
    assert abs(residual.std().item() - 2.5) < 5 * 2.5 / (2 * n) ** 0.5 and abs(residual.mean().item()) < 5 * 2.5 / n**0.5


@pytest.mark.parametrize("name", ["pmp-gin", "pmp-gcn"])
def test_no_gradient_crosses_an_edge(name: str) -> None:
    """A's update may depend on the graph only through noisy aggregates (docs/privacy.md, section 2)."""
    graph = random_graph(random.Random(5), 40, 0.15)
    model = _model(name, layers=2, graph=graph)
    sampler = NeighbourSampler(graph, 4, 2, (7, 8))
    roots = torch.tensor([0, 1, 2])
    subgraph = sampler.sample(roots, sampler.layer_seeds(torch.Generator().manual_seed(0)))
    features = torch.rand(40, 6, requires_grad=True)
    model(subgraph, features, 1.0, NoiseSource(torch.Generator().manual_seed(1))).sum().backward()
    touched = features.grad.abs().sum(dim=1) > 0
    assert touched[roots].all()
    assert not touched[[i for i in range(40) if i not in roots.tolist()]].any()


def test_forward_reads_the_graph_only_through_the_noisy_aggregates(monkeypatch) -> None:
    graph = random_graph(random.Random(6), 40, 0.15)
    other = random_graph(random.Random(7), 40, 0.3)
    model = _model("pmp-gcn", layers=2, graph=graph)
    roots = torch.tensor([0, 5, 9])
    features = torch.rand(40, 6)
    seeds = [(1, 2), (3, 4)]
    first = NeighbourSampler(graph, 4, 2, (7, 8)).sample(roots, seeds)
    second = NeighbourSampler(other, 4, 2, (7, 8)).sample(roots, seeds)
    fixed = model.noisy_aggregates(first, features, 1.0, NoiseSource(torch.Generator().manual_seed(0)))
    monkeypatch.setattr(model, "noisy_aggregates", lambda *args, **kwargs: fixed)
    model.eval()
    assert torch.equal(model(first, features, 1.0, None), model(second, features, 1.0, None))


def test_spectral_norm_keeps_operator_norms_at_one() -> None:
    graph = random_graph(random.Random(8), 30, 0.2)
    model = _model("pmp-gin", layers=2, graph=graph)
    model.train()
    sampler = NeighbourSampler(graph, 4, 2, (7, 8))
    subgraph = sampler.sample(torch.arange(30), sampler.layer_seeds(torch.Generator().manual_seed(0)))
    for _ in range(30):  # power iteration converges over forward passes
        model(subgraph, torch.rand(30, 6), 0.0, None)
    for layer in model.layers:
        for linear in (layer.self_weight, layer.agg_weight):
            assert torch.linalg.matrix_norm(linear.weight.detach(), ord=2).item() == pytest.approx(1.0, abs=0.02)


def test_mlp_extractor_reads_no_edges() -> None:
    graph = random_graph(random.Random(9), 30, 0.3)
    model = _model("mlp", layers=2)
    model.eval()
    features = torch.rand(30, 6)
    roots = torch.tensor([1, 2, 3])
    sampled = NeighbourSampler(graph, 4, 2, (7, 8)).sample(roots, [(1, 2), (3, 4)])
    assert torch.equal(model(sampled, features, 0.0, None), model(edgeless_subgraph(roots, 2), features, 0.0, None))
    assert model.noisy_aggregates(sampled, features, 3.0, None) == [None, None]


def _encoded_rows(model: PmpExtractor) -> list[int]:
    """Records the rows of every encoder call on ``model``."""
    rows: list[int] = []
    model.encoder.register_forward_hook(lambda module, args, out: rows.append(out.shape[0]))
    return rows


@pytest.mark.parametrize("name", ["pmp-gin", "pmp-gcn", "mlp"])
@pytest.mark.parametrize("layers", [1, 2])
def test_a_release_encodes_each_input_node_once(name: str, layers: int) -> None:
    """The roots' h^(0) serves both their chain and the mechanism's pass; the MLP, which
    releases no aggregate, runs no pass at all. The release equals the one that encodes the
    roots twice (the form before), with the same dropout masks, to float rounding (without
    spectral normalisation: each read of a normalised weight runs a power step)."""
    graph = random_graph(random.Random(11), 60, 0.1)
    config = ExtractorConfig(name=name, layers=layers, fanout=4, dim=8, encoder_hidden=16, dropout=0.5, spectral_norm=False)
    torch.manual_seed(0)
    model = PmpExtractor(config, in_features=6, capped_degree=_capped(graph, 4)).train()
    features = torch.rand(60, 6)
    roots = torch.tensor([3, 7, 9, 30, 41])
    sampler = NeighbourSampler(graph, 4, layers, (7, 8))
    subgraph = sampler.sample(roots, sampler.layer_seeds(torch.Generator().manual_seed(1)))
    if name == "mlp":
        subgraph = edgeless_subgraph(roots, layers)
    rows = _encoded_rows(model)
    released = model(subgraph, features, 0.5, NoiseSource(torch.Generator().manual_seed(2)), dropout_key=(5, 6))
    assert sum(rows) == (roots.numel() if name == "mlp" else subgraph.input_nodes.numel())
    # the form before: the pass encodes every input node, the chain the roots again
    noisy = model.noisy_aggregates(
        subgraph, features, 0.5, NoiseSource(torch.Generator().manual_seed(2)), weights=model.step_weights(),
        dropout_key=(5, 6),
    )
    h = model.encoder(features[roots], roots, (5, 6))
    chain = []
    for layer, aggregate in zip(model.layers, noisy):
        h = layer(h, aggregate)
        chain.append(h)
    assert torch.allclose(released, torch.stack(chain, dim=-1), atol=1e-6)


def test_release_inputs_built_ahead_are_those_built_in_the_release() -> None:
    """The features, dropout masks and noise draws the prefetch builds give the release it would
    compute itself; a mask of the wrong shape is refused."""
    graph = random_graph(random.Random(12), 60, 0.1)
    config = ExtractorConfig(name="pmp-gcn", layers=2, fanout=4, dim=8, encoder_hidden=16, dropout=0.5, spectral_norm=False)
    torch.manual_seed(0)
    model = PmpExtractor(config, in_features=6, capped_degree=_capped(graph, 4)).train()
    features = torch.rand(60, 6)
    roots = torch.tensor([3, 7, 9, 30])
    sampler = NeighbourSampler(graph, 4, 2, (7, 8))
    subgraph = sampler.sample(roots, sampler.layer_seeds(torch.Generator().manual_seed(1)))
    inputs = model.release_inputs(subgraph, features, (5, 6), 0.5, NoiseSource(torch.Generator().manual_seed(2)))
    assert inputs.keep is not None and inputs.keep.shape == (subgraph.input_nodes.numel(), 16)
    assert torch.equal(inputs.features, features[subgraph.input_nodes])
    assert inputs.noise is not None and [n.shape for n in inputs.noise] == [(b.dst_count, 8) for b in subgraph.blocks]
    # the noise drawn ahead is the noise the release draws itself: the source handed to it is not read
    ahead = model(subgraph, features, 0.5, NoiseSource(torch.Generator().manual_seed(99)), dropout_key=(5, 6), inputs=inputs)
    inline = model(subgraph, features, 0.5, NoiseSource(torch.Generator().manual_seed(2)), dropout_key=(5, 6))
    assert torch.equal(ahead, inline)
    keyed = NoiseSource(torch.Generator().manual_seed(2), keyed=True)
    assert model.release_inputs(subgraph, features, (5, 6), 0.5, keyed).noise is None  # keyed noise: never ahead
    assert model.release_inputs(subgraph, features, (5, 6), 0.0, NoiseSource(torch.Generator())).noise is None
    assert model.eval().release_inputs(subgraph, features, (5, 6)).keep is None  # evaluation: no dropout
    with pytest.raises(ValueError, match="dropout mask of shape"):
        model.train().encoder(features[:3], torch.arange(3), (5, 6), inputs.keep[:2])


def test_the_mlp_draws_no_noise_ahead() -> None:
    """The MLP releases no aggregate: handed a noise source, its release inputs draw nothing
    from it (party A's prefetch hands one to every extractor alike)."""
    config = ExtractorConfig(name="mlp", layers=2, dim=8, encoder_hidden=16, dropout=0.5)
    model = PmpExtractor(config, in_features=6, capped_degree=None).train()
    generator = torch.Generator().manual_seed(3)
    before = generator.get_state()
    inputs = model.release_inputs(edgeless_subgraph(torch.tensor([1, 4]), 2), torch.rand(9, 6), (5, 6), 0.5, NoiseSource(generator))
    assert inputs.noise is None and inputs.keep is not None
    assert torch.equal(generator.get_state(), before)


def test_pmp_extractor_needs_degrees() -> None:
    with pytest.raises(ValueError, match="capped degrees"):
        _model("pmp-gcn", graph=None)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu() -> None:
    graph = random_graph(random.Random(10), 60, 0.1)
    features = torch.rand(60, 6)
    roots = torch.tensor([0, 3, 8])
    outputs = []
    for device in ("cpu", "cuda"):
        model = _model("pmp-gcn", layers=2, graph=graph).to(device).eval()
        model.capped_degree = _capped(graph, 4).to(device)
        g = graph.to(device)
        subgraph = NeighbourSampler(g, 4, 2, (7, 8)).sample(roots.to(device), [(1, 2), (3, 4)])
        outputs.append(model(subgraph, features.to(device), 0.0, None).cpu())
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)
