"""Charge rules and release plans as accountant protobuf messages, and back.

Party A writes these messages and the accountant reads them; one module keeps both
sides' reading of ``proto/v1/accountant.proto`` the same.
"""

from __future__ import annotations

from collections.abc import Iterable

from vesper.common.privacy.ledger import ChargeRule, PlannedPass, PlanRule
from vesper.proto.v1 import accountant_pb2 as pb


def _optional(message: object, name: str) -> int | None:
    return getattr(message, name) if message.HasField(name) else None


def rule_to_proto(rule: ChargeRule) -> pb.ChargeRule:
    message = pb.ChargeRule(kind=rule.kind, release_event_json=rule.release_event)
    if rule.participation_bound is not None:
        message.participation_bound = rule.participation_bound
    return message


def rules_from_proto(messages: Iterable[pb.ChargeRule]) -> list[ChargeRule]:
    return [
        ChargeRule(kind=m.kind, release_event=m.release_event_json, participation_bound=_optional(m, "participation_bound"))
        for m in messages
    ]


def plan_rule_to_proto(rule: PlanRule) -> pb.PlanRule:
    message = pb.PlanRule(
        kind=rule.kind, sampling_probability=rule.sampling_probability, noise_scale=rule.noise_scale,
        mechanism=rule.mechanism, sensitivities=rule.sensitivities, sampling_probs=rule.sampling_probs,
        repeats=rule.repeats,
    )
    if rule.participation_bound is not None:
        message.participation_bound = rule.participation_bound
    return message


def plan_rules_from_proto(messages: Iterable[pb.PlanRule]) -> list[PlanRule]:
    # proto3 reads an unset double as 0: absent means "no sampling" and "the run's z"
    return [
        PlanRule(
            kind=m.kind, participation_bound=_optional(m, "participation_bound"),
            sampling_probability=m.sampling_probability or 1.0, noise_scale=m.noise_scale or 1.0,
            mechanism=m.mechanism or "gaussian", sensitivities=list(m.sensitivities),
            sampling_probs=list(m.sampling_probs), repeats=m.repeats or 1,
        )
        for m in messages
    ]


def passes_to_proto(passes: Iterable[PlannedPass]) -> list[pb.PlannedPass]:
    return [pb.PlannedPass(kind=p.kind, releases=p.releases) for p in passes]


def passes_from_proto(messages: Iterable[pb.PlannedPass]) -> list[PlannedPass]:
    return [PlannedPass(kind=m.kind, releases=m.releases) for m in messages]
