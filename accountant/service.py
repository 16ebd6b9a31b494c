"""The accountant's gRPC service (``vesper.v1.Accountant``): a thin layer over :mod:`budget`.

Spending needs a credential, sent as the metadata ``authorization: Bearer <token>``, and
which one depends on whose data the ledger protects:

* party A's **charge token** for every run whose privacy unit is A's (``edge``, ``node``);
* party B's **label charge token** for runs of privacy unit ``label`` (B's label ledgers).

CreateRun checks the requested privacy unit; Charge and CloseRun look the run up and check
its unit (an unknown run is NOT_FOUND, once the token is one of the two). A token that is
neither is UNAUTHENTICATED; the other party's token is PERMISSION_DENIED, so neither party
can spend, or close, the other's ledger. Calibrate, Estimate and GetRun only read, so
either party (or any auditor) can call them without a token.

Under mutual TLS (``accountant.tls``) the spending call must also come with the spending
party's certificate (role ``party-a`` or ``party-b``, common/tls.py), else PERMISSION_DENIED.
"""

from __future__ import annotations

import hmac
import json
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

import grpc
from pydantic import ValidationError

from vesper.accountant.budget import Accountant, AccountantError
from vesper.common.config import describe_validation_error
from vesper.common.metrics import AccountantMetrics
from vesper.common.privacy.ledger import KINDS, LABEL_UNIT, LedgerRow, RunStatusView
from vesper.common.privacy.plan_messages import (
    passes_from_proto,
    plan_rules_from_proto,
    rule_to_proto,
    rules_from_proto,
)
from vesper.common.tls import require_role
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


PARTY_A, PARTY_B = "A", "B"
CREDENTIALS = {PARTY_A: "party A's charge token", PARTY_B: "party B's label charge token"}
# under mutual TLS the spender must also hold that party's certificate (defence in depth:
# a leaked token alone cannot spend); plaintext calls are checked by token only
SPENDER_ROLES = {PARTY_A: "party-a", PARTY_B: "party-b"}


def spender_of(privacy_unit: str) -> str:
    """Which party may spend a ledger of this privacy unit: B its labels, A everything else."""
    return PARTY_B if privacy_unit == LABEL_UNIT else PARTY_A


class AccountantService(pb_grpc.AccountantServicer):
    def __init__(
        self, accountant: Accountant, charge_token: str, label_charge_token: str,
        metrics: AccountantMetrics | None = None,
    ) -> None:
        """``metrics``: where charges, refusals, their latency and each run's ε are counted (None: nowhere)."""
        for name, token in (("charge token", charge_token), ("label charge token", label_charge_token)):
            if len(token) < 16:
                raise ValueError(f"the {name} must have at least 16 characters")
        if hmac.compare_digest(charge_token.encode(), label_charge_token.encode()):
            raise ValueError(
                "party A's charge token and party B's label charge token are the same: each party "
                "needs its own, or either could spend the other's ledger"
            )
        self.accountant = accountant
        self.metrics = metrics
        self._expected = {
            PARTY_A: f"Bearer {charge_token}".encode(),
            PARTY_B: f"Bearer {label_charge_token}".encode(),
        }

    def _status(self, view: RunStatusView) -> pb.RunStatus:
        """The run's status as the reply carries it; its ε and budget as the metrics show them."""
        if self.metrics is not None:
            self.metrics.run_status(view.run_id, view.epsilon_spent, view.epsilon_budget)
        return status_message(view)

    def _charge(self, request: pb.ChargeRequest) -> tuple[LedgerRow, bool]:
        """The ledger's charge, timed and counted: a new row, a retry, or a refusal (by its status)."""
        def charge() -> tuple[LedgerRow, bool]:
            return self.accountant.charge(
                request.run_id, request.release_key, request.pass_id, request.kind, request.num_nodes,
                request.nodes_digest, request.release_event_json, request.lease,
            )

        if self.metrics is None:
            return charge()
        started = time.perf_counter()
        try:
            row, replayed = charge()
        except AccountantError as exc:  # the run exists (checked first); a kind it does not know is "other"
            kind = request.kind if request.kind in KINDS else "other"
            self.metrics.refusals.labels(request.run_id, kind, exc.code).inc()
            raise
        finally:
            self.metrics.charge_seconds.observe(time.perf_counter() - started)
        (self.metrics.retries if replayed else self.metrics.charges).labels(row.run_id, row.kind).inc()
        return row, replayed

    @staticmethod
    def _call(context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except AccountantError as exc:
            context.abort(getattr(grpc.StatusCode, exc.code), str(exc))
        except sqlite3.OperationalError as exc:  # the ledger's disk: full, read-only, failing
            context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"the accountant cannot write its ledger ({exc}); nothing was recorded for this call. Fix the "
                "accountant's disk (accountant.ledger); party A waits and retries, then interrupts the run",
            )
        except ValidationError as exc:  # a pydantic model refused a field of the request: which, and why
            problems = describe_validation_error(exc).replace("\n", "; ")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid {exc.title} in the request: {problems}")
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc).splitlines()[0] if str(exc) else "invalid request")

    def _presenter(self, context: grpc.ServicerContext) -> str | None:
        """The party whose token the call carries, or None; both tokens are always compared."""
        presented = dict(context.invocation_metadata()).get("authorization", "").encode()
        matches = {party: hmac.compare_digest(presented, expected) for party, expected in self._expected.items()}
        return next((party for party, match in matches.items() if match), None)

    def _authenticate(self, context: grpc.ServicerContext, what: str) -> str:
        party = self._presenter(context)
        if party is None:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{what} needs a charge token (metadata 'authorization: Bearer <token>'): party A's "
                "charge token for its edge and node ledgers, party B's label charge token for its "
                "label ledgers; reading a budget needs neither",
            )
        return party  # type: ignore[return-value]

    def _authorize(self, context: grpc.ServicerContext, what: str, privacy_unit: str, presenter: str) -> None:
        needed = spender_of(privacy_unit)
        require_role(context, (SPENDER_ROLES[needed],), f"{what} (privacy unit {privacy_unit or 'unset'!r})")
        if presenter != needed:
            context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{what} (privacy unit {privacy_unit or 'unset'!r}) needs {CREDENTIALS[needed]}; "
                f"the call carries {CREDENTIALS[presenter]}, which cannot spend or close that ledger",
            )

    def _authorize_run(self, context: grpc.ServicerContext, what: str, run_id: str) -> None:
        presenter = self._authenticate(context, what)
        unit = self._call(context, lambda: self.accountant.privacy_unit(run_id))
        self._authorize(context, f"{what} of run {run_id!r}", unit, presenter)

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
        self._authorize(
            context, "creating a run", request.privacy_unit, self._authenticate(context, "creating a run")
        )
        try:
            details = json.loads(request.details_json) if request.details_json else {}
        except (json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"details_json is not JSON: {exc}")
        view = self._call(
            context,
            lambda: self.accountant.create_run(
                request.run_id, request.privacy_unit, request.accounting, request.accountant or "pld",
                request.epsilon_budget, request.delta, rules_from_proto(request.rules), request.extractor, details,
                request.assumption_note, request.lease, request.lease_ttl_s,
            ),
        )
        return self._status(view)

    def Charge(self, request: pb.ChargeRequest, context: grpc.ServicerContext) -> pb.ChargeReceipt:
        self._authorize_run(context, "charging a release", request.run_id)
        row, replayed = self._call(context, lambda: self._charge(request))
        view = self.accountant.status(request.run_id)
        self._status(view)
        return pb.ChargeReceipt(
            run_id=row.run_id, seq=row.seq, counted=row.counted, epsilon_spent=row.epsilon_after,
            epsilon_budget=view.epsilon_budget, replayed=replayed,
        )

    def GetRun(self, request: pb.GetRunRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        return self._status(self._call(context, lambda: self.accountant.status(request.run_id)))

    def CloseRun(self, request: pb.CloseRunRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        self._authorize_run(context, "closing", request.run_id)
        view = self._call(
            context, lambda: self.accountant.close_run(request.run_id, request.status, request.reason, request.lease)
        )
        return self._status(view)

    def ReopenRun(self, request: pb.ReopenRunRequest, context: grpc.ServicerContext) -> pb.RunStatus:
        self._authorize_run(context, "reopening", request.run_id)
        return self._status(self._call(context, lambda: self.accountant.reopen_run(
            request.run_id, request.reason, request.lease, request.lease_ttl_s,
        )))

    def AnnounceRun(self, request: pb.LeaseRequest, context: grpc.ServicerContext) -> pb.LeaseReply:
        """Party A's trainer announces a new run with its lease, before it sets the run up with B."""
        self._authorize(context, "announcing a run", "edge", self._authenticate(context, "announcing a run"))
        expires = self._call(context, lambda: self.accountant.announce_run(request.run_id, request.lease, request.ttl_s))
        return pb.LeaseReply(run_id=request.run_id, expires_in_s=expires)

    def RenewLease(self, request: pb.LeaseRequest, context: grpc.ServicerContext) -> pb.LeaseReply:
        self._authorize(context, "renewing a lease", "edge", self._authenticate(context, "renewing a lease"))
        expires = self._call(context, lambda: self.accountant.renew_lease(request.run_id, request.lease, request.ttl_s))
        return pb.LeaseReply(run_id=request.run_id, expires_in_s=expires)
