"""Each extractor's own run defaults (issue #21 item 3): party A applies them to what a run does
not set itself, an explicit setting wins, and the benchmarks use the same ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import small_dense_graph

from vesper.common.config import RunConfig
from vesper.party_a.extractors.edge_free_path import baseline_epochs
from vesper.party_a.extractors.registry import AppliedDefaults, installed, lookup, with_run_defaults


def test_defaults_fill_only_what_the_run_did_not_set() -> None:
    bare = RunConfig.model_validate({"dataset": "cora", "extractor": {"name": "gap"}})
    config, applied = with_run_defaults(bare)
    assert applied.own == {"extractor.layers": 1, "epochs": 20, "extractor.dim": 16}
    assert applied.path == {"extractor.edge_free_path_dim": 64}  # the MLP baseline's d
    assert config.epochs == 20 and config.extractor.layers == 1 and config.extractor.name == "gap"
    assert config.extractor.dim == 16
    # a flag or TOML key wins, even one equal to RunConfig's own default
    explicit = RunConfig.model_validate(
        {"dataset": "cora", "epochs": 50, "extractor": {"name": "gap", "layers": 3, "dim": 64}}
    )
    config, applied = with_run_defaults(explicit)
    assert applied == AppliedDefaults()
    assert config.epochs == 50 and config.extractor.layers == 3 and config.extractor.dim == 64
    half = RunConfig.model_validate({"dataset": "cora", "extractor": {"name": "gap", "layers": 2}})
    config, applied = with_run_defaults(half)
    assert applied.own == {"epochs": 20, "extractor.dim": 16} and config.extractor.layers == 2
    # and what a default does not name keeps RunConfig's default
    assert config.batch_size == RunConfig().batch_size


def test_relational_gap_releases_gap_width_hops() -> None:
    """relational-gap's hops are GAP's, and so is their width: d = 16 (docs/utility.md, section 9)."""
    bare = RunConfig.model_validate({"dataset": "tolokers", "extractor": {"name": "relational-gap"}})
    config, applied = with_run_defaults(bare)
    assert applied.own == {"extractor.layers": 1, "epochs": 20, "extractor.dim": 16}
    assert config.extractor.dim == 16


def test_an_extractor_without_defaults_leaves_the_run_as_it_is() -> None:
    config = RunConfig.model_validate({"dataset": "cora", "extractor": {"name": "pmp-gcn"}})
    assert with_run_defaults(config) == (config, AppliedDefaults())


def test_every_declared_default_is_a_valid_setting_and_the_benchmarks_use_them() -> None:
    from vesper.benchmarks.extractor_table import RECIPES, run_config

    for found in installed():
        assert found.extractor is not None, found.error
        spec = found.extractor.spec
        config, applied = with_run_defaults(RunConfig.model_validate({"extractor": {"name": spec.name}}))
        assert applied.own == spec.run_defaults  # each key names a real setting and validates
        assert RECIPES[spec.name] == spec.run_defaults
        cell = run_config(RunConfig(), "cora", spec.name, seed=0)
        for dotted, value in spec.run_defaults.items():
            section, _, key = dotted.rpartition(".")
            assert getattr(getattr(cell, section) if section else cell, key) == value
        # and the edge-free path's settings, as party A records them where it applies the defaults
        assert (cell.extractor.edge_free_path_layers, cell.extractor.edge_free_path_dim) == (
            config.extractor.edge_free_path_layers, config.extractor.edge_free_path_dim,
        ), spec.name
    gap = run_config(RunConfig(epochs=50), "cora", "gap", seed=0)
    assert (gap.epochs, gap.extractor.dim, gap.extractor.edge_free_path_dim) == (20, 16, 64)
    assert run_config(RunConfig(), "cora", "progap", seed=0).extractor.edge_free_path_layers == 1
    # the grid's own cells (vesper bench utility, degradation): the budget set on the base does not
    # make the base's d count as the run's own, so GAP's path keeps the MLP's d
    from vesper.benchmarks.extractor_sweep import GridCell, cell_run_config

    cell = GridCell(dataset="cora", extractor="gap", seed=0, epsilon=4.0, accounting="visible-batch", decoder="concat")
    gap = cell_run_config(RunConfig(epochs=50), cell)
    assert (gap.epochs, gap.extractor.dim, gap.extractor.edge_free_path_dim, gap.privacy.epsilon) == (20, 16, 64, 4.0)
    # the audit benchmark's cells take the same settings
    from vesper.benchmarks.audit_bench import cell_config

    audit = cell_config(RunConfig(), "cora", "gap", "visible-batch", 4.0, seed=0)
    assert (audit.epochs, audit.extractor.dim, audit.extractor.edge_free_path_dim) == (20, 16, 64)


@pytest.mark.e2e
def test_party_a_trains_gap_with_its_defaults_and_says_so(tmp_path: Path) -> None:
    from vesper.coordinator.in_process import InProcessCluster

    # a small graph: one step per epoch (50 training roots), the defaults' 100 epochs in seconds
    small = small_dense_graph(tmp_path / "small.npz")
    events = []
    run = RunConfig.model_validate({"dataset": "small", "extractor": {"name": "gap"}, "privacy": {"epsilon": 4.0}})
    with InProcessCluster(tmp_path / "cluster", datasets={"small": str(small)}) as cluster:
        summary = cluster.drive(run, events.append)
    assert summary.status == "completed", summary.message
    said = [e.message for e in events if "own defaults" in e.message or "baseline's settings" in e.message]
    assert said == [
        "gap's own defaults for what the run did not set: extractor.layers=1, epochs=20, extractor.dim=16",
        "its edge-free path keeps the MLP baseline's settings: extractor.edge_free_path_dim=64",
    ]
    # the main pass (label ""; GAP's edge-free encoder stage is labelled and has its own epochs)
    main = {e.epochs for e in events if e.phase == "train" and e.epochs and not e.message}
    assert main == {lookup("gap").spec.run_defaults["epochs"]}
    # the edge-free path trains alone first for the rest of the MLP baseline's epochs (docs/privacy.md, 2.5)
    path = {e.epochs for e in events if e.phase == "train" and e.epochs and e.message.startswith("edge-free-path")}
    assert path == {baseline_epochs() - main.pop()} == {30}
    assert summary.steps == lookup("gap").spec.params().encoder_epochs + 30 + 20  # 1 step of 50 roots each
