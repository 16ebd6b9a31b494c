"""The whole release on neighbouring graphs, for every registered extractor (privacy contract,
"Every extractor must", 3; docs/privacy.md, section 2.3; harness: tests/whole_release.py).

For each extractor installed (the ``vesper.extractors`` entry points: a new plugin is tested
without editing this file), A's complete path — plan, one-shot and pre-train releases with
their charges and progress lines, edge-free stages, training steps in training mode with
dropout, sampling and B's gradient applied by A's optimiser, the evaluation pass, the wire
encoding — runs on G and on a neighbouring G' under the same public inputs and secret seeds.
With the mechanisms' outputs coupled, everything B can see must be identical, and (edge-level
extractors) the mechanisms' inputs must move by no more than the charged events allow.

The last tests plant the two leaks an independent review found in the release path — a
dropout stream seeded from the run's public seed and consumed in an edge-dependent order,
and a release reading one un-noised neighbour — and check that the harness reports each.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from whole_release import (
    TRAIN_STEPS,
    RecordingNoise,
    World,
    base_edges,
    differences,
    edge_pair,
    features_of,
    graph_of,
    neighbouring_runs,
    null_pair,
    run_world,
)

from vesper.common.config import ExtractorConfig, PrivacyConfig, RunConfig
from vesper.party_a.extractors.base import Extractor, RootPlan
from vesper.party_a.extractors.pmp_plugin import PmpGcnPlugin, PmpGinPlugin
from vesper.party_a.extractors.registry import installed, lookup
from vesper.party_a.keyed_dropout import KeyedDropout, draw_dropout_key, keep_mask

NUM_NODES, WIDTH = 40, 10
EDGES = base_edges(NUM_NODES, seed=5)
FEATURES = features_of(NUM_NODES, WIDTH, seed=6)
ROOTS = RootPlan(
    train_ids=torch.arange(0, 16), val_ids=torch.arange(16, 26), test_ids=torch.arange(26, NUM_NODES),
    steps_per_epoch=2, eval_chunks=4,
)
ISOLATED = NUM_NODES - 1  # base_edges leaves the last 4 nodes without edges

# small settings for the built-in methods on a 40-node graph (a new plugin runs with its defaults)
SMALL_PARAMS: dict[str, dict] = {
    "gap": {"encoder_epochs": 1},
    # q = expected_batch / privacy.edge_bound = 0.5: most steps sample the edge that differs
    "relational": {"pretrain_steps": 3, "expected_batch": 200},
    "relational-gap": {"pretrain_steps": 3, "expected_batch": 200, "encoder_epochs": 1},
    "progap": {"stage_epochs": 1},
    "dpar-edge": {"top_k": 4},
    "dpar-node": {"top_k": 4, "dp_batch": 0},
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def config_for(name: str) -> RunConfig:
    return RunConfig(
        dataset="whole-release", epochs=1, batch_size=8, eval_chunk=8, seed=3,
        privacy=PrivacyConfig(epsilon=8.0, delta=1e-6, edge_bound=400),
        extractor=ExtractorConfig(
            name=name, layers=2, fanout=4, dim=6, encoder_hidden=8, dropout=0.5, noise_multiplier=1.0,
            params=SMALL_PARAMS.get(name, {}),
        ),
    )


def absent_edge(u_choices, v_choices) -> tuple[int, int]:
    present = set(EDGES)
    for u in u_choices:
        for v in v_choices:
            if u != v and tuple(sorted((u, v))) not in present:
                return u, v
    raise AssertionError("no absent edge among the choices")


def pairs(unit: str) -> dict[str, tuple[World, World]]:
    """Neighbouring pairs for the unit: an edge between a first-step root and the hub, an isolated
    node's first edge, an edge far from the training roots; or a null node (node level)."""
    if unit == "node":
        return {
            "null hub": null_pair(EDGES, 0, NUM_NODES, FEATURES),
            "null root": null_pair(EDGES, 5, NUM_NODES, FEATURES),
        }
    hub = absent_edge([0], range(1, 16))
    far = absent_edge(range(26, 35), range(16, 26))
    return {
        "root to hub": edge_pair(EDGES, hub, NUM_NODES, FEATURES),
        "hub edge removed": tuple(reversed(edge_pair(EDGES, hub, NUM_NODES, FEATURES))),
        "isolated node": edge_pair(EDGES, (ISOLATED, 3), NUM_NODES, FEATURES),
        "far from the roots": edge_pair(EDGES, far, NUM_NODES, FEATURES),
    }


def violations(
    cls: type[Extractor], name: str | None = None, config: RunConfig | None = None, keyed: bool = False,
) -> dict[str, list[str]]:
    config = config or config_for(name or cls.spec.name)
    found = {}
    for label, pair in pairs(cls.spec.privacy_unit).items():
        on_g, on_g_prime = neighbouring_runs(cls, config, pair, ROOTS, keyed)
        problems = differences(on_g, on_g_prime, check_sensitivity=cls.spec.privacy_unit == "edge")
        if problems:
            found[label] = problems
    return found


REGISTERED = [entry for entry in installed() if entry.extractor is not None]


@pytest.mark.parametrize("entry", REGISTERED, ids=[entry.name for entry in REGISTERED])
def test_the_whole_release_depends_on_the_graph_only_through_its_mechanisms(entry) -> None:
    assert violations(entry.extractor) == {}


@pytest.mark.parametrize("name", ["pmp-gin", "pmp-gcn"])
def test_a_secret_edge_sample_keeps_the_whole_release_coupled(name: str) -> None:
    """privacy.edge_sample_rate: each release reads a fresh keyed Poisson sample of the edges."""
    config = config_for(name)
    config = config.model_copy(update={
        "privacy": config.privacy.model_copy(update={"edge_sample_rate": 0.5}),
        "extractor": config.extractor.model_copy(update={"layers": 1}),
    })
    assert violations(PmpGinPlugin if name == "pmp-gin" else PmpGcnPlugin, name, config) == {}


@pytest.mark.parametrize("name", ["gap", "pmp-gcn"])
def test_a_path_wider_than_the_run_keeps_the_whole_release_coupled(name: str) -> None:
    """extractor.edge_free_path_dim = 2 d: the MLP's layers go out as twice as many slices of d
    (party_a.extractors.edge_free_path, GAP's default against the MLP's width), GAP's with its stage."""
    config = config_for(name)
    config = config.model_copy(update={
        "epochs": 1, "extractor": config.extractor.model_copy(update={"edge_free_path_dim": 12, "edge_free_path_epochs": 1}),
    }) if name == "gap" else config.model_copy(update={
        "extractor": config.extractor.model_copy(update={"edge_free_path_dim": 12}),
    })
    assert violations(lookup(name), name, config) == {}


@pytest.mark.parametrize("plugin", [PmpGinPlugin, PmpGcnPlugin], ids=["pmp-gin", "pmp-gcn"])
def test_keyed_noise_keeps_the_whole_release_coupled(plugin) -> None:
    """party_a.workers > 1: each node's noise keyed by (release key, layer, node) (docs/privacy.md 2.6)."""
    assert violations(plugin, keyed=True) == {}
    pair = pairs("edge")["root to hub"]
    keyed, _ = neighbouring_runs(plugin, config_for(plugin.spec.name), pair, ROOTS, keyed=True)
    streamed, _ = neighbouring_runs(plugin, config_for(plugin.spec.name), pair, ROOTS, keyed=False)
    assert keyed.wires != streamed.wires  # the keyed form was the one run


def test_every_built_in_extractor_is_covered() -> None:
    names = {entry.name for entry in REGISTERED}
    assert {"mlp", "pmp-gin", "pmp-gcn", "gap", "vfgnn", "dpar-edge", "dpar-node", "relational",
            "relational-gap", "heterpoisson", "progap"} <= names


def test_the_runs_exercise_dropout_training_and_the_mechanisms() -> None:
    """The harness is not vacuous: PMP-GIN draws dropout masks over its sampled subgraph, makes
    mechanism calls, sends every release, and A's update changes the second step."""
    config = config_for("pmp-gin")
    world = edge_pair(EDGES, absent_edge([0], range(1, 16)), NUM_NODES, FEATURES)[0]
    observed = run_world(PmpGinPlugin, config, world, ROOTS, RecordingNoise(torch.Generator().manual_seed(1)))
    assert [label for label, _ in observed.wires] == ["train"] * TRAIN_STEPS + ["eval"] * 4
    assert len(observed.calls) >= 2 * (TRAIN_STEPS + 4) and all(c.rows is not None for c in observed.calls)
    assert observed.calls[0].rows.numel() > ROOTS.train_ids.numel() // 2  # layer 1 covers the frontier


# -- the planted leaks ------------------------------------------------------------------------------
class PublicStreamDropout(nn.Module):
    """The old dropout: a stream seeded from the run's public seed (which B receives), one mask
    per row in the order the pass reaches its nodes."""

    def __init__(self, p: float, seed: int) -> None:
        super().__init__()
        self.p = p
        self.generator = torch.Generator().manual_seed(seed)

    def mask(self, nodes: torch.Tensor, key, units: int) -> None:
        return None  # nothing ahead: each call draws from the stream, in the order the pass reaches its rows

    def forward(self, x: torch.Tensor, nodes: torch.Tensor | None = None, key=None, keep=None) -> torch.Tensor:
        if not self.training:
            return x
        keep = torch.rand(x.shape, generator=self.generator) >= self.p
        return x * keep / (1.0 - self.p)


class PublicDropoutGin(PmpGinPlugin):
    """PMP-GIN with the public-seeded dropout stream reintroduced in its encoder."""

    def __init__(self, setup) -> None:
        super().__init__(setup)
        net = self.model.encoder.net
        for index, module in enumerate(net):
            if isinstance(module, KeyedDropout):
                net[index] = PublicStreamDropout(module.p, setup.config.seed)


class NeighbourPeekingGin(PmpGinPlugin):
    """PMP-GIN whose release also carries one un-noised feature of each root's first neighbour."""

    def release(self, roots: torch.Tensor, kind: str) -> torch.Tensor:
        out = super().release(roots, kind)
        graph = self.graph
        start, end = graph.indptr[roots], graph.indptr[roots + 1]
        has = end > start
        first = torch.where(has, graph.indices[start.clamp(max=graph.indices.numel() - 1)], torch.zeros_like(start))
        peek = torch.where(has, self.setup.features[first, 0], torch.zeros(roots.numel()))
        return out + 0.01 * peek[:, None, None]


def test_a_public_dropout_stream_in_the_graph_pass_is_caught() -> None:
    """Where the extra edge brings a new node into a step's subgraph, every later mask shifts."""
    found = violations(PublicDropoutGin, "pmp-gin")
    assert "isolated node" in found
    assert any("outside the mechanisms' outputs" in problem for problem in found["isolated node"])


def test_a_release_reading_one_un_noised_neighbour_is_caught() -> None:
    found = violations(NeighbourPeekingGin, "pmp-gin")
    assert {"root to hub", "hub edge removed"} <= set(found)


# -- keyed dropout ----------------------------------------------------------------------------------
def test_dropout_masks_depend_on_the_key_the_node_and_the_unit_only() -> None:
    key = draw_dropout_key(torch.Generator().manual_seed(0))
    nodes = torch.tensor([5, 9, 2, 5])
    mask = keep_mask(key, nodes, 64, 0.5)
    assert torch.equal(mask[0], mask[3])  # the same node, the same mask, wherever it is read
    alone = keep_mask(key, torch.tensor([9]), 64, 0.5)
    assert torch.equal(alone[0], mask[1])  # whatever else the pass reads
    other = keep_mask(draw_dropout_key(torch.Generator().manual_seed(1)), nodes, 64, 0.5)
    assert not torch.equal(other, mask)  # a new key per release: fresh masks
    many = keep_mask(key, torch.arange(2000), 64, 0.8)
    assert abs(many.double().mean().item() - 0.2) < 0.01


@pytest.mark.parametrize("p", [0.0, 0.5, 0.8, 0.999])
def test_the_fast_dropout_mask_is_the_definition_s_bit_for_bit(p: float) -> None:
    """keep_mask (int32 grid mixer, sign-flipped comparison) equals hash(k, v, j) ≥ p · 2³² read
    off the definition, for keys with either top bit set and node ids up to 2³³."""
    from vesper.party_a.sampler import pair_keys

    def keep_mask_reference(key, nodes, units, p):  # the definition, in int64
        unit = torch.arange(units, dtype=torch.int64)
        return pair_keys(key, nodes.to(torch.int64)[:, None], unit[None, :]) >= int(p * float(1 << 32))

    nodes = torch.cat([torch.arange(3000), torch.tensor([2**31 - 1, 2**31, 2**33 + 7])])
    for key in [(1, 2), (2**32 - 1, 12345), (987654321, 4_000_000_000), (2**31, 2**31 - 1)]:
        assert torch.equal(keep_mask(key, nodes, 128, p), keep_mask_reference(key, nodes, 128, p)), key


def test_dropout_in_training_mode_refuses_to_run_without_a_key() -> None:
    dropout = KeyedDropout(0.5)
    x = torch.ones(3, 4)
    with pytest.raises(ValueError, match="secret key"):
        dropout(x)
    dropout.eval()
    assert torch.equal(dropout(x), x)
    dropout.train()
    kept = dropout(x, torch.tensor([0, 1, 2]), (1, 2))
    assert set(kept.unique().tolist()) <= {0.0, 2.0}


def test_runs_repeat_exactly_under_the_same_secret_seeds() -> None:
    config = config_for("pmp-gcn")
    world = World(graph_of(EDGES, NUM_NODES), FEATURES)
    first = run_world(PmpGinPlugin, config_for("pmp-gin"), world, ROOTS, RecordingNoise(torch.Generator().manual_seed(1)))
    again = run_world(PmpGinPlugin, config_for("pmp-gin"), world, ROOTS, RecordingNoise(torch.Generator().manual_seed(1)))
    assert first.wires == again.wires
    assert config.extractor.dropout > 0
