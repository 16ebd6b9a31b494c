"""Party A's clients for its two peers: party B (labels) and the accountant.

Every failure of a peer becomes a :class:`PeerError` that says which peer, at which
address, doing what, so the run ends with a message a user can act on. A refusal by
the accountant is a :class:`BudgetRefused`: the run ends cleanly, nothing is sent.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator

import grpc

from vesper.common.grpc_server import channel_options
from vesper.common.privacy.ledger import ChargeRule, PlannedPass, PlanRule
from vesper.common.privacy.plan_messages import passes_to_proto, plan_rule_to_proto, rule_to_proto
from vesper.proto.v1 import accountant_pb2 as acc_pb
from vesper.proto.v1 import accountant_pb2_grpc as acc_grpc
from vesper.proto.v1 import label_party_pb2 as lp_pb
from vesper.proto.v1 import label_party_pb2_grpc as lp_grpc


class PeerError(RuntimeError):
    """A peer failed or answered something unusable."""


class BudgetRefused(RuntimeError):
    """The accountant refused a charge: the budget cannot cover it."""


def _describe(error: grpc.RpcError) -> str:
    return f"{error.code().name}: {error.details()}"


class AccountantClient:
    """Party A's calls to the accountant; spending calls carry A's charge token.

    A charge that fails for a transient reason (the accountant restarting, a dropped
    connection) is retried with the same release key: the accountant recognises the
    retry and does not charge twice.
    """

    RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    # Calibrating a plan is a search over ε(z); a mixture-of-Gaussians plan builds several
    # PLDs point by point (docs/accounting.md) and can take minutes on a loaded host.
    PLAN_TIMEOUT_S = 600.0

    def __init__(
        self, address: str, charge_token: str | None, timeout_s: float = 30.0, charge_retries: int = 5
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.charge_retries = charge_retries
        self._metadata = (("authorization", f"Bearer {charge_token}"),) if charge_token else ()
        self._channel = grpc.insecure_channel(address, options=channel_options(16))
        self._stub = acc_grpc.AccountantStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _call(self, what: str, method, request, *, spend: bool = False, retries: int = 0, timeout_s: float | None = None):
        if spend and not self._metadata:
            raise PeerError(
                f"cannot {what}: party A has no charge token for the accountant at {self.address} "
                "(set party_a.accountant_token_file to a copy of the accountant's charge token file)"
            )
        for attempt in range(retries + 1):
            try:
                return method(request, timeout=timeout_s or self.timeout_s, metadata=self._metadata if spend else ())
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise BudgetRefused(error.details()) from None
                if error.code() in self.RETRIED and attempt < retries:
                    time.sleep(min(0.2 * 2**attempt, 5.0))
                    continue
                raise PeerError(f"accountant at {self.address} failed to {what}: {_describe(error)}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def calibrate(
        self, passes: list[PlannedPass], rules: list[PlanRule], target_epsilon: float, delta: float,
        accounting: str, accountant: str,
    ) -> acc_pb.CalibrateReply:
        plan = acc_pb.ReleasePlan(passes=passes_to_proto(passes), rules=[plan_rule_to_proto(r) for r in rules])
        request = acc_pb.CalibrateRequest(
            mechanism="gaussian", plan=plan,
            target_epsilon=target_epsilon, delta=delta, accounting=accounting, accountant=accountant,
        )
        return self._call("calibrate the noise", self._stub.Calibrate, request, timeout_s=self.PLAN_TIMEOUT_S)

    def estimate(
        self, rules: list[ChargeRule], passes: list[PlannedPass], delta: float, accounting: str, accountant: str
    ) -> acc_pb.EstimateReply:
        request = acc_pb.EstimateRequest(
            rules=[rule_to_proto(r) for r in rules], passes=passes_to_proto(passes), delta=delta,
            accounting=accounting, accountant=accountant,
        )
        return self._call("estimate the plan's epsilon", self._stub.Estimate, request, timeout_s=self.PLAN_TIMEOUT_S)

    def create_run(
        self, run_id: str, epsilon_budget: float, delta: float, rules: list[ChargeRule], extractor: str,
        accounting: str, accountant: str, details: dict, assumption_note: str = "", privacy_unit: str = "edge",
    ) -> acc_pb.RunStatus:
        request = acc_pb.CreateRunRequest(
            run_id=run_id, privacy_unit=privacy_unit, accounting=accounting, accountant=accountant,
            epsilon_budget=epsilon_budget, delta=delta, rules=[rule_to_proto(r) for r in rules],
            extractor=extractor, details_json=json.dumps(details), assumption_note=assumption_note,
        )
        return self._call("create the run", self._stub.CreateRun, request, spend=True)

    def charge(
        self, run_id: str, release_key: str, pass_id: str, kind: str, num_nodes: int, nodes_digest: str,
        release_event_json: str,
    ) -> acc_pb.ChargeReceipt:
        request = acc_pb.ChargeRequest(
            run_id=run_id, release_key=release_key, pass_id=pass_id, kind=kind, num_nodes=num_nodes,
            nodes_digest=nodes_digest, release_event_json=release_event_json,
        )
        return self._call(
            f"charge release {release_key}", self._stub.Charge, request, spend=True, retries=self.charge_retries
        )

    def close_run(self, run_id: str, status: str, reason: str) -> acc_pb.RunStatus:
        request = acc_pb.CloseRunRequest(run_id=run_id, status=status, reason=reason)
        return self._call("close the run", self._stub.CloseRun, request, spend=True, retries=self.charge_retries)


class _Outbox:
    """Messages for a client stream, put by A's thread and consumed by gRPC's."""

    _CLOSE = object()

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()

    def put(self, message: object) -> None:
        self._queue.put(message)

    def close(self) -> None:
        self._queue.put(self._CLOSE)

    def __iter__(self) -> Iterator:
        while (item := self._queue.get()) is not self._CLOSE:
            yield item


class TrainingStream:
    """One training stream to B, in lockstep: send a step, wait for its reply.

    Replies are read by a thread so that a silent B is noticed after ``timeout_s``.
    """

    def __init__(self, stub: lp_grpc.LabelPartyStub, address: str, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._requests = _Outbox()
        self._replies: queue.Queue = queue.Queue()
        self._call = stub.Train(iter(self._requests))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                self._replies.put(reply)
            self._replies.put(PeerError(f"party B at {self.address} closed the training stream"))
        except grpc.RpcError as error:
            self._replies.put(error)

    def exchange(self, request: lp_pb.TrainStep) -> lp_pb.TrainStepReply:
        self._requests.put(request)
        try:
            reply = self._replies.get(timeout=self.timeout_s)
        except queue.Empty:
            self._call.cancel()
            raise PeerError(
                f"party B at {self.address} did not answer step {request.step} within {self.timeout_s:g} s"
            ) from None
        if isinstance(reply, grpc.RpcError):
            if reply.code() == grpc.StatusCode.UNAVAILABLE:
                raise PeerError(
                    f"party B at {self.address} vanished during step {request.step} ({_describe(reply)})"
                )
            raise PeerError(f"party B at {self.address} rejected step {request.step}: {_describe(reply)}")
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        self._requests.close()
        self._reader.join(timeout=self.timeout_s)
        if self._reader.is_alive():
            self._call.cancel()


class EvaluationStream:
    """Evaluation chunks to B: A's thread charges each chunk, then hands it over here."""

    def __init__(self, stub: lp_grpc.LabelPartyStub, address: str, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._requests = _Outbox()
        self._future = stub.Evaluate.future(iter(self._requests))

    def send(self, chunk: lp_pb.EvalChunk) -> None:
        if self._future.done():
            self.result()  # raises B's error
        self._requests.put(chunk)

    def result(self) -> lp_pb.EvalResult:
        self._requests.close()
        try:
            return self._future.result(timeout=self.timeout_s)
        except grpc.FutureTimeoutError:
            self._future.cancel()
            raise PeerError(f"party B at {self.address} did not finish the evaluation within {self.timeout_s:g} s") from None
        except grpc.RpcError as error:
            raise PeerError(f"party B at {self.address} failed the evaluation: {_describe(error)}") from None

    def cancel(self) -> None:
        self._requests.close()
        self._future.cancel()


class LabelPartyClient:
    def __init__(self, address: str, max_message_mb: int, timeout_s: float) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address, options=channel_options(max_message_mb))
        self._stub = lp_grpc.LabelPartyStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def setup(self, request: lp_pb.SetupRunRequest) -> lp_pb.SetupRunReply:
        try:
            return self._stub.SetupRun(request, timeout=self.timeout_s)
        except grpc.RpcError as error:
            raise PeerError(f"party B at {self.address} refused the run set-up: {_describe(error)}") from None

    def training(self) -> TrainingStream:
        return TrainingStream(self._stub, self.address, self.timeout_s)

    def evaluation(self) -> EvaluationStream:
        return EvaluationStream(self._stub, self.address, self.timeout_s)

    def finish(self, run_id: str, status: str, reason: str) -> None:
        """Best effort: B may be the reason the run ended."""
        try:
            self._stub.FinishRun(lp_pb.FinishRunRequest(run_id=run_id, status=status, reason=reason), timeout=10)
        except grpc.RpcError:
            pass
