"""The accountant's client, used by both parties: party A charges its edge (or node)
ledger with its charge token, party B its label ledger with its own.

Every failure becomes a :class:`PeerError` that says which peer, at which address,
doing what, so a run ends with a message a user can act on. A refusal by the
accountant is a :class:`BudgetRefused`: the run ends cleanly, nothing is sent.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING

import grpc
import torch

from vesper.common.config import TlsConfig
from vesper.common.grpc_server import channel_options
from vesper.common.tls import open_channel
from vesper.proto.v1 import accountant_pb2 as acc_pb
from vesper.proto.v1 import accountant_pb2_grpc as acc_grpc

if TYPE_CHECKING:
    from vesper.common.privacy.ledger import ChargeRule, PlannedPass, PlanRule

# The privacy modules (dp-accounting, scipy: slow to import, docs/performance-notes.md) are imported by the calls that
# send rules, so that party B, which only charges when it protects its labels, starts fast.


def nodes_digest(node_ids: torch.Tensor) -> str:
    """What the accountant stores to recognise a retried charge as the same release."""
    return hashlib.sha256(node_ids.cpu().to(torch.int64).numpy().tobytes()).hexdigest()[:32]


class PeerError(RuntimeError):
    """A peer failed or answered something unusable."""


class PeerLost(PeerError):
    """A peer stopped answering (gone, unreachable, or silent past its timeout): the run
    is interrupted, not failed, and can be resumed from its last checkpoint."""

    def __init__(self, message: str, peer: str = "party B") -> None:
        super().__init__(message)
        self.peer = peer


class LeaseRefused(PeerError):
    """The accountant refused a call because another trainer holds the run (ABORTED)."""


class BudgetRefused(RuntimeError):
    """The accountant refused a charge: the budget cannot cover it."""


def describe_rpc_error(error: grpc.RpcError) -> str:
    return f"{error.code().name}: {error.details()}"


class AccountantClient:
    """Calls to the accountant; spending calls carry the caller's charge token.

    A charge that fails for a transient reason (the accountant restarting, a dropped
    connection) is retried with the same release key: the accountant recognises the
    retry and does not charge twice.

    ``channel``: an already-made channel to the accountant (e.g. ``coordinator.in_process``'s,
    which calls the accountant's servicer without a network); by default one to
    ``address``. Either way the client owns it and closes it.
    """

    RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    # Calibrating a plan is a search over ε(z); a mixture-of-Gaussians plan builds several
    # PLDs point by point (docs/accounting.md) and can take minutes on a loaded host.
    PLAN_TIMEOUT_S = 600.0

    def __init__(
        self, address: str, charge_token: str | None, timeout_s: float = 30.0, charge_retries: int = 5,
        token_hint: str = "party A has no charge token for the accountant at {address} (set "
        "party_a.accountant_token_file to a copy of the accountant's charge token file)",
        channel: grpc.Channel | None = None, retry_s: float | None = None, tls: TlsConfig | None = None,
        tls_setting: str = "party_a.tls",
    ) -> None:
        """``retry_s``: retry the idempotent spending calls (charge, close, reopen) on transient
        errors for this long, with backoff, instead of ``charge_retries`` times (party A
        waits out an accountant that restarts)."""
        self.address = address
        self.token_hint = token_hint
        self.timeout_s = timeout_s
        self.charge_retries = charge_retries
        self.retry_s = retry_s
        self._metadata = (("authorization", f"Bearer {charge_token}"),) if charge_token else ()
        # tls: this party's mutual-TLS settings (common/tls.py), configured at tls_setting; None = plaintext
        self._channel = (
            channel if channel is not None else open_channel(address, tls, channel_options(16), setting=tls_setting)
        )
        self._stub = acc_grpc.AccountantStub(self._channel)
        # the lease of the trainer this client charges for (party A; accountant/leases.py): "" = none
        self.lease = ""
        self.lease_ttl_s = 0.0

    def hold(self, lease: str, ttl_s: float) -> None:
        """Make every spending call under ``lease``, which the accountant keeps ``ttl_s`` between renewals."""
        self.lease, self.lease_ttl_s = lease, ttl_s

    @property
    def channel(self) -> grpc.Channel:
        """The channel to the accountant (the benchmarks time other calls over the same one)."""
        return self._channel

    def close(self) -> None:
        self._channel.close()

    def _call(self, what: str, method, request, *, spend: bool = False, retries: int = 0, timeout_s: float | None = None):
        if spend and not self._metadata:
            raise PeerError(f"cannot {what}: {self.token_hint.format(address=self.address)}")
        deadline = time.monotonic() + self.retry_s if retries and self.retry_s is not None else None
        attempt = 0
        while True:
            try:
                return method(request, timeout=timeout_s or self.timeout_s, metadata=self._metadata if spend else ())
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise BudgetRefused(error.details()) from None
                if error.code() == grpc.StatusCode.ABORTED:
                    raise LeaseRefused(f"the accountant refused to {what}: {error.details()}") from None
                pause = min(0.2 * 2**attempt, 2.0 if deadline is not None else 5.0)
                again = attempt < retries if deadline is None else time.monotonic() + pause < deadline
                if error.code() in self.RETRIED and again:
                    time.sleep(pause)
                    attempt += 1
                    continue
                waited = f" (retried {attempt} times)" if attempt else ""
                message = f"accountant at {self.address} failed to {what}{waited}: {describe_rpc_error(error)}"
                if error.code() in self.RETRIED:
                    raise PeerLost(message, peer="accountant") from None
                raise PeerError(message) from None

    def calibrate(
        self, passes: list[PlannedPass], rules: list[PlanRule], target_epsilon: float, delta: float,
        accounting: str, accountant: str,
    ) -> acc_pb.CalibrateReply:
        from vesper.common.privacy.plan_messages import passes_to_proto, plan_rule_to_proto

        plan = acc_pb.ReleasePlan(passes=passes_to_proto(passes), rules=[plan_rule_to_proto(r) for r in rules])
        request = acc_pb.CalibrateRequest(
            mechanism="gaussian", plan=plan,
            target_epsilon=target_epsilon, delta=delta, accounting=accounting, accountant=accountant,
        )
        return self._call("calibrate the noise", self._stub.Calibrate, request, timeout_s=self.PLAN_TIMEOUT_S)

    def estimate(
        self, rules: list[ChargeRule], passes: list[PlannedPass], delta: float, accounting: str, accountant: str
    ) -> acc_pb.EstimateReply:
        from vesper.common.privacy.plan_messages import passes_to_proto, rule_to_proto

        request = acc_pb.EstimateRequest(
            rules=[rule_to_proto(r) for r in rules], passes=passes_to_proto(passes), delta=delta,
            accounting=accounting, accountant=accountant,
        )
        return self._call("estimate the plan's epsilon", self._stub.Estimate, request, timeout_s=self.PLAN_TIMEOUT_S)

    def create_run(
        self, run_id: str, epsilon_budget: float, delta: float, rules: list[ChargeRule], extractor: str,
        accounting: str, accountant: str, details: dict, assumption_note: str = "", privacy_unit: str = "edge",
    ) -> acc_pb.RunStatus:
        from vesper.common.privacy.plan_messages import rule_to_proto

        request = acc_pb.CreateRunRequest(
            run_id=run_id, privacy_unit=privacy_unit, accounting=accounting, accountant=accountant,
            epsilon_budget=epsilon_budget, delta=delta, rules=[rule_to_proto(r) for r in rules],
            extractor=extractor, details_json=json.dumps(details), assumption_note=assumption_note,
            lease=self.lease, lease_ttl_s=self.lease_ttl_s,
        )
        return self._call("create the run", self._stub.CreateRun, request, spend=True)

    def announce_run(self, run_id: str) -> acc_pb.LeaseReply:
        """Before party A sets the run up with B: the run's id, under this client's lease."""
        request = acc_pb.LeaseRequest(run_id=run_id, lease=self.lease, ttl_s=self.lease_ttl_s)
        return self._call("announce the run", self._stub.AnnounceRun, request, spend=True, retries=self.charge_retries)

    def renew_lease(self, run_id: str) -> acc_pb.LeaseReply:
        request = acc_pb.LeaseRequest(run_id=run_id, lease=self.lease, ttl_s=self.lease_ttl_s)
        return self._call("renew the run's lease", self._stub.RenewLease, request, spend=True)

    def charge(
        self, run_id: str, release_key: str, pass_id: str, kind: str, num_nodes: int, nodes_digest: str,
        release_event_json: str,
    ) -> acc_pb.ChargeReceipt:
        request = acc_pb.ChargeRequest(
            run_id=run_id, release_key=release_key, pass_id=pass_id, kind=kind, num_nodes=num_nodes,
            nodes_digest=nodes_digest, release_event_json=release_event_json, lease=self.lease,
        )
        return self._call(
            f"charge release {release_key}", self._stub.Charge, request, spend=True, retries=self.charge_retries
        )

    def get_run(self, run_id: str) -> acc_pb.RunStatus:
        return self._call(
            f"read run {run_id}", self._stub.GetRun, acc_pb.GetRunRequest(run_id=run_id), retries=self.charge_retries
        )

    def reopen_run(self, run_id: str, reason: str) -> acc_pb.RunStatus:
        request = acc_pb.ReopenRunRequest(run_id=run_id, reason=reason, lease=self.lease, lease_ttl_s=self.lease_ttl_s)
        return self._call("reopen the run", self._stub.ReopenRun, request, spend=True, retries=self.charge_retries)

    def close_run(self, run_id: str, status: str, reason: str) -> acc_pb.RunStatus:
        request = acc_pb.CloseRunRequest(run_id=run_id, status=status, reason=reason, lease=self.lease)
        return self._call("close the run", self._stub.CloseRun, request, spend=True, retries=self.charge_retries)
