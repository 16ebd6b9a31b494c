"""GAP's hop by blocks of rows (party_a.extractors.gap_hops): the blocks W ranks compute
concatenate to the hop one process computes, bit for bit, with the noise off and with keyed
noise on; streamed noise is refused for a block (it would depend on the split)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import random_graph

from vesper.common.config import ExtractorConfig, RunConfig
from vesper.party_a.extractors.base import ExtractorSetup
from vesper.party_a.extractors.gap import GapExtractor, aggregate, row_normalise
from vesper.party_a.extractors.gap_hops import hop_rows, row_bounds
from vesper.party_a.extractors.registry import validated_params
from vesper.party_a.graph_store import Graph
from vesper.party_a.noise import NoiseSource

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NODES, WIDTH = 61, 6


@pytest.fixture(scope="module")
def graph() -> Graph:
    return random_graph(random.Random(3), NODES, 0.12)


def unit_rows(seed: int) -> torch.Tensor:
    return row_normalise(torch.randn(NODES, WIDTH, generator=torch.Generator().manual_seed(seed)))


def gap(graph: Graph, keyed: bool) -> GapExtractor:
    config = RunConfig(extractor=ExtractorConfig(name="gap", layers=2, dim=WIDTH, encoder_hidden=8, dropout=0.0))
    extractor = GapExtractor(ExtractorSetup(
        config=config, params=validated_params(GapExtractor.spec, config), graph=graph,
        features=torch.randn(NODES, 5), device=torch.device("cpu"), sampling_generator=torch.Generator().manual_seed(1),
        noise_generator=torch.Generator().manual_seed(2), delta=1e-5, keyed_noise=keyed,
    ))
    extractor.noise_std = 0.9
    return extractor


@pytest.mark.parametrize("rows, world", [(61, 1), (61, 2), (61, 4), (60, 7), (3, 5), (0, 2)])
def test_row_bounds_cover_every_row_once_in_order(rows: int, world: int) -> None:
    bounds = row_bounds(rows, world)
    assert len(bounds) == world and bounds[0][0] == 0 and bounds[-1][1] == rows
    assert all(end == nxt for (_, end), (nxt, _) in zip(bounds, bounds[1:], strict=False))
    sizes = [end - start for start, end in bounds]
    assert sizes == [len(part) for part in torch.tensor_split(torch.arange(rows), world)]
    with pytest.raises(ValueError, match="at least one block"):
        row_bounds(rows, 0)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_blocks_without_noise_concatenate_to_the_whole_product_exactly(graph: Graph, world: int) -> None:
    x = unit_rows(world)
    whole = aggregate(gap(graph, keyed=False).adjacency, x)
    noise = NoiseSource(torch.Generator().manual_seed(0), keyed=True)
    blocks = [hop_rows(graph, x, start, end, noise, 0.0, None, 1) for start, end in row_bounds(NODES, world)]
    assert torch.equal(torch.cat(blocks), whole)
    assert whole.abs().sum() > 0  # not vacuous: the graph has edges


@pytest.mark.parametrize("world", [2, 3])
def test_keyed_blocks_are_the_keyed_hop_of_one_process_exactly(graph: Graph, world: int) -> None:
    one = gap(graph, keyed=True)
    key, x = one.hop_key(), unit_rows(7)
    assert key is not None
    whole = one.noisy_hop(x, 2, key)
    noise = NoiseSource(torch.Generator().manual_seed(99), keyed=True)  # another generator: only the key counts
    blocks = torch.cat([hop_rows(graph, x, s, e, noise, one.noise_std, key, 2) for s, e in row_bounds(NODES, world)])
    assert torch.equal(blocks, whole)
    assert not torch.equal(whole, aggregate(one.adjacency, x))  # noised
    # another hop under the same key draws other noise (layer = hop)
    assert not torch.equal(one.noisy_hop(x, 1, key), whole)


def test_a_block_refuses_streamed_noise(graph: Graph) -> None:
    noise = NoiseSource(torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="noise key.*keyed_noise=True"):
        hop_rows(graph, unit_rows(0), 0, 10, noise, 0.5, None, 1)


def test_one_process_streams_and_draws_no_key_a_keyed_run_draws_one_per_hop(graph: Graph) -> None:
    streamed, keyed = gap(graph, keyed=False), gap(graph, keyed=True)
    before = streamed.setup.noise.generator.get_state()
    assert streamed.hop_key() is None
    assert torch.equal(streamed.setup.noise.generator.get_state(), before)  # W = 1's stream is untouched
    first, second = keyed.hop_key(), keyed.hop_key()
    assert first is not None and second is not None and first != second
    keyed.noise_std = 0.0
    assert keyed.hop_key() is None  # nothing to noise: no key
