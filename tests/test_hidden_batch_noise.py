"""``benchmarks.hidden_batch_noise``: each mode's z from the run's real plan, and hidden-batch's z
taken apart consistently with what the accountant calibrates."""

from __future__ import annotations

import pytest

from vesper.benchmarks import hidden_batch_noise as noise
from vesper.common.config import RunConfig
from vesper.common.dataset_files import resolve_dataset


def _config(epochs: int, epsilon: float) -> RunConfig:
    return RunConfig.model_validate({"epochs": epochs, "privacy": {"epsilon": epsilon}})


def test_below_the_floor_no_hidden_batch_z_exists_and_the_floor_is_the_documented_one() -> None:
    report = noise.noise_report(resolve_dataset("cora"), _config(20, 4.0))
    modes = {m.accounting: m for m in report.modes}
    assert report.train_nodes == 1354 and report.hidden is not None
    # docs/utility.md, "Bound (6) has a floor": Cora, 20 epochs, δ = 1e-6
    assert report.hidden.floor == pytest.approx(10.59, abs=0.005)
    assert modes["hidden-batch"].noise_multiplier is None and report.hidden.z_bound6 is None
    assert modes["visible-batch"].noise_multiplier is not None and modes["visible-batch"].noise_multiplier > 1
    assert "none reaches ε" in noise.markdown([report])


def test_hidden_batch_z_is_the_larger_of_its_two_numbers_and_charging_the_evaluation_raises_it() -> None:
    report = noise.noise_report(resolve_dataset("cora"), _config(20, 16.0))
    hidden, modes = report.hidden, {m.accounting: m for m in report.modes}
    assert hidden is not None and hidden.z_events is not None and hidden.z_bound6 is not None
    z = modes["hidden-batch"].noise_multiplier
    assert z is not None and z == pytest.approx(max(hidden.z_events, hidden.z_bound6), rel=1e-3)
    assert hidden.z_train_only is not None and hidden.z_train_only < z  # the sweep costs budget
    assert hidden.bound6_train_share is not None and hidden.floor < hidden.bound6_train_share < 16.0
    assert hidden.steps == 20 * 6 and hidden.eval_precision == pytest.approx(1.0)  # one per-pass eval release
    assert modes["hidden-batch"].noise_std == pytest.approx(z * modes["hidden-batch"].sensitivity)
