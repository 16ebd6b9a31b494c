"""Party A's clients for its two peers: party B (labels) and the accountant
(:mod:`vesper.common.accountant_client`, shared with party B).

Every failure of a peer becomes a :class:`PeerError` that says which peer, at which
address, doing what, so the run ends with a message a user can act on.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator

import grpc

from vesper.common.accountant_client import (
    AccountantClient,
    BudgetRefused,
    LeaseRefused,
    PeerError,
    PeerLost,
    describe_rpc_error,
)
from vesper.common.config import TlsConfig
from vesper.common.grpc_server import channel_options
from vesper.common.tls import open_channel
from vesper.proto.v1 import label_party_pb2 as lp_pb
from vesper.proto.v1 import label_party_pb2_grpc as lp_grpc

log = logging.getLogger(__name__)

__all__ = [
    "AccountantClient", "BudgetRefused", "EvaluationStream", "LabelPartyClient", "LeaseRefused", "PeerError", "PeerLost",
    "TrainingStream",
]


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
            self._replies.put(PeerLost(f"party B at {self.address} closed the training stream"))
        except grpc.RpcError as error:
            self._replies.put(error)

    def exchange(self, request: lp_pb.TrainStep) -> lp_pb.TrainStepReply:
        self.send(request)
        return self.receive(request.step)

    def send(self, request: lp_pb.TrainStep) -> None:
        """Hand a step to gRPC's thread and return at once: A may work (e.g. sample the next
        step) while B computes; :meth:`receive` then waits for B's answer."""
        self._requests.put(request)

    def receive(self, step: int) -> lp_pb.TrainStepReply:
        """B's answer to the step sent last, or the PeerError/PeerLost that replaced it."""
        try:
            reply = self._replies.get(timeout=self.timeout_s)
        except queue.Empty:
            self._call.cancel()
            raise PeerLost(
                f"party B at {self.address} did not answer step {step} within {self.timeout_s:g} s"
            ) from None
        if isinstance(reply, grpc.RpcError):
            if reply.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise PeerLost(
                    f"party B at {self.address} vanished during step {step} ({describe_rpc_error(reply)})"
                )
            raise PeerError(f"party B at {self.address} rejected step {step}: {describe_rpc_error(reply)}")
        if isinstance(reply, Exception):
            raise reply
        return reply

    def close(self) -> None:
        self._requests.close()
        self._reader.join(timeout=self.timeout_s)
        if self._reader.is_alive():
            self._call.cancel()


class EvaluationStream:
    """Evaluation (or, under pate, collection) chunks to B: A's thread charges each chunk,
    then hands it over here; B answers once at the end."""

    def __init__(self, method, address: str, timeout_s: float, what: str = "the evaluation") -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.what = what
        self._requests = _Outbox()
        self._future = method.future(iter(self._requests))

    def send(self, chunk: lp_pb.EvalChunk) -> None:
        if self._future.done():
            self.result()  # raises B's error
        self._requests.put(chunk)

    def result(self):
        self._requests.close()
        try:
            return self._future.result(timeout=self.timeout_s)
        except grpc.FutureTimeoutError:
            self._future.cancel()
            raise PeerLost(f"party B at {self.address} did not finish {self.what} within {self.timeout_s:g} s") from None
        except grpc.RpcError as error:
            lost = error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
            raise (PeerLost if lost else PeerError)(
                f"party B at {self.address} failed {self.what}: {describe_rpc_error(error)}"
            ) from None

    def cancel(self) -> None:
        self._requests.close()
        self._future.cancel()


class LabelPartyClient:
    """Party A's calls to party B.

    ``channel``: an already-made channel to B (e.g. ``coordinator.in_process``'s, which
    calls B's servicer without a network); by default one to ``address``. Either way
    the client owns it and closes it.
    """

    def __init__(
        self, address: str, max_message_mb: int, timeout_s: float, channel: grpc.Channel | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        if channel is None:
            channel = open_channel(address, tls, channel_options(max_message_mb), setting="party_a.tls")
        self._channel = channel
        self._stub = lp_grpc.LabelPartyStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def setup(self, request: lp_pb.SetupRunRequest) -> lp_pb.SetupRunReply:
        try:
            return self._stub.SetupRun(request, timeout=self.timeout_s)
        except grpc.RpcError as error:
            lost = error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            raise (PeerLost if lost else PeerError)(
                f"party B at {self.address} refused the run set-up: {describe_rpc_error(error)}"
            ) from None

    def training(self) -> TrainingStream:
        return TrainingStream(self._stub, self.address, self.timeout_s)

    def evaluation(self) -> EvaluationStream:
        return EvaluationStream(self._stub.Evaluate, self.address, self.timeout_s)

    def collection(self) -> EvaluationStream:
        """pate: embeddings for B's teachers; B answers with the answered queries."""
        return EvaluationStream(self._stub.Collect, self.address, self.timeout_s, "the teachers' queries")

    def prediction(self) -> EvaluationStream:
        """A prediction pass: every node's embeddings; B keeps its class probabilities."""
        return EvaluationStream(self._stub.Predict, self.address, self.timeout_s, "the prediction pass")

    def align_exchange(self, points: Iterator[lp_pb.AlignPoints], timeout_s: float) -> Iterator[lp_pb.AlignPoints]:
        """Round 1 of the PSI (docs/alignment.md): A's blinded keys out, B's answers back."""
        try:
            yield from self._stub.AlignExchange(points, timeout=timeout_s)
        except grpc.RpcError as error:
            raise self._alignment_error(error) from None

    def align_finish(self, points: Iterator[lp_pb.AlignPoints], timeout_s: float) -> lp_pb.AlignSummary:
        """Round 2: V blinded by A's secret; B answers with the intersection's size."""
        try:
            return self._stub.AlignFinish(points, timeout=timeout_s)
        except grpc.RpcError as error:
            raise self._alignment_error(error) from None

    def _alignment_error(self, error: grpc.RpcError) -> PeerError:
        lost = error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        return (PeerLost if lost else PeerError)(f"party B at {self.address} failed the alignment: {describe_rpc_error(error)}")

    def finish(self, run_id: str, status: str, reason: str, edge_free_head_to: str = "") -> None:
        """Best effort: B may be the reason the run ended. ``edge_free_head_to``: the session whose
        edge-free head starts from this (stage) session's decoder (FinishRunRequest)."""
        try:
            self._stub.FinishRun(lp_pb.FinishRunRequest(
                run_id=run_id, status=status, reason=reason, edge_free_head_to=edge_free_head_to,
            ), timeout=10)
        except grpc.RpcError as exc:
            if edge_free_head_to:  # the run goes on, its edge-free head starting afresh at B
                log.warning("session %s: party B did not hand its decoder to %s: %s", run_id, edge_free_head_to,
                            describe_rpc_error(exc))
