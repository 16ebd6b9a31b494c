"""The sensitivity formulas and the charge rule built from them
(vesper.party_a.extractors.sensitivity), without running an extractor."""

from __future__ import annotations

import math

import pytest

from vesper.party_a.extractors.sensitivity import (
    charge_rule,
    gcn_layer_sensitivity,
    participation_bound,
    pass_sensitivity,
    step_sensitivity,
)

# --------------------------------------------------------------------------------------
# The numbers and the rule
# --------------------------------------------------------------------------------------


def test_step_sensitivity_composes_layers() -> None:
    assert step_sensitivity("pmp-gin", 3, 5, 0) == pytest.approx(3**0.5 * 2)
    assert step_sensitivity("pmp-gin", 2, 0, 0, degree_bound=4) == pytest.approx(2**0.5 * 8**0.5)
    assert step_sensitivity("mlp", 2, 5, 0) == 0


def test_participation_bounds() -> None:
    assert participation_bound("mlp", 3, 10) == 0
    assert participation_bound("pmp-gin", 1, 10) == 2
    assert participation_bound("pmp-gcn", 1, 10) == 20
    assert participation_bound("pmp-gcn", 1, 0) is None  # unbounded degree, unbounded reach
    assert participation_bound("pmp-gin", 2, 10) is None  # L >= 2 reaches neighbours of neighbours
    # on P(G), eqs. N2-N3: four changed nodes for GIN, their neighbourhoods for GCN
    assert participation_bound("pmp-gin", 1, 0, degree_bound=10) == 4
    assert participation_bound("pmp-gin", 2, 0, degree_bound=10) == 40
    assert participation_bound("pmp-gcn", 1, 0, degree_bound=10) == 22
    assert participation_bound("pmp-gcn", 2, 0, degree_bound=10) == 202


def test_pass_sensitivities() -> None:
    assert pass_sensitivity("pmp-gin", 1, 10, 0) == pytest.approx(2.0)  # eq. G0, once per pass
    assert pass_sensitivity("pmp-gcn", 1, 10, 1) == pytest.approx(gcn_layer_sensitivity(10, 1))
    assert pass_sensitivity("pmp-gin", 2, 10, 0) is None  # unbounded recomputation
    for degree_bound in (2, 3, 10):  # eq. R3 for GIN, L = 2: 8D + 20
        assert pass_sensitivity("pmp-gin", 2, 0, 0, degree_bound) ** 2 == pytest.approx(8 * degree_bound + 20)
    assert pass_sensitivity("pmp-gin", 1, 0, 0, 10) ** 2 == pytest.approx(8.0)


@pytest.mark.parametrize("name", ["pmp-gin", "pmp-gcn"])
@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("fanout, degree_bound", [(10, 0), (0, 0), (0, 10), (0, 4)])
def test_the_rule_is_the_cheaper_valid_form(name: str, layers: int, fanout: int, degree_bound: int) -> None:
    rule = charge_rule(name, layers, fanout, 2, degree_bound)
    step = step_sensitivity(name, layers, fanout, 2, degree_bound)
    reach = participation_bound(name, layers, fanout, degree_bound)
    whole = pass_sensitivity(name, layers, fanout, 2, degree_bound)
    assert rule.step_sensitivity == pytest.approx(step)
    assert rule.edge_reach == reach
    per_step = math.inf if reach is None else reach * step**2
    per_pass = math.inf if whole is None else whole**2
    assert rule.pass_cost == pytest.approx(min(per_step, per_pass))
    assert rule.form == ("per-pass" if per_pass < per_step else "per-step")
    assert (rule.participation_bound == 1) == (rule.form == "per-pass")
    assert "docs/privacy.md" in rule.derivation


def test_the_pass_form_removes_the_double_count() -> None:
    """GCN, L = 1, fanout 10: the per-step form charged N_e = 2D = 20 releases of the same S."""
    rule = charge_rule("pmp-gcn", 1, 10, 1, 0)
    assert rule.form == "per-pass" and rule.participation_bound == 1
    assert 20 * step_sensitivity("pmp-gcn", 1, 10, 1) ** 2 == pytest.approx(20 * rule.pass_cost)


def test_mlp_is_free() -> None:
    rule = charge_rule("mlp", 2, 10, 0, 0)
    assert (rule.sensitivity, rule.participation_bound, rule.step_sensitivity) == (0.0, 0, 0.0)


@pytest.mark.parametrize(
    "args, message",
    [
        (("gat", 1, 10, 1, 0), "unknown extractor"),
        (("pmp-gin", 0, 10, 1, 0), "layers"),
        (("pmp-gin", 1, -1, 1, 0), ">= 0"),
        (("pmp-gcn", 1, 0, 1, -2), ">= 0"),
        (("pmp-gcn", 1, 5, 1, 10), "not supported"),
        (("pmp-gcn", 1, 0, 11, 10), "d_min 11 above the degree bound"),
    ],
)
def test_bad_arguments_are_refused(args, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        charge_rule(*args)


def test_reading_the_projection_with_a_larger_fanout_is_the_same_rule() -> None:
    assert charge_rule("pmp-gcn", 2, 12, 2, 10).pass_cost == charge_rule("pmp-gcn", 2, 0, 2, 10).pass_cost


def test_the_per_pass_form_can_be_switched_off() -> None:
    """For accounting that needs one event per release (e.g. Poisson edge sampling)."""
    rule = charge_rule("pmp-gcn", 1, 10, 1, 0, allow_per_pass=False)
    assert rule.form == "per-step" and rule.participation_bound == 20
