"""The accountant's gRPC service (``vesper.v1.Accountant``): a thin layer over :mod:`budget`.

Spending needs party A's credential: CreateRun, Charge and CloseRun require the
metadata ``authorization: Bearer <charge token>``. Calibrate, Estimate and GetRun
only read, so party B (or any auditor) can call them without it.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import TypeVar

import grpc

from vesper.accountant.budget import Accountant, AccountantError
from vesper.common.privacy.ledger import RunStatusView
from vesper.common.privacy.plan_messages import (
    passes_from_proto,
    plan_rules_from_proto,
    rule_to_proto,
    rules_from_proto,
)
from vesper.proto.v1 import accountant_pb2 as pb
from vesper.proto.v1 import accountant_pb2_grpc as pb_grpc

T = TypeVar("T")


def status_message(view: RunStatusView) -> pb.RunStatus:
    message = pb.RunStatus(
        run_id=view.run_id, status=view.status, epsilon_budget=view.epsilon_budget,
        epsilon_spent=view.epsilon_spent, delta=view.delta, accounting=view.accounting,
        assumption=view.assumption, charges=view.charges, counted_charges=view.counted_charges,
        accountant=view.accountant,
    )
    if view.accounting == "hidden-batch":
        message.epsilon_events = view.epsilon_events
        if view.epsilon_bound6 is not None:
            message.epsilon_bound6 = view.epsilon_bound6
    return message


class AccountantService(pb_grpc.AccountantServicer):
    def __init__(self, accountant: Accountant, charge_token: str) -> None:
        if len(charge_token) < 16:
            raise ValueError("the charge token must have at least 16 characters")
        self.accountant = accountant
        self._expected = f"Bearer {charge_token}".encode()

    @staticmethod
    def _call(context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except AccountantError as exc:
            context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
        except ValueError as exc:  # a pydantic model refused a field of the request
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc).splitlines()[0] if str(exc) else "invalid request")

    def _authorize(self, context: grpc.ServicerContext, what: str) -> None:
        presented = dict(context.invocation_metadata()).get("authorization", "")
        if not hmac.compare_digest(presented.encode(), self._expected):
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{what} needs party A's charge token (metadata 'authorization: Bearer <token>'); "
                "reading a budget does not",
            )

    def Calibrate(self, request: pb.CalibrateRequest, context: grpc.ServicerContext) -> pb.CalibrateReply:
        if request.mechanism != "gaussian":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown mechanism {request.mechanism!r}; expected gaussian")
        z, result, rules, counted = self._call(
            context,
            lambda: self.accountant.calibrate_gaussian(
                passes_from_proto(request.plan.passes), plan_rules_from_proto(request.plan.rules), request.target_epsilon,
                request.delta, request.accounting or "visible-batch", request.accountant or "pld",
            ),
        )
        return pb.CalibrateReply(
            noise_multiplier=z, epsilon=result.epsilon, accountant=result.accountant,
            rules=[rule_to_proto(rule) for rule in rules], counted_releases=counted,
        )

    def Estimate(self, request: pb.EstimateRequest, context: grpc.ServicerContext) -> pb.EstimateReply:
        result, counted = self._call(
            context,
            lambda: self.accountant.estimate(
                rules_from_proto(request.rules), passes_from_proto(request.passes), request.delta,
                request.accounting or "visible-batch", request.accountant or "pld",
            ),
        )
        return pb.EstimateReply(epsilon=result.epsilon, accountant=result.accountant, counted_releases=counted)

    def CreateRun(self, request: pb.CreateRunRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        self._authorize(context, "creating a run")
        try:
            details = json.loads(request.details_json) if request.details_json else {}
        except json.JSONDecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"details_json is not JSON: {exc}")
        view = self._call(
            context,
            lambda: self.accountant.create_run(
                request.run_id, request.privacy_unit, request.accounting, request.accountant or "pld",
                request.epsilon_budget, request.delta, rules_from_proto(request.rules), request.extractor, details,
                request.assumption_note,
            ),
        )
        return status_message(view)

    def Charge(self, request: pb.ChargeRequest, context: grpc.ServicerContext) -> pb.ChargeReceipt:
        self._authorize(context, "charging a release")
        row, replayed = self._call(
            context,
            lambda: self.accountant.charge(
                request.run_id, request.release_key, request.pass_id, request.kind, request.num_nodes,
                request.nodes_digest, request.release_event_json,
            ),
        )
        view = self.accountant.status(request.run_id)
        return pb.ChargeReceipt(
            run_id=row.run_id, seq=row.seq, counted=row.counted, epsilon_spent=row.epsilon_after,
            epsilon_budget=view.epsilon_budget, replayed=replayed,
        )

    def GetRun(self, request: pb.GetRunRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        return status_message(self._call(context, lambda: self.accountant.status(request.run_id)))

    def CloseRun(self, request: pb.CloseRunRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        self._authorize(context, "closing a run")
        view = self._call(context, lambda: self.accountant.close_run(request.run_id, request.status, request.reason))
        return status_message(view)
