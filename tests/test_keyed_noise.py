"""Keyed Gaussian noise (party_a.noise.keyed_normal; docs/privacy.md, section 2.6): each row's
noise is N(0, σ² I), independent across rows, layers and releases, and a function of
(key, layer, node) alone, so a node reached twice gets one value."""

from __future__ import annotations

import random

import pytest
import torch
from scipy import stats
from test_pmp import random_graph

from vesper.common.config import ExtractorConfig
from vesper.party_a.extractors.pmp import PmpExtractor
from vesper.party_a.noise import NoiseSource, draw_noise_key, keyed_normal
from vesper.party_a.sampler import NeighbourSampler

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS, WIDTH = 4000, 16


def _normal(key: tuple[int, int] = (11, 22), layer: int = 0, rows: torch.Tensor | None = None) -> torch.Tensor:
    return keyed_normal(key, layer, torch.arange(ROWS) if rows is None else rows, WIDTH)


def test_each_coordinate_is_a_standard_normal() -> None:
    noise = _normal().flatten()
    n = noise.numel()
    assert abs(noise.mean().item()) < 5 / n**0.5
    assert abs(noise.var().item() - 1.0) < 5 * (2 / n) ** 0.5
    assert stats.kstest(noise.numpy(), "norm").pvalue > 1e-3
    # the odd width keeps its first coordinates: the same values, one fewer column
    assert torch.equal(keyed_normal((11, 22), 0, torch.arange(5), WIDTH - 1), _normal(rows=torch.arange(5))[:, :-1])


def test_coordinates_rows_layers_and_keys_are_uncorrelated() -> None:
    noise = _normal()
    bound = 5 / ROWS**0.5  # a correlation of n independent pairs has standard error 1/√n
    correlation = torch.corrcoef(noise.T)  # coordinates against each other, cos/sin pairs included
    assert (correlation - torch.eye(WIDTH, dtype=correlation.dtype)).abs().max() < bound
    for other in (_normal(layer=1), _normal(key=(12, 22)), _normal(rows=torch.arange(1, ROWS + 1))):
        paired = torch.corrcoef(torch.stack((noise.flatten(), other.flatten())))[0, 1]
        assert abs(paired.item()) < 5 / noise.numel() ** 0.5


def test_a_node_s_noise_depends_on_the_key_the_layer_and_the_node_only() -> None:
    rows = torch.tensor([7, 3, 99, 12])
    first = keyed_normal((5, 6), 2, rows, 8)
    # the same node among other rows, in another order: the same noise
    again = keyed_normal((5, 6), 2, torch.tensor([12, 1000, 7]), 8)
    assert torch.equal(again[0], first[3]) and torch.equal(again[2], first[0])
    assert not torch.equal(keyed_normal((5, 6), 1, rows, 8), first)
    assert not torch.equal(keyed_normal((5, 7), 2, rows, 8), first)


def test_keyed_gaussian_adds_sigma_times_the_keyed_normal_and_draws_nothing() -> None:
    generator = torch.Generator().manual_seed(4)
    source = NoiseSource(generator)
    state = generator.get_state()
    rows = torch.tensor([4, 9, 2])
    values = torch.ones(3, 5)
    out = source.gaussian(values.clone(), 2.0, rows=rows, key=(1, 2), layer=3)
    assert torch.allclose(out, 1 + 2.0 * keyed_normal((1, 2), 3, rows, 5).float())
    assert torch.equal(generator.get_state(), state)
    with pytest.raises(ValueError, match="rows="):
        source.gaussian(values.clone(), 2.0, key=(1, 2))
    with pytest.raises(ValueError, match="one per row"):
        source.gaussian(values.clone(), 2.0, rows=torch.tensor([1, 2]), key=(1, 2))


def test_a_release_s_key_comes_from_the_noise_generator() -> None:
    keys = {draw_noise_key(torch.Generator().manual_seed(seed)) for seed in range(20)}
    assert len(keys) == 20
    assert draw_noise_key(torch.Generator().manual_seed(3)) == draw_noise_key(torch.Generator().manual_seed(3))


def test_pmp_gives_a_node_the_same_noisy_aggregate_whichever_roots_reach_it() -> None:
    """Two disjoint halves of the roots, sampled and noised apart under one release's keys, give every
    node they both reach the value the whole batch gives it: one mechanism output per node."""
    graph = random_graph(random.Random(3), 60, 0.1)
    torch.manual_seed(0)
    config = ExtractorConfig(name="pmp-gin", layers=2, fanout=3, dim=8, encoder_hidden=16, dropout=0.3)
    model = PmpExtractor(config, 6, graph.degree.clamp(max=3)).train()
    features = torch.rand(60, 6)
    sampler = NeighbourSampler(graph, 3, 2, (7, 8))
    seeds = sampler.layer_seeds(torch.Generator().manual_seed(1))
    roots = torch.arange(0, 20)

    def layer_one(part: torch.Tensor) -> dict[int, torch.Tensor]:
        sub = sampler.sample(part, seeds)
        noisy = {}

        def keep(aggregate, block, std, noise, key, layer, drawn):  # record layer 0's noisy aggregates by node
            out = PmpExtractor.perturb(model, aggregate, block, std, noise, key, layer, drawn)
            if layer == 0:
                noisy.update({int(v): out[i].clone() for i, v in enumerate(block.dst_nodes.tolist())})
            return out

        model.perturb = keep
        try:
            model.noisy_aggregates(sub, features, 0.8, NoiseSource(torch.Generator()), dropout_key=(3, 4), noise_key=(5, 6))
        finally:
            del model.perturb
        return noisy

    whole, first, second = layer_one(roots), layer_one(roots[:10]), layer_one(roots[10:])
    shared = set(first) & set(second)
    assert shared, "the halves should reach common nodes"
    for node in shared:
        assert torch.allclose(first[node], whole[node], atol=1e-6) and torch.allclose(second[node], whole[node], atol=1e-6)


def test_the_grid_hash_is_the_sampler_s_keyed_hash() -> None:
    """keyed_normal's radius uniform is keyed_uniform, its angle one pair_keys hash, on every (node, slot)."""
    from vesper.party_a.sampler import keyed_uniform, pair_key_grid, pair_keys

    nodes = torch.cat([torch.randint(0, 1 << 40, (300,), generator=torch.Generator().manual_seed(1)), torch.tensor([0, 1])])
    slots = torch.tensor([0, 1, 2, 3, (1 << 31) - 1])
    grid = pair_key_grid((9, 10), nodes, slots).to(torch.int64) & 0xFFFFFFFF
    assert torch.equal(grid, pair_keys((9, 10), nodes[:, None], slots[None, :]))
    rows, width = torch.tensor([5, 17, 2]), 6
    normal = keyed_normal((9, 10), 1, rows, width).double()
    slot = (1 << 20) + 2 * torch.arange(3)
    radius = torch.sqrt(-2 * torch.log1p(-keyed_uniform((9, 10), rows[:, None], slot[None, :])))
    angle = 2 * torch.pi * pair_keys((9, 10), rows[:, None], (slot + 1)[None, :]).double() / 2**32
    expected = torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)), dim=-1).reshape(3, width)
    assert torch.allclose(normal, expected, atol=1e-5)


def test_streamed_noise_drawn_ahead_is_the_noise_drawn_in_the_call() -> None:
    """standard_normal then gaussian(drawn=) adds what gaussian would draw itself, from the same
    point of the stream; a draw of the wrong shape, or beside a key, is refused."""
    values = torch.rand(5, 4)
    ahead = NoiseSource(torch.Generator().manual_seed(7))
    drawn = ahead.standard_normal((5, 4), torch.float32)
    inline = NoiseSource(torch.Generator().manual_seed(7)).gaussian(values.clone(), 1.5)
    assert torch.equal(ahead.gaussian(values.clone(), 1.5, drawn=drawn), inline)
    with pytest.raises(ValueError, match="drawn ahead of shape"):
        ahead.gaussian(values.clone(), 1.5, drawn=torch.zeros(4, 4))
    with pytest.raises(ValueError, match="keyed noise is never drawn ahead"):
        ahead.gaussian(values.clone(), 1.5, rows=torch.arange(5), key=(1, 2), drawn=torch.zeros(5, 4))
