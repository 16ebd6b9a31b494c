"""How each kind of release of one run is charged (VESPER's set-up step, [VESPER, Alg. 3]).

The extractor states each kind's DpEvent as a function of the noise multiplier z
(``ChargePlan.rules``); this module checks the plan, has the accountant calibrate z to the
budget when the run does not fix it, and refuses a run whose planned releases would exceed
the budget before anything is sent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import dp_accounting as dpa

from vesper.common.config import RunConfig
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule, PlanRule
from vesper.party_a.extractors.base import ChargePlan, Extractor, RootPlan, default_relation
from vesper.party_a.peers import AccountantClient, BudgetRefused


@dataclass(frozen=True)
class Release:
    """How each kind of release is charged, fixed for the run."""

    rules: list[ChargeRule]
    noise_multiplier: float | None
    sensitivity: float
    participation_bound: int | None
    details: dict

    @property
    def noise_std(self) -> float:
        return 0.0 if self.noise_multiplier is None else self.noise_multiplier * self.sensitivity

    def event_json(self, kind: str) -> str:
        for rule in self.rules:
            if rule.kind == kind:
                return rule.release_event
        raise ValueError(f"the extractor declared no charge rule for {kind} releases")


def relation(extractor: Extractor) -> str:
    """The neighbouring relation the extractor's guarantee is stated for."""
    return extractor.spec.relation or default_relation(extractor.spec.privacy_unit)


def fixed_rules(plan_rules: list[PlanRule], event_of: Callable[[PlanRule], dpa.DpEvent]) -> list[ChargeRule]:
    return [
        ChargeRule(kind=r.kind, release_event=event_to_json(event_of(r)), participation_bound=r.participation_bound)
        for r in plan_rules
    ]


def check_plan(name: str, plan: ChargePlan, chooses_roots: bool) -> None:
    """Refuse a plan whose rules do not cover its releases (ValueError naming the extractor)."""
    kinds = [rule.kind for rule in plan.rules]
    if len(set(kinds)) != len(kinds) or not {"train", "eval"} <= set(kinds):
        raise ValueError(f"extractor {name} must declare one rule for each of train and eval, got {kinds}")
    if plan.one_shot_releases and "one-shot" not in kinds:
        raise ValueError(f"extractor {name} plans one-shot releases but declares no rule for them")
    if plan.pre_train_releases and "pre-train" not in kinds:
        raise ValueError(f"extractor {name} plans pre-train releases but declares no rule for them")
    if chooses_roots and any(r.kind == "train" and r.participation_bound is not None for r in plan.rules):
        raise ValueError(
            f"extractor {name} chooses its own roots, so its train rule must count every "
            "release (participation_bound None): a root may recur within an epoch"
        )
    if plan.stages and any(r.kind == "train" and r.mechanism != "no-op" for r in plan.rules):
        raise ValueError(f"extractor {name} has edge-free stages but a costly train rule")


def with_prediction(plan: ChargePlan, config: RunConfig, no_prediction: str = "") -> ChargePlan:
    """The plan with a ``predict`` rule and the run's reserved prediction passes.

    A prediction pass releases every node B may name, each once, as the evaluation pass
    releases its nodes: its charge is the evaluation rule's, event and participation bound
    alike (docs/privacy.md, section 2.4). Free when the evaluation's releases are. An
    extractor that cannot serve predictions (``no_prediction``, its reason) gets no rule, and
    a reservation for it is refused before anything is charged.
    """
    if no_prediction:
        if config.privacy.prediction_passes:
            raise ValueError(
                f"{config.extractor.name} cannot predict ({no_prediction}): leave privacy.prediction_passes "
                f"at 0, not {config.privacy.prediction_passes}"
            )
        return plan
    evaluation = next(rule for rule in plan.rules if rule.kind == "eval")
    return dataclasses.replace(
        plan, rules=[*plan.rules, evaluation.model_copy(update={"kind": "predict"})],
        prediction_passes=config.privacy.prediction_passes,
    )


def plan_release(
    config: RunConfig, plan: ChargePlan, calibrate: Callable[[], float], chooses_roots: bool = False,
) -> Release:
    """Each kind's DpEvent: calibrated Gaussian, fixed Gaussian, non-private, or no-op.
    ``calibrate()`` asks the accountant for z; it is called only when the run is private,
    costly and does not fix ``extractor.noise_multiplier``."""
    check_plan(config.extractor.name, plan, chooses_roots)

    def release(rules: list[ChargeRule], z: float | None) -> Release:
        return Release(rules, z, plan.sensitivity, plan.participation_bound, plan.details)

    if all(rule.mechanism == "no-op" for rule in plan.rules):
        return release(fixed_rules(plan.rules, lambda r: dpa.NoOpDpEvent()), None)
    if math.isinf(config.privacy.epsilon):
        return release(fixed_rules(
            plan.rules, lambda r: dpa.NonPrivateDpEvent() if r.mechanism != "no-op" else dpa.NoOpDpEvent()
        ), None)
    z = config.extractor.noise_multiplier
    if z is None:
        z = calibrate()
    return release(fixed_rules(plan.rules, lambda r: r.event(z)), z)


def check_plan_fits(
    accountant: AccountantClient, config: RunConfig, delta: float, roots: RootPlan, plan: ChargePlan, release: Release,
) -> None:
    """Refuse, before anything is sent, a run whose planned releases exceed the budget."""
    privacy = config.privacy
    estimate = accountant.estimate(
        release.rules, plan.passes(config.epochs, roots), delta, privacy.accounting, privacy.accountant
    )
    if estimate.epsilon > privacy.epsilon:
        z = "none" if release.noise_multiplier is None else f"{release.noise_multiplier:g}"
        raise BudgetRefused(
            f"the planned run ({estimate.counted_releases} counted releases at noise multiplier "
            f"{z}) needs epsilon {estimate.epsilon:.4g}, above the budget {privacy.epsilon:g}; nothing was sent"
        )
