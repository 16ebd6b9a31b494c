"""Fuzzing party A's GraphParty.StartRun, live on loopback, and the regression tests of the
bugs it found there.

The cluster, shared by every test_fuzz_rpc_*.py module: fuzz_rpc_world.py and
fuzz_rpc_cluster.py; the expectations and shared strategies: fuzz_rpc_strategies.py.
tests/test_e2e_bad_input.py holds the hand-picked cases.
"""

from __future__ import annotations

import json
import re

import pytest
from fuzz_rpc_strategies import (
    DEPTHS,
    INVALID,
    NOT_FOUND,
    PRECONDITION,
    UNKNOWN_DATASETS,
    Expect,
    _not_json,
    assert_refused,
    fuzz_settings,
)
from fuzz_rpc_world import SETUP_RUN, World, _ledgers, _setup_request
from hypothesis import given
from hypothesis import strategies as st

from vesper.common.config import RunConfig
from vesper.proto.v1 import graph_party_pb2 as ga

pytest_plugins = ["fuzz_rpc_cluster"]  # the `world` fixture: one cluster for every fuzz module
# the RPC fuzzers share that cluster and a real run (~2 minutes on 2 cores): make test-slow
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


# (path, value): each breaks RunConfig on its own
BAD_CONFIG_VALUES: list[tuple[tuple[str, ...], object]] = [
    (("epochs",), 0), (("epochs",), 100_001), (("epochs",), "many"), (("epochs",), 1.5), (("batch_size",), 0),
    (("seed",), -1), (("seed",), 1e30), (("split_seed",), -3), (("wire_dtype",), "float64"), (("eval_chunk",), 0),
    (("privacy", "epsilon"), 0), (("privacy", "epsilon"), -8), (("privacy", "delta"), 1.5), (("privacy", "delta"), 0),
    (("privacy", "accounting"), "sometimes"), (("privacy", "accountant"), "abacus"),
    (("privacy", "edge_sample_rate"), 1.0), (("extractor", "name"), "Bad Name!"), (("extractor", "layers"), 0),
    (("extractor", "layers"), 9), (("extractor", "dim"), 0), (("extractor", "dim"), 4097), (("extractor", "fanout"), -1),
    (("extractor", "dropout"), 1.0), (("extractor", "noise_multiplier"), 0), (("decoder", "kind"), "transformer"),
    (("decoder", "hidden_dim"), 0), (("optimizer", "name"), "rmsprop"), (("optimizer", "lr"), 11),
    (("label_privacy", "mode"), "sometimes"), (("audit", "canaries"), -1), (("record_gradients",), "maybe"),
    (("privacy",), "eight"), (("extractor",), [1, 2]),
]


def _put(config: dict, path: tuple[str, ...], value: object) -> None:
    for key in path[:-1]:
        if not isinstance(config.get(key), dict):
            config[key] = {}
        config = config[key]
    config[path[-1]] = value


@st.composite
def start_requests(draw: st.DrawFn, world: World) -> tuple[ga.StartRunRequest, list[Expect]]:
    invalid_config = Expect(INVALID, "invalid run configuration")
    mode = draw(st.sampled_from(["text", "config", "config", "resume"]))
    if mode == "text":
        text = draw(st.one_of(
            st.text(min_size=1, max_size=60).filter(_not_json),
            st.one_of(st.integers(), st.lists(st.integers(), max_size=3), st.text(max_size=10), st.none(),
                      st.floats(allow_nan=False)).map(json.dumps),
        ))
        return ga.StartRunRequest(run_config_json=text), [invalid_config]
    if mode == "resume":
        fault = draw(st.sampled_from(["malformed id", "unknown run", "settings too"]))
        if fault == "malformed id":
            run_id = draw(st.text(min_size=1, max_size=30).filter(lambda t: not re.fullmatch(r"[0-9a-f]{12}", t)))
            return ga.StartRunRequest(resume_run_id=run_id), [Expect(INVALID, "must match")]
        if fault == "unknown run":
            run_id = draw(st.from_regex(r"[0-9a-f]{12}", fullmatch=True).filter(lambda t: t != world.baseline_run))
            return ga.StartRunRequest(resume_run_id=run_id), [Expect(PRECONDITION, f"cannot resume run {run_id}")]
        request = ga.StartRunRequest(resume_run_id=world.baseline_run, run_config_json=json.dumps({"epochs": 2}))
        return request, [Expect(INVALID, "takes its settings from party A's record")]
    config: dict = {"dataset": "cora", "epochs": 1}
    expects = []
    faults = draw(st.sets(st.sampled_from(["unknown field", "bad value", "dataset", "d_min"]), min_size=1, max_size=3))
    if "unknown field" in faults:
        key = draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in RunConfig.model_fields))
        config[key] = draw(st.one_of(st.integers(), st.text(max_size=5), st.none()))
        expects.append(invalid_config)
    if "bad value" in faults:
        for path, value in draw(st.lists(st.sampled_from(BAD_CONFIG_VALUES), min_size=1, max_size=2)):
            _put(config, path, value)
        expects.append(invalid_config)
    if "d_min" in faults:
        fanout = draw(st.integers(1, 20))
        for key, value in (("name", "pmp-gcn"), ("fanout", fanout), ("d_min", fanout + draw(st.integers(1, 50)))):
            _put(config, ("extractor", key), value)
        expects.append(Expect(INVALID, "exceeds extractor.fanout"))
    if "dataset" in faults or not expects:
        config["dataset"] = draw(UNKNOWN_DATASETS)
        expects.append(Expect(NOT_FOUND, "unknown dataset|is not an .npz file"))
    return ga.StartRunRequest(run_config_json=json.dumps(config)), expects


@pytest.mark.parametrize("examples", DEPTHS)
def test_start_run_refuses_every_bad_configuration(world: World, examples: int) -> None:
    """The right request trains: the module's first and last real runs."""
    runs_before = set(_ledgers(world.cluster.status_url))

    @given(data=st.data())
    @fuzz_settings(examples)
    def check(data: st.DataObject) -> None:
        request, expects = data.draw(start_requests(world))
        assert_refused(lambda: list(world.a.StartRun(request, timeout=60)), expects)

    check()
    assert set(_ledgers(world.cluster.status_url)) == runs_before  # no refused run reached the accountant


# -- bugs the fuzzing found outside this test's files, fixed: their regression tests -----------
def test_a_home_directory_of_nobody_is_an_unknown_dataset(world: World) -> None:
    dataset = "~nosuchuser/graph.npz"
    request = ga.StartRunRequest(run_config_json=json.dumps({"dataset": dataset, "epochs": 1}))
    assert_refused(lambda: list(world.a.StartRun(request, timeout=60)), [Expect(NOT_FOUND, "nosuchuser")])
    assert_refused(lambda: world.b.SetupRun(_setup_request(SETUP_RUN, dataset=dataset), timeout=60),
                   [Expect(NOT_FOUND, "nosuchuser")])


def test_an_unknown_extractor_is_refused_before_the_run_starts(world: World) -> None:
    request = ga.StartRunRequest(run_config_json=json.dumps({"dataset": "cora", "epochs": 1, "extractor": {"name": "nosuch"}}))
    assert_refused(lambda: list(world.a.StartRun(request, timeout=60)), [Expect(INVALID, "unknown extractor 'nosuch'")])
