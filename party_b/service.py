"""Party B's gRPC service (``vesper.v1.LabelParty``).

Everything A sends is validated before it touches a session: an unknown or wrong run
id, a step out of order, node ids that are unknown or not in the right split, and
tensors of the wrong dtype, shape or size, or with NaN/Inf, each end the call with a
clear status and leave the session as it was.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import torch
from pydantic import ValidationError

from vesper.common.config import DecoderConfig, OptimizerConfig, PartyBConfig
from vesper.common.dataset_files import DatasetError, resolve_dataset
from vesper.common.grpc_server import start_server, wait_for_signal, write_ready_file
from vesper.common.wire import (
    WireError,
    decode_tensor,
    dtype_from_proto,
    encode_tensor,
    validate_node_ids,
)
from vesper.party_b.label_data import LabelStore, load_labels
from vesper.party_b.session import LabelSession, SplitScores
from vesper.proto.v1 import label_party_pb2 as pb
from vesper.proto.v1 import label_party_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_DIM = 4096
MAX_LAYERS = 8


class ReceiptLog:
    """JSONL record of every release B receives, written before B uses it (for audits)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def record(self, **entry: object) -> None:
        if self.path is None:
            return
        line = json.dumps({"received_at": time.time(), **entry})
        with self._lock, self.path.open("a") as handle:
            handle.write(line + "\n")
            handle.flush()


class LabelPartyService(pb_grpc.LabelPartyServicer):
    def __init__(self, config: PartyBConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.receipts = ReceiptLog(config.receipt_log)
        self.max_elements = config.max_message_mb * 1024 * 1024 // 2
        self._sessions: dict[str, LabelSession] = {}
        self._stores: dict[tuple[Path, int], LabelStore] = {}
        self._lock = threading.Lock()

    # -- helpers ---------------------------------------------------------------------------
    def _session(self, run_id: str, context: grpc.ServicerContext) -> LabelSession:
        with self._lock:
            session = self._sessions.get(run_id)
        if session is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown run id {run_id!r}: call SetupRun first")
        return session

    def _received(
        self, session: LabelSession, node_ids, embeddings, allowed: torch.Tensor, what: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A release from A, validated: known ids of the right split, a B x d x L tensor of the run's dtype."""
        ids = validate_node_ids(node_ids, name=what, allowed=allowed, num_nodes=session.store.num_nodes)
        tensor = decode_tensor(
            embeddings, name="embeddings", expected_shape=(ids.numel(), session.dim, session.layers),
            expected_dtype=session.wire_dtype, max_elements=self.max_elements,
        )
        return ids, tensor

    def _store(self, path: Path, split_seed: int) -> LabelStore:
        key = (path.resolve(), split_seed)
        with self._lock:
            if key not in self._stores:
                self._stores[key] = load_labels(path, split_seed)
            return self._stores[key]

    # -- RPCs ------------------------------------------------------------------------------
    def SetupRun(self, request: pb.SetupRunRequest, context: grpc.ServicerContext) -> pb.SetupRunReply:
        if not RUN_ID.match(request.run_id):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"run id {request.run_id!r} must match {RUN_ID.pattern}")
        if not 1 <= request.embedding_dim <= MAX_DIM or not 1 <= request.num_layers <= MAX_LAYERS:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"embedding shape d={request.embedding_dim}, L={request.num_layers} outside "
                f"1..{MAX_DIM} x 1..{MAX_LAYERS}",
            )
        try:
            wire_dtype = dtype_from_proto(request.wire_dtype)
            decoder = DecoderConfig(
                kind=request.decoder.kind, hidden_dim=request.decoder.hidden_dim, dropout=request.decoder.dropout
            )
            optimizer = OptimizerConfig(
                name=request.optimizer.name, lr=request.optimizer.lr, weight_decay=request.optimizer.weight_decay
            )
        except (WireError, ValidationError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad run set-up: {exc}")
        try:
            path = resolve_dataset(request.dataset, self.config.datasets)
            store = self._store(path, request.split_seed)
        except DatasetError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except ValueError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        session = LabelSession(
            request.run_id, store, decoder, optimizer, request.embedding_dim, request.num_layers,
            wire_dtype, request.seed, self.device,
        )
        with self._lock:
            if request.run_id in self._sessions:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"run {request.run_id!r} is already set up")
            self._sessions[request.run_id] = session
        log.info("run %s set up: %s, %s, %d classes", request.run_id, request.dataset, store.split.description, store.num_classes)
        return pb.SetupRunReply(
            train_ids=store.split.train.tolist(),
            val_ids=store.split.val.tolist(),
            test_ids=store.split.test.tolist(),
            num_classes=store.num_classes,
            metric=store.metric,
            split=store.split.description,
            num_nodes=store.num_nodes,
        )

    def Train(self, request_iterator: Iterator[pb.TrainStep], context: grpc.ServicerContext) -> Iterator[pb.TrainStepReply]:
        session: LabelSession | None = None
        try:
            for request in request_iterator:
                self.receipts.record(
                    kind="train", run_id=request.run_id, step=request.step, num_nodes=len(request.node_ids)
                )
                if session is None:
                    session = self._session(request.run_id, context)
                    with session.lock:
                        if session.streaming:
                            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"run {request.run_id!r} already has a training stream")
                        session.streaming = True
                elif request.run_id != session.run_id:
                    context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"wrong run id {request.run_id!r} on the stream of run {session.run_id!r}",
                    )
                yield self._train_step(session, request, context)
        finally:
            if session is not None:
                session.streaming = False

    def _train_step(self, session: LabelSession, request: pb.TrainStep, context: grpc.ServicerContext) -> pb.TrainStepReply:
        with session.lock:
            if session.finished:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"run {session.run_id!r} has finished")
            if request.step != session.next_step:
                context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"out-of-order step: expected step {session.next_step}, got {request.step}",
                )
            try:
                ids, embeddings = self._received(session, request.node_ids, request.embeddings, session.train_mask, "training batch")
            except WireError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"step {request.step}: {exc}")
            gradient, loss = session.train_step(ids, embeddings)
            return pb.TrainStepReply(
                run_id=session.run_id,
                step=request.step,
                gradient=encode_tensor(gradient, session.wire_dtype),
                loss=loss,
            )

    def Evaluate(self, request_iterator: Iterator[pb.EvalChunk], context: grpc.ServicerContext) -> pb.EvalResult:
        session: LabelSession | None = None
        eval_id = 0
        scores: dict[str, SplitScores] = {}
        seen: dict[str, torch.Tensor] = {}
        for chunk in request_iterator:
            self.receipts.record(kind="eval", run_id=chunk.run_id, eval_id=chunk.eval_id, num_nodes=len(chunk.node_ids))
            if session is None:
                session = self._session(chunk.run_id, context)
                eval_id = chunk.eval_id
            elif chunk.run_id != session.run_id or chunk.eval_id != eval_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an evaluation stream must carry one run id and one eval id")
            if chunk.split not in session.split_masks:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown split {chunk.split!r}; expected val or test")
            try:
                ids, embeddings = self._received(
                    session, chunk.node_ids, chunk.embeddings, session.split_masks[chunk.split], f"{chunk.split} nodes"
                )
            except WireError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            mask = seen.setdefault(chunk.split, torch.zeros(session.store.num_nodes, dtype=torch.bool))
            if bool(mask[ids].any()):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{chunk.split} node sent twice in one evaluation")
            mask[ids] = True
            with session.lock:
                logits = session.logits(embeddings)
            collected = scores.setdefault(chunk.split, SplitScores())
            collected.node_ids.append(ids)
            collected.logits.append(logits.cpu())
        if session is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty evaluation stream")
        try:
            results = session.evaluate(scores)
        except ValueError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.EvalResult(
            run_id=session.run_id,
            eval_id=eval_id,
            metrics=[pb.Metric(split=s, name=n, value=v, count=c) for s, n, v, c in results],
        )

    def FinishRun(self, request: pb.FinishRunRequest, context: grpc.ServicerContext) -> pb.FinishRunReply:
        session = self._session(request.run_id, context)
        with session.lock:
            session.finished = True
            session.save(self.config.workdir / "runs" / request.run_id)
        with self._lock:
            self._sessions.pop(request.run_id, None)
        log.info("run %s finished at B: %s %s", request.run_id, request.status, request.reason)
        return pb.FinishRunReply()


def serve(config: PartyBConfig, ready_file: Path | None = None) -> None:
    name = pb.DESCRIPTOR.services_by_name["LabelParty"].full_name
    server, port = start_server(
        config.listen, [(pb_grpc.add_LabelPartyServicer_to_server, LabelPartyService(config), name)],
        config.max_message_mb,
    )
    log.info("party B serving on port %d (device %s)", port, config.device)
    write_ready_file(ready_file, grpc_port=port)
    wait_for_signal(lambda: server.stop(grace=5).wait())
