"""Party B's gRPC service (``vesper.v1.LabelParty``): a thin servicer over the handler.

Each RPC is one call on ``party_b.handler.LabelParty``; the handler raises typed errors
(party_b/errors.py) and ``_statuses`` maps them to gRPC status codes, here and nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from vesper.common.config import PartyBConfig
from vesper.common.grpc_server import start_server, wait_for_signal, write_ready_file
from vesper.common.metrics import PartyBMetrics, start_metrics
from vesper.common.torch_threads import apply_torch_threads
from vesper.common.writable import check_writable_dir, check_writable_file_dir
from vesper.party_b import errors
from vesper.party_b.handler import LabelParty
from vesper.proto.v1 import label_party_pb2 as pb
from vesper.proto.v1 import label_party_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

STATUS: dict[type[errors.LabelPartyError], grpc.StatusCode] = {
    errors.BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.UnknownRun: grpc.StatusCode.NOT_FOUND,
    errors.AlreadySetUp: grpc.StatusCode.ALREADY_EXISTS,
    errors.Refused: grpc.StatusCode.FAILED_PRECONDITION,
    errors.OutOfBudget: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.Unavailable: grpc.StatusCode.UNAVAILABLE,
}


@contextmanager
def _statuses(context: grpc.ServicerContext) -> Iterator[None]:
    """The handler's refusals as the call's status; anything else is a crash (INTERNAL, logged by gRPC)."""
    try:
        yield
    except errors.LabelPartyError as exc:
        context.abort(STATUS[type(exc)], str(exc))


class LabelPartyService(pb_grpc.LabelPartyServicer):
    def __init__(
        self, config: PartyBConfig, accountant_channel: grpc.Channel | None = None, metrics: PartyBMetrics | None = None,
    ) -> None:
        """``accountant_channel``: a channel to the accountant instead of one B opens itself
        (the in-process mode's, coordinator/in_process.py); ``metrics``: the service's /metrics."""
        self.handler = LabelParty(config, accountant_channel, metrics)

    def SetupRun(self, request: pb.SetupRunRequest, context: grpc.ServicerContext) -> pb.SetupRunReply:
        with _statuses(context):
            return self.handler.setup_run(request)

    def Train(self, request_iterator: Iterator[pb.TrainStep], context: grpc.ServicerContext) -> Iterator[pb.TrainStepReply]:
        with _statuses(context):
            yield from self.handler.train(request_iterator)

    def Evaluate(self, request_iterator: Iterator[pb.EvalChunk], context: grpc.ServicerContext) -> pb.EvalResult:
        with _statuses(context):
            return self.handler.evaluate(request_iterator)

    def Collect(self, request_iterator: Iterator[pb.EvalChunk], context: grpc.ServicerContext) -> pb.CollectReply:
        """pate: A's frozen embeddings of B's labelled nodes and of the queries, then the teachers' answers."""
        with _statuses(context):
            return self.handler.collect(request_iterator)

    def FinishRun(self, request: pb.FinishRunRequest, context: grpc.ServicerContext) -> pb.FinishRunReply:
        with _statuses(context):
            return self.handler.finish_run(request)

    def Predict(self, request_iterator: Iterator[pb.EvalChunk], context: grpc.ServicerContext) -> pb.PredictReply:
        with _statuses(context):
            return self.handler.predict(request_iterator)

    def AlignExchange(
        self, request_iterator: Iterator[pb.AlignPoints], context: grpc.ServicerContext
    ) -> Iterator[pb.AlignPoints]:
        with _statuses(context):
            yield from self.handler.align_exchange(request_iterator)

    def AlignFinish(self, request_iterator: Iterator[pb.AlignPoints], context: grpc.ServicerContext) -> pb.AlignSummary:
        with _statuses(context):
            return self.handler.align_finish(request_iterator)


class LabelOwnerService(pb_grpc.LabelOwnerServicer):
    """Party B's own operator's calls (``vesper predict``): the scores of a finished run."""

    def __init__(self, handler: LabelParty) -> None:
        self.handler = handler

    def CheckKeys(self, request: pb.ScoresRequest, context: grpc.ServicerContext) -> pb.ScoresPlan:
        with _statuses(context):
            return self.handler.scores_plan(request)

    def Scores(self, request: pb.ScoresRequest, context: grpc.ServicerContext) -> Iterator[pb.ScoreRows]:
        with _statuses(context):
            yield from self.handler.scores(request)


def serve(config: PartyBConfig, ready_file: Path | None = None) -> None:
    check_writable_dir(config.workdir, "party_b.workdir")  # before it serves: SettingError otherwise
    if config.receipt_log is not None:
        check_writable_file_dir(config.receipt_log, "party_b.receipt_log")
    threads = apply_torch_threads(config.torch_threads)  # before any tensor work
    metrics = PartyBMetrics() if config.metrics_listen else None
    metrics_port = start_metrics(metrics, config.metrics_listen)  # a port it cannot have stops it here
    service = LabelPartyService(config, metrics=metrics)
    services = [
        (pb_grpc.add_LabelPartyServicer_to_server, service, pb.DESCRIPTOR.services_by_name["LabelParty"].full_name),
        (pb_grpc.add_LabelOwnerServicer_to_server, LabelOwnerService(service.handler),
         pb.DESCRIPTOR.services_by_name["LabelOwner"].full_name),
    ]
    server, port = start_server(
        config.listen, services, config.max_message_mb, tls=config.tls, tls_setting="party_b.tls", metrics=metrics,
    )
    log.info("party B serving on port %d (device %s, %d torch threads)", port, config.device, threads)
    write_ready_file(ready_file, grpc_port=port, torch_threads=threads, metrics_port=metrics_port)
    wait_for_signal(lambda: server.stop(grace=5).wait())
