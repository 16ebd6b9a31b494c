"""The extractor a run trains when it names none (party_a.extractors.default_choice; issue #21):
GAP, or ProGAP where A's operator declared an edge bound under which the graph is dense."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import small_dense_graph

from vesper.common.config import RunConfig
from vesper.party_a.extractors.default_choice import DENSE_MEAN_DEGREE, declared_mean_degree, with_default_extractor
from vesper.party_a.extractors.registry import lookup, with_run_defaults

CORA = (2_708, 5_278)  # nodes, published undirected edges
TOLOKERS = (11_758, 519_000)


def run(**sections: object) -> RunConfig:
    return RunConfig.model_validate({"dataset": "g", **sections})


def test_a_declared_dense_graph_gets_progap_and_the_run_says_why() -> None:
    nodes, edges = TOLOKERS
    config, why = with_default_extractor(run(privacy={"edge_bound": edges, "epsilon": 4.0}), nodes)
    assert config.extractor.name == "progap"
    assert "mean degree of 88.3" in why and "--extractor" in why
    # progap's own defaults then apply, as to a run that named it
    _, applied = with_run_defaults(config)
    assert applied.own == lookup("progap").spec.run_defaults


@pytest.mark.parametrize("sections", [
    {},  # no bound declared: nothing says the graph is dense
    {"privacy": {"edge_bound": CORA[1]}},  # declared, sparse (mean degree 3.9)
    {"privacy": {"edge_bound": TOLOKERS[1]}, "extractor": {"name": "gap"}},  # named, even as the default's name
    {"privacy": {"edge_bound": TOLOKERS[1]}, "extractor": {"name": "pmp-gcn"}},
    {"privacy": {"edge_bound": TOLOKERS[1], "accounting": "hidden-batch"}},  # progap is visible-batch only
])
def test_otherwise_the_run_is_left_as_it_is(sections: dict) -> None:
    nodes = CORA[0] if sections.get("privacy", {}).get("edge_bound") == CORA[1] else TOLOKERS[0]
    config = run(**sections)
    assert with_default_extractor(config, nodes) == (config, "")


def test_the_line_is_the_declared_mean_degree() -> None:
    assert declared_mean_degree(*reversed(CORA)) == pytest.approx(3.898, abs=1e-3)
    nodes = 1_000
    at = int(DENSE_MEAN_DEGREE * nodes / 2)
    assert with_default_extractor(run(privacy={"edge_bound": at}), nodes)[0].extractor.name == "progap"
    assert with_default_extractor(run(privacy={"edge_bound": at - 1}), nodes)[0].extractor.name == "gap"


@pytest.mark.e2e
def test_party_a_trains_progap_on_a_declared_dense_graph_and_says_so(tmp_path: Path) -> None:
    from vesper.coordinator.in_process import InProcessCluster

    small = small_dense_graph(tmp_path / "small.npz")  # 100 nodes; a bound of 1,000 edges allows mean degree 20
    events = []
    config = run(dataset="small", privacy={"epsilon": 4.0, "edge_bound": 1_000})
    with InProcessCluster(tmp_path / "cluster", datasets={"small": str(small)}) as cluster:
        summary = cluster.drive(config, events.append)
    assert summary.status == "completed", summary.message
    assert summary.extractor == "progap"
    said = [e.message for e in events if e.message.startswith("no extractor named")]
    assert len(said) == 1 and "mean degree of 20.0" in said[0]
    assert any(e.message.startswith("progap's own defaults") for e in events)
