"""Party B's side of a run, without gRPC: what each call of ``vesper.v1.LabelParty`` does.

Everything A sends is validated before it touches a session: an unknown or wrong run id, a
step out of order, node ids that are unknown or not in the right split, and tensors of the
wrong dtype, shape or size, or with NaN/Inf, each end the call with a typed error
(party_b/errors.py) and leave the session as it was. The servicer (party_b/service.py)
turns the errors into status codes.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import torch
from pydantic import ValidationError

from vesper.common.accountant_client import AccountantClient, BudgetRefused, PeerError, PeerLost
from vesper.common.charge_token import TokenError, read_token
from vesper.common.config import DecoderConfig, LabelPrivacyConfig, OptimizerConfig, PartyBConfig
from vesper.common.dataset_files import DatasetNotFound, resolve_dataset
from vesper.common.metrics import PartyBMetrics
from vesper.common.stores import LABEL_FILE, aligned_datasets
from vesper.common.wire import (
    WireError,
    decode_tensor,
    dtype_from_proto,
    encode_tensor,
    node_mask,
    tensor_digest,
    validate_node_ids,
)
from vesper.common.writable import SettingError, check_writable_dir, check_writable_file_dir
from vesper.party_b.alignment import Alignments
from vesper.party_b.errors import AlreadySetUp, BadRequest, OutOfBudget, Refused, Unavailable, UnknownRun
from vesper.party_b.label_data import LabelStore, load_labels
from vesper.party_b.label_guard import LabelGuard, LabelGuardError, secret_generator
from vesper.party_b.prediction import (
    ServedRun,
    collect_predictions,
    node_keys,
    score_rows,
    select_rows,
    stored_probabilities,
)
from vesper.party_b.receipt_log import ReceiptLog
from vesper.party_b.release_record import ReleaseRecord
from vesper.party_b.session import LabelSession, SplitScores
from vesper.proto.v1 import label_party_pb2 as pb

log = logging.getLogger(__name__)

RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_DIM = 4096
# slices of a release: an extractor's layers, plus its edge-free path's, whose wider layers go out
# as several slices each (party_a.extractors.edge_free_path; GAP: 2 + 4)
MAX_LAYERS = 64


@contextmanager
def disk_errors(doing: str) -> Iterator[None]:
    """B's own disk failing (a full or read-only file system) as an interruption A can resume
    from once the disk is fixed: Unavailable with what B could not write, never a raw exception."""
    try:
        yield
    except OSError as exc:
        raise Unavailable(
            f"party B cannot {doing} ({exc.strerror or exc}: {exc.filename or ''}): the run stops; once party B's "
            "disk is fixed, resume it (vesper train --resume RUN)"
        ) from None


@contextmanager
def label_ledger_errors(doing: str) -> Iterator[None]:
    """B's label mechanisms' failures as errors A can act on."""
    try:
        yield
    except LabelGuardError as exc:
        raise Refused(str(exc)) from None
    except BudgetRefused as exc:
        raise OutOfBudget(f"party B's label ledger refused: {exc}") from None
    except PeerLost as exc:  # the accountant is away: a transient fault A may wait out
        raise Unavailable(f"party B could not {doing} its label ledger: {exc}") from None
    except PeerError as exc:  # the accountant refused: no retry will change it
        raise Refused(f"party B could not {doing} its label ledger: {exc}") from None


def accountant_client(config: PartyBConfig, channel: grpc.Channel | None = None) -> AccountantClient | None:
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


class LabelParty:
    """B's sessions (one per run or stage) and label guards (one per run), and the calls on them."""

    def __init__(
        self, config: PartyBConfig, accountant_channel: grpc.Channel | None = None, metrics: PartyBMetrics | None = None,
    ) -> None:
        """``accountant_channel``: a channel to the accountant instead of one B opens itself
        (the in-process mode's, coordinator/in_process.py); ``metrics``: where steps are timed."""
        self.config = config
        self.step_seconds = metrics.step_seconds if metrics is not None else None
        self.device = torch.device(config.device)
        self.receipts = ReceiptLog(config.receipt_log)
        self.max_elements = config.max_message_mb * 1024 * 1024 // 2
        self._sessions: dict[str, LabelSession] = {}
        self._stores: dict[tuple[Path, int, bool], LabelStore] = {}
        self._guards: dict[str, LabelGuard] = {}
        self._lock = threading.Lock()
        self.accountant = accountant_client(config, accountant_channel)
        self.alignments = Alignments(config.workdir, config.datasets, config.alignment_pad_to)

    # -- helpers ---------------------------------------------------------------------------
    def _session(self, run_id: str) -> LabelSession:
        with self._lock:
            session = self._sessions.get(run_id)
        if session is None:
            raise UnknownRun(f"unknown run id {run_id[:80]!r}: call SetupRun first")
        return session

    def _received(
        self, session: LabelSession, node_ids: Iterable[int], embeddings: object, allowed: torch.Tensor, what: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A release from A, validated: known ids of the right split, a B x d x L tensor of the run's dtype."""
        ids = validate_node_ids(node_ids, name=what, allowed=allowed, num_nodes=session.store.num_nodes)
        tensor = decode_tensor(
            embeddings, name="embeddings", expected_shape=(ids.numel(), session.dim, session.layers),
            expected_dtype=session.wire_dtype, max_elements=self.max_elements,
        )
        return ids, tensor

    def _record_receipt(self, **entry: object) -> None:
        with disk_errors("record the release it received in its receipt log"):
            self.receipts.record(**entry)

    def datasets(self) -> dict[str, str]:
        """B's ``[datasets]`` and the aligned datasets it holds (docs/alignment.md)."""
        return {**self.config.datasets, **aligned_datasets(self.config.workdir, LABEL_FILE)}

    def _run_dir(self, run_id: str) -> Path:
        return self.config.workdir / "runs" / run_id

    def _store(self, path: Path, split_seed: int, label_independent: bool) -> LabelStore:
        key = (path.resolve(), split_seed, label_independent)
        with self._lock:
            if key not in self._stores:
                self._stores[key] = load_labels(path, split_seed, label_independent, self.config.max_classes)
            return self._stores[key]

    # -- SetupRun --------------------------------------------------------------------------
    def setup_run(self, request: pb.SetupRunRequest) -> pb.SetupRunReply:
        """A session for ``request.run_id``: B's split, and its label guard's queries and ledger."""
        wire_dtype, decoder, optimizer = _checked_setup(request)
        settings = self._label_privacy(request)
        if request.resume and settings.mode != "none":
            raise Refused("a run with label privacy cannot be resumed")
        self._check_new(request)
        store = self._dataset(request, settings)
        self._check_recordable(request.run_id)
        guard = self._guard(request, settings, store)
        session = LabelSession(
            request.run_id, store, decoder, optimizer, request.embedding_dim, request.num_layers,
            wire_dtype, request.seed, self.device, guard, request.edge_free_layers,
        )
        session.served = ServedRun(
            run_id=request.run_id, dataset=request.dataset, split_seed=request.split_seed,
            label_independent=settings.mode != "none", decoder=decoder, dim=request.embedding_dim,
            layers=request.num_layers, wire_dtype=wire_dtype, num_classes=store.num_classes,
            edge_free_layers=request.edge_free_layers,
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
                raise Refused(str(exc)) from None
        with self._lock:
            self._check_new(request, locked=True)
            self._sessions[request.run_id] = session
        log.info(
            "run %s set up: %s, %s, %d classes, label privacy %s", request.run_id, request.dataset,
            store.split.description, store.num_classes, settings.mode,
        )
        return _setup_reply(session, settings)

    def _check_new(self, request: pb.SetupRunRequest, locked: bool = False) -> None:
        """A resumes: what B still holds is stale, and is replaced once the checkpoint is restored."""
        if locked:
            if request.run_id in self._sessions and not request.resume:
                raise AlreadySetUp(f"run {request.run_id!r} is already set up")
            return
        with self._lock:
            self._check_new(request, locked=True)

    def _dataset(self, request: pb.SetupRunRequest, settings: LabelPrivacyConfig) -> LabelStore:
        try:
            path = resolve_dataset(request.dataset, self.datasets())
            return self._store(path, request.split_seed, label_independent=settings.mode != "none")
        except DatasetNotFound as exc:
            raise UnknownRun(str(exc)) from None
        except ValueError as exc:  # DatasetError included: the file is there, its contents cannot be used
            raise Refused(f"party B cannot use dataset {request.dataset!r}: {exc}") from None

    def _check_recordable(self, run_id: str) -> None:
        """Before anything is charged: a run B cannot record is refused here."""
        try:
            check_writable_dir(self._run_dir(run_id), "party_b.workdir")
            if self.config.receipt_log is not None:
                check_writable_file_dir(self.config.receipt_log, "party_b.receipt_log")
        except SettingError as exc:
            raise Refused(f"party B cannot record run {run_id}: {exc}") from None

    def _label_privacy(self, request: pb.SetupRunRequest) -> LabelPrivacyConfig:
        try:
            settings = (
                LabelPrivacyConfig.model_validate_json(request.label_privacy_json)
                if request.label_privacy_json else LabelPrivacyConfig()
            )
        except ValidationError as exc:
            raise BadRequest(f"bad label privacy settings: {exc}") from None
        if settings.mode == "none" and self.config.require_label_privacy:
            raise Refused(
                "party B requires label privacy (party_b.require_label_privacy): choose label_privacy.mode rr or pate"
            )
        cap = self.config.max_label_epsilon
        if settings.mode != "none" and cap is not None and settings.epsilon > cap:
            raise Refused(
                f"label_privacy.epsilon={settings.epsilon:g} exceeds party B's own cap of {cap:g} "
                "(party_b.max_label_epsilon)"
            )
        return settings

    def _guard(self, request: pb.SetupRunRequest, settings: LabelPrivacyConfig, store: LabelStore) -> LabelGuard:
        """The run's label guard: made (and its ledger opened and charged) by the run's first session."""
        label_run_id = request.label_run_id or request.run_id
        if not RUN_ID.fullmatch(label_run_id):
            raise BadRequest(f"label run id {label_run_id!r} must match {RUN_ID.pattern}")
        with self._lock:
            guard = self._guards.get(label_run_id)
        if guard is not None:
            if guard.config != settings or guard.store is not store:
                raise BadRequest(f"session {request.run_id!r} asks for other data or label privacy than run {label_run_id!r}")
            return guard
        guard = LabelGuard(
            label_run_id, settings, store, secret_generator(self.config.secret_seed, request.seed), self.accountant
        )
        with label_ledger_errors("open"):
            guard.open()
        with self._lock:
            self._guards[label_run_id] = guard
        return guard

    # -- Train -----------------------------------------------------------------------------
    def train(self, requests: Iterator[pb.TrainStep]) -> Iterator[pb.TrainStepReply]:
        """One training stream: every step on one session, in order."""
        session: LabelSession | None = None
        try:
            for request in requests:
                self._record_receipt(
                    kind="train", run_id=request.run_id, step=request.step, num_nodes=len(request.node_ids),
                    sha256=tensor_digest(request.embeddings),
                )
                if session is None:
                    session = self._claim_stream(request.run_id)
                elif request.run_id != session.run_id:
                    raise BadRequest(f"wrong run id {request.run_id!r} on the stream of run {session.run_id!r}")
                started = time.perf_counter()
                reply = self._train_step(session, request)
                if self.step_seconds is not None:
                    self.step_seconds.observe(time.perf_counter() - started)
                yield reply
        finally:
            if session is not None:
                session.streaming = False

    def _claim_stream(self, run_id: str) -> LabelSession:
        session = self._session(run_id)
        with session.lock:
            if session.streaming:
                raise Refused(f"run {run_id!r} already has a training stream")
            session.streaming = True
        return session

    def _train_step(self, session: LabelSession, request: pb.TrainStep) -> pb.TrainStepReply:
        with session.lock:
            if session.finished:
                raise Refused(f"run {session.run_id!r} has finished")
            if request.step != session.next_step:
                raise Refused(f"out-of-order step: expected step {session.next_step}, got {request.step}")
            try:
                ids, embeddings = self._received(session, request.node_ids, request.embeddings, session.train_mask, "training batch")
            except WireError as exc:
                raise BadRequest(f"step {request.step}: {exc}") from None
            if session.record is not None:
                session.record.add_training(ids, embeddings)
            gradient, loss = session.train_step(ids, embeddings)
            if request.checkpoint:
                with disk_errors(f"save its checkpoint after step {request.step}"):
                    session.save_checkpoint(self._run_dir(session.run_id))
            return pb.TrainStepReply(
                run_id=session.run_id, step=request.step, gradient=encode_tensor(gradient, session.wire_dtype), loss=loss,
            )

    # -- Evaluate --------------------------------------------------------------------------
    def evaluate(self, chunks: Iterator[pb.EvalChunk]) -> pb.EvalResult:
        """One evaluation pass: every chunk of one run and eval id, each node once per split."""
        session: LabelSession | None = None
        eval_id = 0
        scores: dict[str, SplitScores] = {}
        seen: dict[str, torch.Tensor] = {}
        received: list[tuple[str, torch.Tensor, torch.Tensor]] = []  # audited runs: recorded once B has chosen
        for chunk in chunks:
            self._record_receipt(
                kind="eval", run_id=chunk.run_id, eval_id=chunk.eval_id, num_nodes=len(chunk.node_ids),
                sha256=tensor_digest(chunk.embeddings),
            )
            if session is None:
                session, eval_id = self._session(chunk.run_id), chunk.eval_id
            elif chunk.run_id != session.run_id or chunk.eval_id != eval_id:
                raise BadRequest("an evaluation stream must carry one run id and one eval id")
            ids, embeddings = self._evaluation_chunk(session, chunk, seen)
            with session.lock:
                logits = session.logits(embeddings)
            scores.setdefault(chunk.split, SplitScores()).add(ids, logits)
            if session.record is not None:
                received.append((chunk.split, ids, embeddings))
        if session is None:
            raise BadRequest("empty evaluation stream")
        try:
            evaluation = session.evaluate(scores)
        except ValueError as exc:
            raise Refused(str(exc)) from None
        if session.record is not None:  # the logits of the model B keeps (its head is chosen now)
            with session.lock:
                for split, ids, embeddings in received:
                    session.record.add_evaluation(split, ids, embeddings, session.logits(embeddings)[evaluation.head])
        return pb.EvalResult(
            run_id=session.run_id, eval_id=eval_id,
            metrics=[pb.Metric(split=s, name=n, value=v, count=c) for s, n, v, c in evaluation.results],
            decoder_head=evaluation.chosen,
            head_metrics=[
                pb.Metric(split=f"{s}@{head}", name=n, value=v, count=c)
                for head, rows in evaluation.heads.items() for s, n, v, c in rows
            ],
            head_errors=[
                pb.Metric(split=f"val@{head}", name=session.store.metric, value=error)
                for head, error in evaluation.errors.items()
            ],
        )

    def _evaluation_chunk(
        self, session: LabelSession, chunk: pb.EvalChunk, seen: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if chunk.split not in session.split_masks:
            expected = " or ".join(sorted(session.split_masks))
            raise BadRequest(f"unknown split {chunk.split!r}; expected {expected}")
        try:
            ids, embeddings = self._received(
                session, chunk.node_ids, chunk.embeddings, session.split_masks[chunk.split], f"{chunk.split} nodes"
            )
        except WireError as exc:
            raise BadRequest(str(exc)) from None
        mask = seen.setdefault(chunk.split, torch.zeros(session.store.num_nodes, dtype=torch.bool))
        if bool(mask[ids].any()):
            raise BadRequest(f"{chunk.split} node sent twice in one evaluation")
        mask[ids] = True
        return ids, embeddings

    # -- Collect (pate) ----------------------------------------------------------------------
    def collect(self, chunks: Iterator[pb.EvalChunk]) -> pb.CollectReply:
        """pate: A's frozen embeddings of B's labelled nodes and of the queries, then the teachers' answers."""
        collection: _Collection | None = None
        for chunk in chunks:
            self._record_receipt(kind="collect", run_id=chunk.run_id, split=chunk.split, num_nodes=len(chunk.node_ids))
            if collection is None:
                collection = _Collection(self._session(chunk.run_id))
            elif chunk.run_id != collection.session.run_id:
                raise BadRequest("a collect stream must carry one run id")
            collection.add(chunk, self._received)
        if collection is None:
            raise BadRequest("empty collect stream")
        session = collection.session
        (teacher_ids, teacher_emb), (query_ids, query_emb) = collection.complete()
        with session.lock, label_ledger_errors("charge"):
            outcome = session.guard.answer_queries(teacher_ids, teacher_emb, query_ids, query_emb)
        log.info("run %s: %s", session.run_id, outcome.note)
        return pb.CollectReply(
            run_id=session.run_id, answered_ids=outcome.answered_ids.tolist(),
            label_epsilon_spent=outcome.epsilon_spent, label_note=outcome.note,
        )

    # -- prediction (party_b/prediction.py) -------------------------------------------------
    def _served(self, run_id: str) -> tuple[ServedRun, LabelStore, Path]:
        """A finished run, its labels and its dataset's file."""
        if not RUN_ID.fullmatch(run_id):
            raise BadRequest(f"run id {run_id[:80]!r} must match {RUN_ID.pattern}")
        served = ServedRun.load(self._run_dir(run_id))
        settings = LabelPrivacyConfig(mode="rr", epsilon=1.0) if served.label_independent else LabelPrivacyConfig()
        store, path = self._dataset_of(served.dataset, served.split_seed, settings)
        return served, store, path

    def _dataset_of(self, name: str, split_seed: int, settings: LabelPrivacyConfig) -> tuple[LabelStore, Path]:
        try:
            path = resolve_dataset(name, self.datasets())
        except DatasetNotFound as exc:
            raise UnknownRun(str(exc)) from None
        return self._store(path, split_seed, label_independent=settings.mode != "none"), path

    def predict(self, chunks: Iterator[pb.EvalChunk]) -> pb.PredictReply:
        """A prediction pass of a finished run: B keeps its decoder's probabilities for every node."""
        first = next(chunks, None)
        if first is None:
            raise BadRequest("an empty prediction stream")
        self._record_receipt(kind="predict", run_id=first.run_id, eval_id=first.eval_id, num_nodes=len(first.node_ids))
        served, store, _ = self._served(first.run_id)
        with disk_errors(f"keep the predictions of run {first.run_id}"):
            reply = collect_predictions(
                served, self._run_dir(first.run_id), store.num_nodes, _recorded(first, chunks, self._record_receipt),
                self.device, self.max_elements,
            )
        log.info("run %s: prediction pass %d, %d nodes", reply.run_id, reply.pass_index, reply.nodes)
        return reply

    def scores_plan(self, request: pb.ScoresRequest) -> pb.ScoresPlan:
        served, store, path = self._served(request.run_id)
        rows = select_rows(request, node_keys(path, store.num_nodes), store)
        return pb.ScoresPlan(
            run_id=request.run_id, rows=rows.size, classes=list(store.class_names),
            predicted=stored_probabilities(self._run_dir(request.run_id)) is not None,
        )

    def scores(self, request: pb.ScoresRequest) -> Iterator[pb.ScoreRows]:
        served, store, path = self._served(request.run_id)
        keys = node_keys(path, store.num_nodes)
        rows = select_rows(request, keys, store)
        probabilities = stored_probabilities(self._run_dir(request.run_id))
        if probabilities is None:
            raise Refused(
                f"party B holds no predictions of run {request.run_id} yet: a prediction pass of party A "
                "(vesper predict) comes first"
            )
        return score_rows(rows, keys, probabilities, store.class_names)

    # -- alignment (party_b/alignment.py) ---------------------------------------------------
    def align_exchange(self, requests: Iterator[pb.AlignPoints]) -> Iterator[pb.AlignPoints]:
        return self.alignments.exchange(requests)

    def align_finish(self, requests: Iterator[pb.AlignPoints]) -> pb.AlignSummary:
        summary = self.alignments.finish(requests)
        log.info("alignment %s: %d keys in the intersection (B's unmatched keys: see its alignment.json)",
                 summary.alignment_id, summary.size)
        return summary

    # -- FinishRun ---------------------------------------------------------------------------
    def finish_run(self, request: pb.FinishRunRequest) -> pb.FinishRunReply:
        session = self._session(request.run_id)
        with session.lock:
            session.finished = True
            session.save(self._run_dir(request.run_id))
            if session.served is not None:  # what prediction needs (party_b/prediction.py)
                session.served.save(self._run_dir(request.run_id))
            if session.record is not None:
                session.record.save(self._run_dir(request.run_id) / "received.npz")
        with self._lock:
            self._sessions.pop(request.run_id, None)
            guard = self._guards.pop(request.run_id, None)  # the run's main session ends its label guard
        if guard is not None:
            try:
                guard.close(request.status or "completed", request.reason)
            except PeerError as exc:
                log.warning("run %s: could not close B's label ledger: %s", request.run_id, exc)
        log.info("run %s finished at B: %s %s", request.run_id, request.status, request.reason)
        if request.edge_free_head_to and (request.status or "completed") == "completed":
            self._hand_edge_free_head(session, request.edge_free_head_to)
        return pb.FinishRunReply()

    def _hand_edge_free_head(self, stage: LabelSession, target_id: str) -> None:
        """FinishRunRequest.edge_free_head_to: the finished ``stage``'s decoder starts the edge-free
        head of ``target_id`` (LabelSession.start_edge_free_head); the stage is finished either way."""
        target = self._session(target_id)
        with target.lock:
            try:
                started = target.start_edge_free_head(stage)
            except ValueError as exc:
                raise Refused(str(exc)) from None
        done = "starts" if started else "does not start (it has trained)"
        log.info("run %s: its decoder %s the edge-free head of %s", stage.run_id, done, target_id)


class _Collection:
    """The chunks of one pate collection: every labelled node and every query, each once."""

    def __init__(self, session: LabelSession) -> None:
        if session.guard.mode != "pate" or session.run_id != session.guard.run_id:
            raise Refused(f"run {session.run_id!r} does not use label_privacy.mode=pate: nothing to collect")
        self.session = session
        num_nodes = session.store.num_nodes
        self.allowed = {"train": torch.from_numpy(session.store.split.train), "query": session.guard.query_ids}
        self.masks = {name: node_mask(ids, num_nodes) for name, ids in self.allowed.items()}
        self.seen = torch.zeros(num_nodes, dtype=torch.bool)
        self.received: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {"train": ([], []), "query": ([], [])}

    def add(self, chunk: pb.EvalChunk, received) -> None:  # noqa: ANN001 (LabelParty._received)
        if chunk.split not in self.received:
            raise BadRequest(f"unknown split {chunk.split!r}; expected train or query")
        try:
            ids, embeddings = received(self.session, chunk.node_ids, chunk.embeddings, self.masks[chunk.split], f"{chunk.split} nodes")
        except WireError as exc:
            raise BadRequest(str(exc)) from None
        if bool(self.seen[ids].any()):
            raise BadRequest(f"{chunk.split} node sent twice in one collection")
        self.seen[ids] = True
        self.received[chunk.split][0].append(ids)
        self.received[chunk.split][1].append(embeddings.float())

    def complete(self) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        missing = [name for name in ("train", "query") if not bool(self.seen[self.allowed[name]].all())]
        if missing:
            raise BadRequest(
                f"the collection lacks some {' and '.join(missing)} nodes: every labelled node and every query is needed"
            )
        return tuple((torch.cat(self.received[name][0]), torch.cat(self.received[name][1])) for name in ("train", "query"))


def _checked_setup(request: pb.SetupRunRequest) -> tuple[str, DecoderConfig, OptimizerConfig]:
    """The request's run id, shape, wire dtype, decoder and optimiser, each checked."""
    if not RUN_ID.fullmatch(request.run_id):
        raise BadRequest(f"run id {request.run_id!r} must match {RUN_ID.pattern}")
    if not 1 <= request.embedding_dim <= MAX_DIM or not 1 <= request.num_layers <= MAX_LAYERS:
        raise BadRequest(
            f"embedding shape d={request.embedding_dim}, L={request.num_layers} outside "
            f"1..{MAX_DIM} x 1..{MAX_LAYERS}"
        )
    try:
        wire_dtype = dtype_from_proto(request.wire_dtype)
        decoder = DecoderConfig(kind=request.decoder.kind, hidden_dim=request.decoder.hidden_dim, dropout=request.decoder.dropout)
        optimizer = OptimizerConfig(
            name=request.optimizer.name, lr=request.optimizer.lr, weight_decay=request.optimizer.weight_decay
        )
    except (WireError, ValidationError) as exc:
        raise BadRequest(f"bad run set-up: {exc}") from None
    return wire_dtype, decoder, optimizer


def _setup_reply(session: LabelSession, settings: LabelPrivacyConfig) -> pb.SetupRunReply:
    store, guard = session.store, session.guard
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


def _recorded(first: pb.EvalChunk, rest: Iterator[pb.EvalChunk], record) -> Iterator[pb.EvalChunk]:  # noqa: ANN001
    """The stream with its first chunk back in front, each later chunk in the receipt log first."""
    yield first
    for chunk in rest:
        record(kind="predict", run_id=chunk.run_id, eval_id=chunk.eval_id, num_nodes=len(chunk.node_ids))
        yield chunk
