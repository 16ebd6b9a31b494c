"""Mixture-of-Gaussians and pre-train charge rules: events, accounting, plans, messages.

HeterPoisson's per-step release is a Gaussian with a random sensitivity
(MixtureOfGaussiansDpEvent); relational pre-training charges chunks of DP-SGD steps inside
party A as ``pre-train`` releases (``repeats`` steps each). These tests pin the shared
machinery those extractors rely on.
"""

from __future__ import annotations

import dp_accounting as dpa
import pytest
import torch
from dp_accounting.dp_event import MixtureOfGaussiansDpEvent
from pydantic import ValidationError

from vesper.common.config import RunConfig
from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.events import EventError, event_from_json, event_to_json
from vesper.common.privacy.ledger import PlannedPass, PlanRule, check_hidden_batch_events, counted_per_kind
from vesper.common.privacy.plan_messages import plan_rule_to_proto, plan_rules_from_proto
from vesper.party_a.extractors.base import (
    ChargePlan,
    ExtractorBase,
    ExtractorSpec,
    RootPlan,
    overrides_root_batches,
    shuffled_batches,
)
from vesper.party_a.extractors.registry import validated_params


def test_mixture_event_round_trips_and_bad_mixtures_are_refused() -> None:
    event = dpa.SelfComposedDpEvent(MixtureOfGaussiansDpEvent(2.0, [1.0, 2.0], [0.75, 0.25]), 3)
    assert event_from_json(event_to_json(event)) == event
    for sensitivities, probs, problem in [
        ([1.0, 2.0], [0.5, 0.4], "sum to 1"),
        ([1.0], [0.5, 0.5], "as many"),
        ([-1.0, 2.0], [0.5, 0.5], "outside"),
        ([float("nan"), 2.0], [0.5, 0.5], "finite"),
        ([], [], "at least one"),
        ([1.0] * 100_001, [1e-5] * 100_001, "exceeds"),
    ]:
        text = event_to_json(MixtureOfGaussiansDpEvent(1.0, [1.0], [1.0])).replace(
            '"sampling_probs":[1.0],"sensitivities":[1.0]',
            f'"sampling_probs":{probs},"sensitivities":{sensitivities}'.replace("nan", "NaN"),
        )
        with pytest.raises(EventError, match=problem):
            event_from_json(text)


def test_mixture_epsilon_matches_the_gaussian_and_grows_with_sensitivity_mass() -> None:
    delta = 1e-5
    gaussian = epsilon_of(dpa.GaussianDpEvent(5.0), delta).epsilon
    single = epsilon_of(MixtureOfGaussiansDpEvent(5.0, [1.0], [1.0]), delta)
    assert single.accountant.startswith("pld")
    assert gaussian <= single.epsilon <= gaussian * 1.001  # pessimistic PLD: never below the exact value
    heavier = epsilon_of(MixtureOfGaussiansDpEvent(5.0, [1.0, 3.0], [0.9, 0.1]), delta).epsilon
    assert heavier > single.epsilon
    composed = epsilon_of(dpa.SelfComposedDpEvent(MixtureOfGaussiansDpEvent(5.0, [1.0, 3.0], [0.9, 0.1]), 4), delta)
    assert composed.epsilon > heavier
    with pytest.raises(ValueError, match="RDP accountant cannot account"):
        epsilon_of(MixtureOfGaussiansDpEvent(5.0, [1.0], [1.0]), delta, accountant="rdp")


def test_plan_rules_for_mixtures_and_repeated_steps() -> None:
    mixture = PlanRule(
        kind="train", participation_bound=None, mechanism="mixture-of-gaussians",
        sensitivities=[1.0, 2.0], sampling_probs=[0.6, 0.4], noise_scale=2.0,
    )
    assert mixture.event(3.0) == MixtureOfGaussiansDpEvent(6.0, [1.0, 2.0], [0.6, 0.4])
    chunk = PlanRule(kind="pre-train", participation_bound=None, sampling_probability=0.01, repeats=50)
    assert chunk.event(1.5) == dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(0.01, dpa.GaussianDpEvent(1.5)), 50)
    assert PlanRule(kind="train", participation_bound=None, mechanism="no-op", repeats=5).event(1.0) == dpa.NoOpDpEvent()
    with pytest.raises(ValidationError, match="exactly for mixture"):
        PlanRule(kind="train", participation_bound=None, sensitivities=[1.0], sampling_probs=[1.0])
    with pytest.raises(ValidationError, match="sum to 1"):
        PlanRule(kind="train", participation_bound=None, mechanism="mixture-of-gaussians",
                 sensitivities=[1.0, 2.0], sampling_probs=[0.6, 0.6])
    with pytest.raises(ValidationError, match="cannot be Poisson-sampled"):
        PlanRule(kind="train", participation_bound=None, mechanism="mixture-of-gaussians",
                 sensitivities=[1.0], sampling_probs=[1.0], sampling_probability=0.5)
    for rule in (mixture, chunk):
        assert plan_rules_from_proto([plan_rule_to_proto(rule)]) == [rule]


def test_pre_train_pass_comes_first_and_hidden_batch_refuses_it() -> None:
    roots = RootPlan(torch.arange(10), torch.arange(10, 12), torch.arange(12, 14), steps_per_epoch=2, eval_chunks=1)
    plan = ChargePlan(
        [PlanRule(kind="pre-train", participation_bound=None, sampling_probability=0.1, repeats=10),
         PlanRule(kind="one-shot", participation_bound=None),
         PlanRule(kind="train", participation_bound=None, mechanism="no-op"),
         PlanRule(kind="eval", participation_bound=None, mechanism="no-op")],
        sensitivity=1.0, one_shot_releases=2, pre_train_releases=3,
    )
    passes = plan.passes(4, roots)
    assert passes[0] == PlannedPass(kind="pre-train", releases=3)
    assert passes[1] == PlannedPass(kind="one-shot", releases=2)
    assert counted_per_kind(passes, {r.kind: r.participation_bound for r in plan.rules})["pre-train"] == 3
    events = {r.kind: r.event(1.0) for r in plan.rules if r.kind != "one-shot"}
    with pytest.raises(ValueError, match="no term for pre-train"):
        check_hidden_batch_events(events)


class _OwnRoots(ExtractorBase):
    spec = ExtractorSpec(name="own-roots", privacy_unit="node", cost_model="per-step", summary="test",
                         accountants=("pld",))

    def root_batches(self, train_ids: torch.Tensor, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
        return [train_ids]


def test_root_batches_default_and_override_and_accountant_restriction() -> None:
    generator = torch.Generator().manual_seed(3)
    batches = shuffled_batches(torch.arange(10), 4, generator)
    expected = torch.arange(10)[torch.randperm(10, generator=torch.Generator().manual_seed(3))].split(4)
    assert [b.tolist() for b in batches] == [b.tolist() for b in expected]  # the trainer's order before the hook
    assert overrides_root_batches(_OwnRoots.__new__(_OwnRoots))
    assert not overrides_root_batches(ExtractorBase.__new__(ExtractorBase))
    config = RunConfig.model_validate({"privacy": {"epsilon": 4, "accountant": "rdp"}, "extractor": {"name": "own-roots"}})
    with pytest.raises(ValueError, match="accounted by pld only, not by privacy.accountant=rdp"):
        validated_params(_OwnRoots.spec, config)
