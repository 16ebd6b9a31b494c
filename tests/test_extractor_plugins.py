"""The extractor plugin interface: entry-point discovery, a third-party package, bad configs.

A tiny package (tests/plugin_example) is installed with pip into a temporary directory;
party A, started with that directory on its path, finds and trains with it through
the ``vesper.extractors`` entry point alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from e2e import ledger, vesper

from vesper.common.config import RunConfig
from vesper.coordinator.processes import LocalCluster
from vesper.party_a.extractors import registry

EXAMPLE = Path(__file__).parent / "plugin_example"
BUILTIN = {"mlp", "pmp-gin", "pmp-gcn"}


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--target", str(target), str(EXAMPLE)],
        capture_output=True, text=True, timeout=180, cwd=build,
    )
    assert result.returncode == 0, result.stderr
    return target


def _with_path(path: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(path), os.environ.get("PYTHONPATH", "")]))}


def test_builtin_extractors_are_entry_points() -> None:
    found = {item.name: item for item in registry.installed()}
    assert BUILTIN <= set(found)
    for name in BUILTIN:
        cls = found[name].extractor
        assert cls is not None and cls.spec.name == name
        assert all(callable(getattr(cls, method, None)) for method in ("charge_plan", "bind", "prepare", "release"))
        assert isinstance(cls.spec.privacy_unit, str) and cls.spec.cost_model in {"none", "per-step"}
    assert registry.lookup("pmp-gcn").spec.accountings == ("visible-batch", "hidden-batch")


def test_unknown_and_broken_plugins_are_named() -> None:
    with pytest.raises(registry.ExtractorNotFound, match="unknown extractor 'nope'; installed on party A: .*pmp-gcn"):
        registry.lookup("nope")
    broken = registry._load(EntryPoint(name="ghost", value="no_such_module_xyz:Thing", group=registry.GROUP))
    assert broken.extractor is None and "cannot import" in broken.error
    renamed = registry._load(
        EntryPoint(name="other-name", value="vesper.party_a.extractors.pmp_plugin:MlpPlugin", group=registry.GROUP)
    )
    assert renamed.extractor is None and "spec says 'mlp'" in renamed.error
    not_a_plugin = registry._load(EntryPoint(name="json", value="json:JSONDecoder", group=registry.GROUP))
    assert not_a_plugin.extractor is None and "ExtractorSpec" in not_a_plugin.error


def test_params_and_modes_are_validated_against_the_plugin() -> None:
    mlp = registry.lookup("mlp")
    with pytest.raises(ValueError, match=r"extractor.params.hops: Extra inputs are not permitted"):
        registry.validated_params(mlp.spec, RunConfig.model_validate({"extractor": {"name": "mlp", "params": {"hops": 2}}}))
    spec = mlp.spec.model_copy(update={"accountings": ("visible-batch",)})
    hidden = RunConfig.model_validate({"extractor": {"name": "mlp"}, "privacy": {"accounting": "hidden-batch"}})
    with pytest.raises(ValueError, match="supports accounting visible-batch, not hidden-batch"):
        registry.validated_params(spec, hidden)
    sampled = RunConfig.model_validate({"extractor": {"name": "mlp"}, "privacy": {"edge_sample_rate": 0.5}})
    with pytest.raises(ValueError, match="does not support privacy.edge_sample_rate"):
        registry.validated_params(mlp.spec, sampled)
    with pytest.raises(ValueError, match="pattern"):
        RunConfig.model_validate({"extractor": {"name": "Bad Name!"}})


def test_cli_lists_extractors_with_their_parameters(plugin_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "vesper.coordinator", "extractors", "--json"],
        capture_output=True, text=True, timeout=120, env=_with_path(plugin_path),
    )
    assert result.returncode == 0, result.stderr
    listed = {row["name"]: row for row in json.loads(result.stdout)}
    example = listed["example-random-features"]
    assert example["distribution"] == "vesper-example-plugin"
    assert example["privacy_unit"] == "edge" and example["cost_model"] == "none"
    assert example["params"] == [
        {"name": "scale", "default": "1.0", "description": "multiplies the projection before normalising"}
    ]
    assert BUILTIN <= set(listed) and listed["pmp-gcn"]["cost_model"] == "per-step"
    # with GAP's own d = 16, its edge-free path keeps the MLP baseline's d = 64
    assert listed["gap"]["edge_free_path_defaults"] == {"extractor.edge_free_path_dim": 64}
    assert listed["pmp-gcn"]["edge_free_path_defaults"] == example["edge_free_path_defaults"] == {}
    # without the package on the path, it is simply not there
    code, output = vesper("extractors")
    assert code == 0 and "pmp-gcn" in output and "example-random-features" not in output


@pytest.mark.e2e
@pytest.mark.slow  # a run through the services (~20 s); the listing and the lookup stay in make test
def test_an_installed_third_party_extractor_trains_end_to_end(plugin_path: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", _with_path(plugin_path)["PYTHONPATH"])
    out = tmp_path / "run.json"
    with LocalCluster(tmp_path / "cluster", party_a={"secret_seed": 3}) as cluster:
        code, output = vesper(
            "train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--epochs", "1",
            "--extractor", "example-random-features", "--param", "scale=2.5", "--json-out", str(out),
        )
        assert code == 0, output
        summary = json.loads(out.read_text())
        assert summary["extractor"] == "example-random-features" and summary["status"] == "completed"
        assert summary["epsilon_spent"] == 0 and summary["privacy_unit"] == "edge"
        record = ledger(cluster.status_url, summary["run_id"])
        assert {row["kind"] for row in record["rows"]} == {"train", "eval"}
        assert all(json.loads(row["release_event"])["type"] == "NoOpDpEvent" for row in record["rows"])

        code, output = vesper(
            "train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--epochs", "1",
            "--extractor", "example-random-features", "--param", "scale=-1",
        )
        assert code == 1 and "extractor.params.scale" in output, output
        code, output = vesper(
            "train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--epochs", "1",
            "--extractor", "not-installed",
        )
        assert code == 1 and "unknown extractor 'not-installed'" in output, output


def test_the_trainer_turns_plans_into_charge_rules() -> None:
    """ε = ∞ records NonPrivate for every costly mechanism; no-op stays no-op; bad plans are refused."""
    import dp_accounting as dpa

    from vesper.common.privacy.events import event_from_json
    from vesper.common.privacy.ledger import PlanRule
    from vesper.party_a.extractors.base import ChargePlan, Stage
    from vesper.party_a.run.release import plan_release

    config = RunConfig.model_validate({"privacy": {"epsilon": "inf"}, "extractor": {"name": "gap"}})

    def release_of(plan: ChargePlan):  # no calibration at ε = ∞
        return plan_release(config, plan, calibrate=lambda: pytest.fail("calibrated at ε = ∞"))

    rules = [
        PlanRule(kind="one-shot", participation_bound=None, mechanism="exponential"),
        PlanRule(kind="train", participation_bound=None, mechanism="no-op"),
        PlanRule(kind="eval", participation_bound=None),
    ]
    release = release_of(ChargePlan(rules, 1.0, one_shot_releases=1))
    events = {rule.kind: type(event_from_json(rule.release_event)) for rule in release.rules}
    assert events == {"one-shot": dpa.NonPrivateDpEvent, "train": dpa.NoOpDpEvent, "eval": dpa.NonPrivateDpEvent}
    assert release.noise_multiplier is None and release.noise_std == 0

    with pytest.raises(ValueError, match="one rule for each of train and eval"):
        release_of(ChargePlan(rules[:2], 1.0))
    with pytest.raises(ValueError, match="plans one-shot releases but declares no rule"):
        release_of(ChargePlan(rules[1:], 1.0, one_shot_releases=2))
    with pytest.raises(ValueError, match="edge-free stages but a costly train rule"):
        costly = [rules[0], PlanRule(kind="train", participation_bound=1), rules[2]]
        release_of(ChargePlan(costly, 1.0, stages=(Stage("encoder", 1, 1),)))


def test_a_prediction_rule_is_the_evaluation_rule_and_only_for_extractors_that_can_predict() -> None:
    from vesper.common.privacy.ledger import PlanRule
    from vesper.party_a.extractors.base import ChargePlan
    from vesper.party_a.run.release import with_prediction

    rules = [PlanRule(kind="train", participation_bound=1), PlanRule(kind="eval", participation_bound=2)]
    config = RunConfig.model_validate({"privacy": {"epsilon": 4, "prediction_passes": 2}})
    plan = with_prediction(ChargePlan(rules, 1.0), config)
    assert [(r.kind, r.participation_bound) for r in plan.rules] == [("train", 1), ("eval", 2), ("predict", 2)]
    assert plan.prediction_passes == 2
    why = "its private neighbourhoods cover the run's roots only"
    with pytest.raises(ValueError, match=r"cannot predict \(its private.*leave privacy.prediction_passes at 0, not 2"):
        with_prediction(ChargePlan(rules, 1.0), config, why)
    unserved = with_prediction(ChargePlan(rules, 1.0), RunConfig(), why)
    assert [r.kind for r in unserved.rules] == ["train", "eval"] and unserved.prediction_passes == 0
