"""Configuration rules and the two dataset layouts."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from vesper.common.config import RunConfig, load_config
from vesper.common.dataset_files import (
    DatasetError,
    load_graph_part,
    load_label_part,
    resolve_dataset,
)
from vesper.common.splits import split_for, stratified_split
from vesper.party_a.graph_store import build_graph

TOLOKERS = Path(__file__).resolve().parents[2] / "shared" / "data" / "tolokers.npz"


def test_contradictory_run_configs_are_refused() -> None:
    with pytest.raises(ValidationError, match="d_min=12 exceeds extractor.fanout=10"):
        RunConfig.model_validate({"extractor": {"name": "pmp-gcn", "fanout": 10, "d_min": 12}})
    with pytest.raises(ValidationError, match="noise_multiplier is set but privacy.epsilon is inf"):
        RunConfig.model_validate({"privacy": {"epsilon": "inf"}, "extractor": {"noise_multiplier": 2.0}})
    with pytest.raises(ValidationError, match="epsilon must be > 0"):
        RunConfig.model_validate({"privacy": {"epsilon": 0}})
    with pytest.raises(ValidationError, match="delta must be in"):
        RunConfig.model_validate({"privacy": {"delta": 1.5}})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        RunConfig.model_validate({"epoch": 3})
    assert math.isinf(RunConfig.model_validate({"privacy": {"epsilon": "inf"}}).privacy.epsilon)


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"extractor": {"fanout": 3, "degree_bound": 5}}, "fanout=3 is below extractor.degree_bound=5"),
        ({"extractor": {"name": "pmp-gcn", "fanout": 0, "degree_bound": 2, "d_min": 3}}, "d_min=3 exceeds extractor.degree_bound=2"),
        ({"privacy": {"accounting": "hidden-batch", "edge_sample_rate": 0.5}}, "visible-batch credit"),
        ({"privacy": {"accounting": "hidden-batch"}, "extractor": {"fanout": 0}}, "needs the degree bound D"),
        ({"privacy": {"edge_sample_rate": 0.5}, "extractor": {"fanout": 0, "degree_bound": 4}}, "covers one"),
        ({"privacy": {"edge_sample_rate": 1.0}}, "less than 1"),
        ({"privacy": {"accountant": "moments"}}, "'pld' or 'rdp'"),
        ({"privacy": {"accounting": "hidden"}}, "'visible-batch' or 'hidden-batch'"),
    ],
)
def test_contradictory_privacy_settings_are_refused(data: dict, fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        RunConfig.model_validate(data)
    # and these combinations are fine
    RunConfig.model_validate({"privacy": {"accounting": "hidden-batch"}, "extractor": {"fanout": 0, "degree_bound": 5}})
    RunConfig.model_validate({"privacy": {"edge_sample_rate": 0.25, "accountant": "rdp"}})


def test_toml_files_are_validated(tmp_path: Path) -> None:
    good = tmp_path / "a.toml"
    good.write_text('[party_a]\nlisten = "0.0.0.0:9000"\n[run]\nepochs = 3\n[run.extractor]\nname = "pmp-gin"\n')
    config = load_config(good)
    assert config.party_a.listen == "0.0.0.0:9000" and config.run.extractor.name == "pmp-gin"
    bad = tmp_path / "b.toml"
    bad.write_text("[run]\nepochs = \n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


def test_cora_has_the_documented_shape() -> None:
    path = resolve_dataset("cora")
    graph = build_graph(load_graph_part(path).edges, 2708)
    assert (graph.num_nodes, graph.num_edges, int(graph.degree.max())) == (2708, 5278, 168)
    labels = load_label_part(path)
    assert labels.masks is None and labels.labels.max() == 6


def test_stratified_split_is_seeded_and_stratified() -> None:
    labels = load_label_part(resolve_dataset("cora")).labels
    split = stratified_split(labels, seed=0)
    again = stratified_split(labels, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip((split.train, split.val, split.test), (again.train, again.val, again.test)))
    assert not np.array_equal(split.train, stratified_split(labels, seed=1).train)
    everything = np.concatenate([split.train, split.val, split.test])
    assert np.array_equal(np.sort(everything), np.arange(labels.size))
    for cls in range(7):
        share = np.mean(labels[split.train] == cls) - np.mean(labels == cls)
        assert abs(share) < 0.01
    assert split.description == "stratified 50/25/25, seed 0"


@pytest.mark.skipif(not TOLOKERS.exists(), reason="shared/data/tolokers.npz is not next to this checkout")
def test_tolokers_layout_and_its_split() -> None:
    part = load_graph_part(TOLOKERS)
    graph = build_graph(part.edges, part.num_nodes)
    assert (graph.num_nodes, graph.num_edges) == (11758, 519000)
    labels = load_label_part(TOLOKERS)
    split = split_for(labels, seed=0)
    assert split.description == "the file's split 0" and split.train.size + split.val.size + split.test.size == 11758


def test_bad_dataset_names_and_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="unknown dataset 'nope'"):
        resolve_dataset("nope")
    text = tmp_path / "x.txt"
    text.write_text("hi")
    with pytest.raises(DatasetError, match="not an .npz"):
        resolve_dataset(str(text))
    odd = tmp_path / "odd.npz"
    np.savez(odd, something=np.zeros(3))
    with pytest.raises(DatasetError, match="neither layout"):
        load_graph_part(odd)
    broken = tmp_path / "edges.npz"
    np.savez(broken, node_features=np.zeros((3, 2), np.float32), node_labels=np.zeros(3, np.int64), edges=np.array([[0, 7]]))
    with pytest.raises(DatasetError, match="outside 0..2"):
        load_graph_part(broken)
    assert resolve_dataset("mine", {"mine": str(broken)}) == broken


@pytest.mark.parametrize("name", ["platform.toml", "bank.toml", "accountant.toml"])
def test_example_deployment_configs_are_valid(name: str) -> None:
    config = load_config(Path(__file__).resolve().parents[1] / "deploy" / name)
    assert any(getattr(config, section) is not None for section in ("party_a", "party_b", "accountant"))


def test_a_run_summary_from_a_newer_party_a_keeps_what_this_coordinator_knows() -> None:
    from vesper.common.config import RunSummary

    fields = {"run_id": "r", "status": "interrupted", "dataset": "cora", "extractor": "pmp-gcn", "decoder": "gru",
              "accounting": "visible-batch", "epsilon_budget": 4.0, "epsilon_spent": 1.5, "delta": 1e-5}
    summary = RunSummary.model_validate_json(json.dumps({**fields, "a_field_of_a_later_version": 1}))
    assert summary.status == "interrupted" and summary.epsilon_spent == 1.5
    with pytest.raises(ValidationError):
        RunSummary.model_validate({**fields, "status": "half-done"})
