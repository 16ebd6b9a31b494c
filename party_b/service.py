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
from contextlib import contextmanager
from pathlib import Path

import grpc
import torch
from pydantic import ValidationError

from vesper.common.accountant_client import AccountantClient, BudgetRefused, PeerError, PeerLost
from vesper.common.charge_token import TokenError, read_token
from vesper.common.config import DecoderConfig, LabelPrivacyConfig, OptimizerConfig, PartyBConfig
from vesper.common.dataset_files import DatasetNotFound, resolve_dataset
from vesper.common.grpc_server import start_server, wait_for_signal, write_ready_file
from vesper.common.torch_threads import apply_torch_threads
from vesper.common.wire import (
    WireError,
    decode_tensor,
    dtype_from_proto,
    encode_tensor,
    node_mask,
    validate_node_ids,
)
from vesper.common.writable import SettingError, check_writable_dir, check_writable_file_dir
from vesper.party_b.label_data import LabelStore, load_labels
from vesper.party_b.label_guard import LabelGuard, LabelGuardError, secret_generator
from vesper.party_b.release_record import ReleaseRecord
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


@contextmanager
def _disk_errors(context: grpc.ServicerContext, doing: str) -> Iterator[None]:
    """B's own disk failing (a full or read-only file system) as an interruption A can resume
    from once the disk is fixed: UNAVAILABLE with what B could not write, never a raw exception."""
    try:
        yield
    except OSError as exc:
        context.abort(
            grpc.StatusCode.UNAVAILABLE,
            f"party B cannot {doing} ({exc.strerror or exc}: {exc.filename or ''}): the run stops; once party B's "
            "disk is fixed, resume it (vesper train --resume RUN)",
        )


@contextmanager
def _label_ledger_errors(context: grpc.ServicerContext, doing: str) -> Iterator[None]:
    """B's label mechanisms' failures as gRPC statuses A can act on."""
    try:
        yield
    except LabelGuardError as exc:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except BudgetRefused as exc:
        context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"party B's label ledger refused: {exc}")
    except PeerLost as exc:  # the accountant is away: a transient fault A may wait out
        context.abort(grpc.StatusCode.UNAVAILABLE, f"party B could not {doing} its label ledger: {exc}")
    except PeerError as exc:  # the accountant refused: no retry will change it
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"party B could not {doing} its label ledger: {exc}")


class LabelPartyService(pb_grpc.LabelPartyServicer):
    def __init__(self, config: PartyBConfig, accountant_channel: grpc.Channel | None = None) -> None:
        """``accountant_channel``: a channel to the accountant instead of one B opens itself
        (the in-process mode's, coordinator/in_process.py)."""
        self.config = config
        self.device = torch.device(config.device)
        self.receipts = ReceiptLog(config.receipt_log)
        self.max_elements = config.max_message_mb * 1024 * 1024 // 2
        self._sessions: dict[str, LabelSession] = {}
        self._stores: dict[tuple[Path, int, bool], LabelStore] = {}
        self._guards: dict[str, LabelGuard] = {}
        self._lock = threading.Lock()
        self.accountant = self._accountant_client(config, accountant_channel)

    @staticmethod
    def _accountant_client(config: PartyBConfig, channel: grpc.Channel | None = None) -> AccountantClient | None:
        """B's client for its own label ledger (None: B cannot offer label privacy)."""
        if config.accountant is None:
            return None
        token = None
        if config.accountant_token_file is not None:
            try:
                token = read_token(config.accountant_token_file)
            except TokenError as exc:
                raise ValueError(f"party B: {exc}") from None
        return AccountantClient(
            config.accountant, token, channel=channel, tls=config.tls, tls_setting="party_b.tls",
            token_hint="party B has no label charge token for the accountant at {address} (set "
            "party_b.accountant_token_file to a copy of the accountant's label charge token file)",
        )

    # -- helpers ---------------------------------------------------------------------------
    def _session(self, run_id: str, context: grpc.ServicerContext) -> LabelSession:
        with self._lock:
            session = self._sessions.get(run_id)
        if session is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown run id {run_id[:80]!r}: call SetupRun first")
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

    def _run_dir(self, run_id: str) -> Path:
        return self.config.workdir / "runs" / run_id

    def _store(self, path: Path, split_seed: int, label_independent: bool) -> LabelStore:
        key = (path.resolve(), split_seed, label_independent)
        with self._lock:
            if key not in self._stores:
                self._stores[key] = load_labels(path, split_seed, label_independent, self.config.max_classes)
            return self._stores[key]

    def _label_privacy(self, request: pb.SetupRunRequest, context: grpc.ServicerContext) -> LabelPrivacyConfig:
        try:
            settings = (
                LabelPrivacyConfig.model_validate_json(request.label_privacy_json)
                if request.label_privacy_json else LabelPrivacyConfig()
            )
        except ValidationError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad label privacy settings: {exc}")
        if settings.mode == "none" and self.config.require_label_privacy:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "party B requires label privacy (party_b.require_label_privacy): choose label_privacy.mode rr or pate",
            )
        cap = self.config.max_label_epsilon
        if settings.mode != "none" and cap is not None and settings.epsilon > cap:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"label_privacy.epsilon={settings.epsilon:g} exceeds party B's own cap of {cap:g} "
                "(party_b.max_label_epsilon)",
            )
        return settings

    def _guard(
        self, request: pb.SetupRunRequest, settings: LabelPrivacyConfig, store: LabelStore, context: grpc.ServicerContext
    ) -> LabelGuard:
        """The run's label guard: made (and its ledger opened and charged) by the run's first session."""
        label_run_id = request.label_run_id or request.run_id
        if not RUN_ID.fullmatch(label_run_id):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"label run id {label_run_id!r} must match {RUN_ID.pattern}")
        with self._lock:
            guard = self._guards.get(label_run_id)
        if guard is not None:
            if guard.config != settings or guard.store is not store:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"session {request.run_id!r} asks for other data or label privacy than run {label_run_id!r}",
                )
            return guard
        guard = LabelGuard(
            label_run_id, settings, store, secret_generator(self.config.secret_seed, request.seed), self.accountant
        )
        with _label_ledger_errors(context, "open"):
            guard.open()
        with self._lock:
            self._guards[label_run_id] = guard
        return guard

    # -- RPCs ------------------------------------------------------------------------------
    def SetupRun(self, request: pb.SetupRunRequest, context: grpc.ServicerContext) -> pb.SetupRunReply:
        if not RUN_ID.fullmatch(request.run_id):
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
        settings = self._label_privacy(request, context)
        if request.resume and settings.mode != "none":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "a run with label privacy cannot be resumed")
        with self._lock:
            # A resumes: what B still holds is stale, and is replaced once the checkpoint is restored
            if request.run_id in self._sessions and not request.resume:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"run {request.run_id!r} is already set up")
        try:
            path = resolve_dataset(request.dataset, self.config.datasets)
            store = self._store(path, request.split_seed, label_independent=settings.mode != "none")
        except DatasetNotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except ValueError as exc:  # DatasetError included: the file is there, its contents cannot be used
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"party B cannot use dataset {request.dataset!r}: {exc}")
        try:  # before anything is charged: a run B cannot record is refused here
            check_writable_dir(self._run_dir(request.run_id), "party_b.workdir")
            if self.config.receipt_log is not None:
                check_writable_file_dir(self.config.receipt_log, "party_b.receipt_log")
        except SettingError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"party B cannot record run {request.run_id}: {exc}")
        guard = self._guard(request, settings, store, context)
        session = LabelSession(
            request.run_id, store, decoder, optimizer, request.embedding_dim, request.num_layers,
            wire_dtype, request.seed, self.device, guard,
        )
        if request.record_releases:
            session.record = ReleaseRecord(store.num_nodes, request.embedding_dim, request.num_layers)
        if request.membership_audit:
            # TFTS: the training nodes come back in the evaluation pass, for the membership attack
            session.split_masks["train"] = node_mask(torch.from_numpy(store.split.train), store.num_nodes)
        if request.resume_step:
            try:
                session.restore_checkpoint(self._run_dir(request.run_id), request.resume_step)
            except FileNotFoundError as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        with self._lock:
            if request.run_id in self._sessions and not request.resume:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"run {request.run_id!r} is already set up")
            self._sessions[request.run_id] = session
        log.info(
            "run %s set up: %s, %s, %d classes, label privacy %s", request.run_id, request.dataset,
            store.split.description, store.num_classes, settings.mode,
        )
        queries = guard.query_ids
        val = torch.from_numpy(store.split.val)
        if queries.numel():
            val = val[~torch.isin(val, queries)]  # a query's embedding trains the student: not a validation node
            session.split_masks["val"][queries] = False
        return pb.SetupRunReply(
            train_ids=store.split.train.tolist(),
            val_ids=val.tolist(),
            test_ids=store.split.test.tolist(),
            num_classes=store.num_classes,
            metric=store.metric,
            split=store.split.description,
            num_nodes=store.num_nodes,
            label_ledger_id=guard.ledger_id,
            label_epsilon_spent=guard.epsilon_spent,
            label_epsilon_budget=settings.epsilon,
            label_delta=guard.delta,
            query_ids=queries.tolist(),
            label_note=guard.note,
        )

    def Train(self, request_iterator: Iterator[pb.TrainStep], context: grpc.ServicerContext) -> Iterator[pb.TrainStepReply]:
        session: LabelSession | None = None
        try:
            for request in request_iterator:
                with _disk_errors(context, "record the release it received in its receipt log"):
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
            if session.record is not None:
                session.record.add_training(ids, embeddings)
            gradient, loss = session.train_step(ids, embeddings)
            if request.checkpoint:
                with _disk_errors(context, f"save its checkpoint after step {request.step}"):
                    session.save_checkpoint(self._run_dir(session.run_id))
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
            with _disk_errors(context, "record the release it received in its receipt log"):
                self.receipts.record(kind="eval", run_id=chunk.run_id, eval_id=chunk.eval_id, num_nodes=len(chunk.node_ids))
            if session is None:
                session = self._session(chunk.run_id, context)
                eval_id = chunk.eval_id
            elif chunk.run_id != session.run_id or chunk.eval_id != eval_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "an evaluation stream must carry one run id and one eval id")
            if chunk.split not in session.split_masks:
                expected = " or ".join(sorted(session.split_masks))
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown split {chunk.split!r}; expected {expected}")
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
                if session.record is not None:
                    session.record.add_evaluation(chunk.split, ids, embeddings, logits)
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

    def Collect(self, request_iterator: Iterator[pb.EvalChunk], context: grpc.ServicerContext) -> pb.CollectReply:
        """pate: A's frozen embeddings of B's labelled nodes and of the queries, then the teachers' answers."""
        session: LabelSession | None = None
        received: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {"train": ([], []), "query": ([], [])}
        seen = None
        for chunk in request_iterator:
            with _disk_errors(context, "record the release it received in its receipt log"):
                self.receipts.record(kind="collect", run_id=chunk.run_id, split=chunk.split, num_nodes=len(chunk.node_ids))
            if session is None:
                session = self._session(chunk.run_id, context)
                if session.guard.mode != "pate" or session.run_id != session.guard.run_id:
                    context.abort(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"run {chunk.run_id!r} does not use label_privacy.mode=pate: nothing to collect",
                    )
                allowed = {
                    "train": torch.from_numpy(session.store.split.train),
                    "query": session.guard.query_ids,
                }
                masks = {name: node_mask(ids, session.store.num_nodes) for name, ids in allowed.items()}
                seen = torch.zeros(session.store.num_nodes, dtype=torch.bool)
            elif chunk.run_id != session.run_id:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a collect stream must carry one run id")
            if chunk.split not in received:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown split {chunk.split!r}; expected train or query")
            try:
                ids, embeddings = self._received(session, chunk.node_ids, chunk.embeddings, masks[chunk.split], f"{chunk.split} nodes")
            except WireError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            if bool(seen[ids].any()):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{chunk.split} node sent twice in one collection")
            seen[ids] = True
            received[chunk.split][0].append(ids)
            received[chunk.split][1].append(embeddings.float())
        if session is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "empty collect stream")
        missing = [name for name in ("train", "query") if not bool(seen[allowed[name]].all())]
        if missing:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the collection lacks some {' and '.join(missing)} nodes: every labelled node and every query is needed",
            )
        (teacher_ids, teacher_emb), (query_ids, query_emb) = (
            (torch.cat(received[name][0]), torch.cat(received[name][1])) for name in ("train", "query")
        )
        with session.lock:
            with _label_ledger_errors(context, "charge"):
                outcome = session.guard.answer_queries(teacher_ids, teacher_emb, query_ids, query_emb)
        log.info("run %s: %s", session.run_id, outcome.note)
        return pb.CollectReply(
            run_id=session.run_id, answered_ids=outcome.answered_ids.tolist(),
            label_epsilon_spent=outcome.epsilon_spent, label_note=outcome.note,
        )

    def FinishRun(self, request: pb.FinishRunRequest, context: grpc.ServicerContext) -> pb.FinishRunReply:
        session = self._session(request.run_id, context)
        with session.lock:
            session.finished = True
            session.save(self.config.workdir / "runs" / request.run_id)
            if session.record is not None:
                session.record.save(self.config.workdir / "runs" / request.run_id / "received.npz")
        with self._lock:
            self._sessions.pop(request.run_id, None)
            guard = self._guards.pop(request.run_id, None)  # the run's main session ends its label guard
        if guard is not None:
            try:
                guard.close(request.status or "completed", request.reason)
            except PeerError as exc:
                log.warning("run %s: could not close B's label ledger: %s", request.run_id, exc)
        log.info("run %s finished at B: %s %s", request.run_id, request.status, request.reason)
        return pb.FinishRunReply()


def serve(config: PartyBConfig, ready_file: Path | None = None) -> None:
    check_writable_dir(config.workdir, "party_b.workdir")  # before it serves: SettingError otherwise
    if config.receipt_log is not None:
        check_writable_file_dir(config.receipt_log, "party_b.receipt_log")
    threads = apply_torch_threads(config.torch_threads)  # before any tensor work
    name = pb.DESCRIPTOR.services_by_name["LabelParty"].full_name
    server, port = start_server(
        config.listen, [(pb_grpc.add_LabelPartyServicer_to_server, LabelPartyService(config), name)],
        config.max_message_mb, tls=config.tls, tls_setting="party_b.tls",
    )
    log.info("party B serving on port %d (device %s, %d torch threads)", port, config.device, threads)
    write_ready_file(ready_file, grpc_port=port, torch_threads=threads)
    wait_for_signal(lambda: server.stop(grace=5).wait())
