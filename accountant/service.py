"""The accountant's gRPC service (``vesper.v1.Accountant``): a thin layer over :mod:`budget`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

import dp_accounting as dpa
import grpc

from vesper.accountant.budget import Accountant, AccountantError
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import RunStatusView
from vesper.proto.v1 import accountant_pb2 as pb
from vesper.proto.v1 import accountant_pb2_grpc as pb_grpc

T = TypeVar("T")


def _bound(plan_or_request: object) -> int | None:
    return plan_or_request.participation_bound if plan_or_request.HasField("participation_bound") else None


def status_message(view: RunStatusView) -> pb.RunStatus:
    return pb.RunStatus(
        run_id=view.run_id, status=view.status, epsilon_budget=view.epsilon_budget,
        epsilon_spent=view.epsilon_spent, delta=view.delta, accounting=view.accounting,
        assumption=view.assumption, charges=view.charges, counted_charges=view.counted_charges,
        accountant=view.accountant,
    )


class AccountantService(pb_grpc.AccountantServicer):
    def __init__(self, accountant: Accountant) -> None:
        self.accountant = accountant

    @staticmethod
    def _call(context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except AccountantError as exc:
            context.abort(getattr(grpc.StatusCode, exc.code), str(exc))

    def Calibrate(self, request: pb.CalibrateRequest, context: grpc.ServicerContext) -> pb.CalibrateReply:
        if request.mechanism != "gaussian":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown mechanism {request.mechanism!r}; expected gaussian")
        z, result, counted = self._call(
            context,
            lambda: self.accountant.calibrate_gaussian(
                list(request.plan.pass_sizes), _bound(request.plan), request.target_epsilon, request.delta
            ),
        )
        return pb.CalibrateReply(
            noise_multiplier=z, epsilon=result.epsilon, accountant=result.accountant,
            release_event_json=event_to_json(dpa.GaussianDpEvent(z)), counted_releases=counted,
        )

    def Estimate(self, request: pb.EstimateRequest, context: grpc.ServicerContext) -> pb.EstimateReply:
        result, counted = self._call(
            context,
            lambda: self.accountant.estimate(
                request.release_event_json, list(request.plan.pass_sizes), _bound(request.plan), request.delta
            ),
        )
        return pb.EstimateReply(epsilon=result.epsilon, accountant=result.accountant, counted_releases=counted)

    def CreateRun(self, request: pb.CreateRunRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        try:
            details = json.loads(request.details_json) if request.details_json else {}
        except json.JSONDecodeError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"details_json is not JSON: {exc}")
        view = self._call(
            context,
            lambda: self.accountant.create_run(
                request.run_id, request.privacy_unit, request.accounting, request.epsilon_budget,
                request.delta, request.release_event_json, _bound(request), request.extractor, details,
            ),
        )
        return status_message(view)

    def Charge(self, request: pb.ChargeRequest, context: grpc.ServicerContext) -> pb.ChargeReceipt:
        row = self._call(
            context,
            lambda: self.accountant.charge(
                request.run_id, request.seq, request.pass_id, request.kind, request.num_nodes,
                request.release_event_json,
            ),
        )
        view = self.accountant.status(request.run_id)
        return pb.ChargeReceipt(
            run_id=row.run_id, seq=row.seq, counted=row.counted, epsilon_spent=row.epsilon_after,
            epsilon_budget=view.epsilon_budget,
        )

    def GetRun(self, request: pb.GetRunRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        return status_message(self._call(context, lambda: self.accountant.status(request.run_id)))

    def CloseRun(self, request: pb.CloseRunRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        view = self._call(context, lambda: self.accountant.close_run(request.run_id, request.status, request.reason))
        return status_message(view)
