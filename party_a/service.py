"""Party A's gRPC service (``vesper.v1.GraphParty``): the coordinator starts runs here.

A run executes in a worker thread; its progress streams back to the coordinator,
and the last event is the run's summary. If the coordinator disconnects, the run
stops after the current step and is closed at the accountant as cancelled.
"""

from __future__ import annotations

import logging
import queue
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import torch
from pydantic import ValidationError

from vesper.common.accountant_client import PeerError, PeerLost
from vesper.common.charge_token import TokenError, read_token
from vesper.common.config import PartyAConfig, RunConfig, describe_validation_error
from vesper.common.dataset_files import DatasetNotFound, resolve_dataset
from vesper.common.grpc_server import start_server, wait_for_signal, write_ready_file
from vesper.common.log_format import name_run, running
from vesper.common.metrics import NO_COUNTERS, PartyAMetrics, start_metrics
from vesper.common.stores import GRAPH_FILE, aligned_datasets
from vesper.common.torch_threads import apply_torch_threads
from vesper.common.writable import check_writable_dir
from vesper.party_a.alignment import align
from vesper.party_a.extractors.edge_free_path import recorded_run_config
from vesper.party_a.extractors.registry import lookup, validated_params
from vesper.party_a.peers import AccountantClient, LabelPartyClient
from vesper.party_a.run import GraphData, GraphPartyRun, ProgressEvent
from vesper.party_a.run.checkpoint_files import ResumeError, RunFiles, check_resumable
from vesper.party_a.run.predict import PredictionPass
from vesper.party_a.run.progress import Throttled
from vesper.proto.v1 import graph_party_pb2 as pb
from vesper.proto.v1 import graph_party_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

RUN_ID = re.compile(r"^[0-9a-f]{12}$")
ALIGN_TIMEOUT_S = 6 * 3600.0  # one alignment round with party B: a million keys take minutes


def _progress_message(event: ProgressEvent, run_id: str, config: RunConfig) -> pb.RunEvent:
    return pb.RunEvent(progress=pb.Progress(
        phase=event.phase, epoch=event.epoch, epochs=event.epochs, step=event.step,
        total_steps=event.total_steps, loss=event.loss, epsilon_spent=event.epsilon_spent,
        message=event.message, run_id=run_id, accounting=config.privacy.accounting,
        epsilon_budget=config.privacy.epsilon,
    ))


class GraphPartyService(pb_grpc.GraphPartyServicer):
    def __init__(self, settings: PartyAConfig, metrics: PartyAMetrics | None = None) -> None:
        """``metrics``: where runs count their steps and releases (None: nowhere)."""
        self.settings = settings
        self.metrics = metrics
        self.device = torch.device(settings.device)
        self._data: dict[Path, GraphData] = {}
        self._lock = threading.Lock()
        self._live: set[str] = set()  # runs a trainer of this service is executing: one trainer per run

    def _load(self, path: Path) -> GraphData:
        with self._lock:
            key = path.resolve()
            if key not in self._data:
                log.info("loading graph %s onto %s", path, self.device)
                self._data[key] = GraphData.load(path, self.device)
            return self._data[key]

    def _resume_record(
        self, run_id: str, context: grpc.ServicerContext, resumable: bool = True,
    ) -> tuple[RunConfig, dict]:
        """The run's settings and resume record from A's own disk (party_a.run.checkpoint_files)."""
        if not RUN_ID.match(run_id):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"run id {run_id!r} must match {RUN_ID.pattern}")
        try:
            record = RunFiles(self.settings.workdir / "runs" / run_id).load_start()
            config = recorded_run_config(record["config"])
            if resumable:
                check_resumable(config)
        except (ResumeError, ValidationError) as exc:
            what = "resume" if resumable else "serve"
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot {what} run {run_id}: {exc}")
        return config, record

    def _claim(self, run_id: str, context: grpc.ServicerContext) -> None:
        """Mark ``run_id`` live in this service; a second trainer of it is refused before it starts
        (across services, the accountant's lease refuses it: party_a.run.lease)."""
        with self._lock:
            if run_id in self._live:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"run {run_id} is training in this party A now: a run has one trainer, so it cannot be resumed "
                    "while it runs; resume it once it has stopped (interrupted)",
                )
            self._live.add(run_id)

    def _release(self, run_id: str) -> None:
        with self._lock:
            self._live.discard(run_id)

    def StartRun(self, request: pb.StartRunRequest, context: grpc.ServicerContext) -> Iterator[pb.RunEvent]:
        resume = None
        if request.resume_run_id:
            if request.run_config_json:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "a resumed run takes its settings from party A's record of it, not from the request",
                )
            config, resume = self._resume_record(request.resume_run_id, context)
            self._claim(request.resume_run_id, context)
            try:
                yield from self._start(request, context, config, resume)
            finally:
                self._release(request.resume_run_id)
            return
        try:
            config = RunConfig.model_validate_json(request.run_config_json)
        except ValidationError as exc:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"invalid run configuration:\n{describe_validation_error(exc, 'run')}"
            )
        try:  # the extractor and its parameters, before anything starts (ExtractorNotFound is a ValueError)
            validated_params(lookup(config.extractor.name).spec, config)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid run configuration: {exc}")
        yield from self._start(request, context, config, None)

    def datasets(self) -> dict[str, str]:
        """A's ``[datasets]`` and the aligned datasets it holds (docs/alignment.md)."""
        return {**self.settings.datasets, **aligned_datasets(self.settings.workdir, GRAPH_FILE)}

    def _label_party(self) -> LabelPartyClient:
        return LabelPartyClient(
            self.settings.label_party, self.settings.max_message_mb, self.settings.step_timeout_s, tls=self.settings.tls
        )

    def _accountant(self, context: grpc.ServicerContext) -> AccountantClient:
        token = None
        if self.settings.accountant_token_file is not None:
            try:
                token = read_token(self.settings.accountant_token_file)
            except TokenError as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"party A: {exc}")
        return AccountantClient(self.settings.accountant, token, tls=self.settings.tls, retry_s=self.settings.peer_retry_s)

    def Predict(self, request: pb.PredictRequest, context: grpc.ServicerContext) -> Iterator[pb.RunEvent]:
        """A prediction pass of a finished run (party_a.run.predict), progress streamed."""
        config, _ = self._resume_record(request.run_id, context, resumable=False)
        self._claim(request.run_id, context)
        label_party, accountant = self._label_party(), self._accountant(context)

        counters = self.metrics.for_run(request.run_id) if self.metrics is not None else NO_COUNTERS

        def work(report: Callable[[ProgressEvent | str], None]) -> str:
            data = self._load(resolve_dataset(config.dataset, self.datasets()))
            with running(request.run_id):
                done = PredictionPass(request.run_id, self.settings, data, label_party, accountant, report, counters).execute()
            log.info("run %s: prediction pass %d, %d nodes", done.run_id, done.pass_index, done.nodes)
            return done.model_dump_json()

        try:
            yield from _in_background(f"the prediction of run {request.run_id}", "predict", work, context)
        finally:
            label_party.close()
            accountant.close()
            self._release(request.run_id)

    def Align(self, request: pb.AlignRequest, context: grpc.ServicerContext) -> Iterator[pb.RunEvent]:
        """A private id alignment with party B (party_a.alignment), progress streamed."""
        label_party = self._label_party()

        def work(report: Callable[[str], None]) -> str:
            done = align(
                self.settings.workdir, self.settings.datasets, request.dataset, request.alignment_id, label_party,
                request.pad_to or self.settings.alignment_pad_to, ALIGN_TIMEOUT_S, report,
            )
            log.info("alignment %s of %s: %d keys in the intersection", done.alignment_id, done.dataset, done.size)
            return done.model_dump_json()

        try:
            yield from _in_background(f"alignment {request.alignment_id}", "align", work, context)
        finally:
            label_party.close()

    def _start(
        self, request: pb.StartRunRequest, context: grpc.ServicerContext, config: RunConfig, resume: dict | None
    ) -> Iterator[pb.RunEvent]:
        try:
            dataset_path = resolve_dataset(config.dataset, self.datasets())
            data = self._load(dataset_path)
        except DatasetNotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, f"party A: {exc}")
        except ValueError as exc:  # DatasetError included: the file is there, its contents cannot be used
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"party A cannot use dataset {config.dataset!r}: {exc}")

        events: queue.Queue = queue.Queue()
        label_party = self._label_party()
        accountant = self._accountant(context)
        if resume is not None:
            # before party B or A's run files are touched: a finished run's record stays as it is
            try:
                status = accountant.get_run(request.resume_run_id).status
            except PeerError as exc:
                status = f"unknown ({exc})"
            if status not in ("active", "interrupted"):
                label_party.close()
                accountant.close()
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"cannot resume run {request.resume_run_id}: it is {status} at the accountant; only an "
                    "interrupted run resumes",
                )
        run = GraphPartyRun(
            config, self.settings, data, label_party, accountant,
            # a step's progress at most every STEP_EVENTS_EVERY_S (progress.Throttled): the coordinator draws a bar from it
            report=Throttled(events.put), cancelled=lambda: not context.is_active(), resume=resume, metrics=self.metrics,
            dataset_path=dataset_path,
        )
        name_run(run.run_id)  # this call's log lines name the run (the server clears it when the call ends)
        if resume is None:
            self._claim(run.run_id, context)  # a resume of it is refused while it trains

        def work() -> None:
            try:
                with running(run.run_id):  # every line the run logs names it
                    events.put(run.execute())
            except Exception as exc:  # a bug, not a peer failure: still end the stream clearly
                log.exception("run %s crashed", run.run_id)
                events.put(exc)
            finally:
                label_party.close()
                accountant.close()
                self._release(run.run_id)  # the trainer has stopped: a resume may start

        log.info("run %s: %s on %s, epsilon=%s", run.run_id, config.extractor.name, config.dataset, config.privacy.epsilon)
        worker = threading.Thread(target=work, name=f"run-{run.run_id}", daemon=True)
        worker.start()
        while True:
            event = events.get()
            if isinstance(event, ProgressEvent):
                yield _progress_message(event, run.run_id, run.config)
            elif isinstance(event, Exception):
                context.abort(grpc.StatusCode.INTERNAL, f"run {run.run_id} crashed in party A: {event!r}")
            else:
                log.info("run %s %s: %s", run.run_id, event.status, event.message)
                yield pb.RunEvent(summary_json=event.model_dump_json())
                return


_STATUS_OF = (  # how a background job's refusal reaches the coordinator
    (DatasetNotFound, grpc.StatusCode.NOT_FOUND),
    (PeerLost, grpc.StatusCode.UNAVAILABLE),
    (PeerError, grpc.StatusCode.FAILED_PRECONDITION),
    (ValueError, grpc.StatusCode.FAILED_PRECONDITION),
)


def _in_background(
    what: str, phase: str, work: Callable[[Callable[[ProgressEvent | str], None]], str], context: grpc.ServicerContext,
) -> Iterator[pb.RunEvent]:
    """Run ``work(report)`` on a thread of its own; its progress (lines or events) streams as Progress
    and its result (JSON) as the last event; a refusal becomes the call's status, a crash INTERNAL."""
    events: queue.Queue = queue.Queue()
    done = object()

    def run() -> None:
        try:
            events.put((done, work(lambda message: events.put(message))))
        except Exception as exc:  # noqa: BLE001 — mapped to a status below, in the caller's thread
            events.put(exc)

    threading.Thread(target=run, name=what, daemon=True).start()
    while True:
        event = events.get()
        if isinstance(event, str):
            yield pb.RunEvent(progress=pb.Progress(phase=phase, message=event))
        elif isinstance(event, ProgressEvent):
            yield pb.RunEvent(progress=pb.Progress(
                phase=event.phase, step=event.step, total_steps=event.total_steps, epsilon_spent=event.epsilon_spent,
                message=event.message,
            ))
        elif isinstance(event, tuple):
            yield pb.RunEvent(result_json=event[1])
            return
        else:
            for kind, code in _STATUS_OF:
                if isinstance(event, kind):
                    context.abort(code, f"party A: {what}: {event}")
            log.error("%s crashed", what, exc_info=event)
            context.abort(grpc.StatusCode.INTERNAL, f"{what} crashed in party A: {event!r}")


def serve(settings: PartyAConfig, ready_file: Path | None = None) -> None:
    check_writable_dir(settings.workdir, "party_a.workdir")  # before it serves: SettingError otherwise
    threads = apply_torch_threads(settings.torch_threads)  # before any tensor work
    metrics = PartyAMetrics() if settings.metrics_listen else None
    metrics_port = start_metrics(metrics, settings.metrics_listen)  # a port it cannot have stops it here
    name = pb.DESCRIPTOR.services_by_name["GraphParty"].full_name
    server, port = start_server(
        settings.listen, [(pb_grpc.add_GraphPartyServicer_to_server, GraphPartyService(settings, metrics), name)],
        settings.max_message_mb, tls=settings.tls, tls_setting="party_a.tls", metrics=metrics,
    )
    log.info("party A serving on port %d (device %s, %d torch threads); party B at %s, accountant at %s",
             port, settings.device, threads, settings.label_party, settings.accountant)
    write_ready_file(ready_file, grpc_port=port, torch_threads=threads, metrics_port=metrics_port)
    wait_for_signal(lambda: server.stop(grace=5).wait())
