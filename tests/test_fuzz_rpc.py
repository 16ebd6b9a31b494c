"""Fuzzing every RPC of the three services, live on loopback.

One cluster serves the module. Before any fuzzing it holds a finished real run (ledger
rows, checkpoints, receipts), an accountant run whose budget is spent, a closed one, and
party B sessions to aim at; each of those was made by the same call the fuzzing then
corrupts, so the right input is shown to succeed. Hypothesis then sends every RPC requests
that are wrong in one or more drawn ways (wrong dtype or shape, sizes past the limits,
NaN/Inf, absurd norms, bad node ids, unknown runs, replayed or skipped steps, garbage JSON,
bad tokens). Each call must be refused with a clear status whose details name one of the
problems drawn: never UNKNOWN or INTERNAL, never accepted. The last test checks that every
service still serves a real run and that neither the ledger nor any file that existed
before the fuzzing changed, except by that run. tests/test_e2e_bad_input.py holds the
hand-picked cases.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import dp_accounting as dpa
import grpc
import httpx
import pytest
import torch
from e2e import ledger, vesper
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vesper.accountant.budget import Accountant, AccountantError
from vesper.accountant.ledger_store import LedgerStore
from vesper.common.charge_token import read_token
from vesper.common.config import RunConfig
from vesper.common.dataset_files import BUNDLED
from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule, LedgerRow, RunRecord, replay
from vesper.common.wire import encode_tensor
from vesper.coordinator.processes import LocalCluster
from vesper.proto.v1 import accountant_pb2 as acc
from vesper.proto.v1 import accountant_pb2_grpc as acc_grpc
from vesper.proto.v1 import graph_party_pb2 as ga
from vesper.proto.v1 import graph_party_pb2_grpc as ga_grpc
from vesper.proto.v1 import label_party_pb2 as lp
from vesper.proto.v1 import label_party_pb2_grpc as lp_grpc
from vesper.proto.v1 import tensor_pb2

pytestmark = pytest.mark.e2e

D, L = 4, 2
NUM_NODES = 2708  # Cora
MAX_MESSAGE_MB = 1  # party B's limit here: a payload past it is cheap to build
TRAIN_RUN, PATE_RUN, FINISHED_RUN = "fuzz-train", "fuzz-pate", "fuzz-finished"
SETUP_RUN = "fuzz-setup"  # never set up: every request for it is wrong in some way
EDGE_RUN, CLOSED_RUN = "fuzz-edge", "fuzz-closed"
DELTA = 1e-5
EVENT = event_to_json(dpa.GaussianDpEvent(3.0))
PATE_SETTINGS = '{"mode": "pate", "epsilon": 2, "pate": {"teachers": 10, "queries": 20}}'
B_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
EXISTS = grpc.StatusCode.ALREADY_EXISTS
CLEAR = {INVALID, NOT_FOUND, PRECONDITION, EXHAUSTED, UNAUTHENTICATED, DENIED, EXISTS}

# examples per RPC: the default suite, and `make test-slow`
FAST, DEEP = 10, 200
DEPTHS = [pytest.param(FAST, id="fast"), pytest.param(DEEP, id="deep", marks=pytest.mark.slow)]


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples, deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- expectations ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Expect:
    """A refusal the drawn problem justifies: its status and a regular expression its details contain."""

    code: grpc.StatusCode
    fragment: str

    def matches(self, code: grpc.StatusCode, details: str) -> bool:
        return code == self.code and re.search(self.fragment, details) is not None


def assert_refused(call: Callable[[], object], expected: Sequence[Expect]) -> grpc.RpcError:
    """The call fails with a clear status naming one of the problems drawn."""
    assert expected, "a fuzz case must name at least one problem"
    try:
        outcome = call()
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
        assert code in CLEAR, f"unclear status {code.name}: {details}"
        assert any(e.matches(code, details) for e in expected), f"{code.name}: {details!r}; expected one of {expected}"
        return error
    raise AssertionError(f"accepted ({str(outcome)[:200]!r}); expected one of {expected}")


# -- the cluster and what it holds before the fuzzing ----------------------------------------
@dataclass(frozen=True)
class Snapshot:
    """What must survive the fuzzing: file digests, append-only files' bytes, every ledger."""

    digests: dict[str, str]
    appended: dict[str, bytes]
    ledgers: dict[str, dict]


@dataclass
class World:
    cluster: LocalCluster
    workdir: Path
    a: ga_grpc.GraphPartyStub
    b: lp_grpc.LabelPartyStub
    accountant: acc_grpc.AccountantStub
    auth: dict[str, tuple[tuple[str, str], ...]]  # "A", "B": metadata with each party's token
    split: lp.SetupRunReply  # TRAIN_RUN's
    pate: lp.SetupRunReply  # PATE_RUN's
    baseline_run: str
    charged_release: dict[str, object]  # EDGE_RUN's one charge, exactly as it was made
    snapshot: Snapshot | None = None
    next_step: int = 0  # TRAIN_RUN's next training step at party B
    real_runs: list[str] = field(default_factory=list)  # the real runs made after the fuzzing
    sessions: set[str] = field(default_factory=set)  # party B's

    @property
    def accountant_runs(self) -> set[str]:
        return KNOWN_ACCOUNT_RUNS | {self.baseline_run, self.pate.label_ledger_id}


APPEND_ONLY = ("receipts.jsonl",)
NOT_CHECKED_DIRS = ("logs", "config", "certs")


def _is_ledger_file(path: Path) -> bool:
    return path.name.startswith("ledger.sqlite")


def _files(workdir: Path) -> Iterator[Path]:
    for path in sorted(workdir.rglob("*")):
        relative = path.relative_to(workdir)
        if not path.is_file() or relative.parts[0] in NOT_CHECKED_DIRS:
            continue
        if path.name.endswith((".ready.json", ".tmp")) or _is_ledger_file(path):
            continue  # readiness notes are rewritten by design; the ledger is compared row by row
        yield path


def _ledgers(status_url: str) -> dict[str, dict]:
    runs = httpx.get(f"{status_url}/v1/runs", timeout=30).json()
    return {run["run_id"]: ledger(status_url, run["run_id"]) for run in runs}


def _snapshot(world: World) -> Snapshot:
    digests, appended = {}, {}
    for path in _files(world.workdir):
        relative = str(path.relative_to(world.workdir))
        if path.name in APPEND_ONLY:
            appended[relative] = path.read_bytes()
        else:
            digests[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return Snapshot(digests, appended, _ledgers(world.cluster.status_url))


def _real_run(cluster: LocalCluster, out: Path, *flags: str) -> str:
    code, output = vesper("train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--epochs", "1",
                          "--json-out", str(out), *flags)
    assert code == 0, output
    return json.loads(out.read_text())["run_id"]


def _setup_request(run_id: str, **change: object) -> lp.SetupRunRequest:
    fields: dict[str, object] = dict(
        run_id=run_id, dataset="cora", decoder=lp.DecoderSpec(kind="concat", hidden_dim=8),
        optimizer=lp.OptimizerSpec(name="adam", lr=0.01), embedding_dim=D, num_layers=L,
        wire_dtype=tensor_pb2.DTYPE_FLOAT32,
    )
    return lp.SetupRunRequest(**(fields | change))


def _create_request(run_id: str, budget: float) -> acc.CreateRunRequest:
    return acc.CreateRunRequest(
        run_id=run_id, privacy_unit="edge", accounting="visible-batch", accountant="pld", epsilon_budget=budget,
        delta=DELTA, extractor="fuzz", rules=[acc.ChargeRule(kind="train", release_event_json=EVENT)],
    )


def _good_tensor(rows: int, seed: int) -> tensor_pb2.Tensor:
    values = torch.rand(rows, D, L, generator=torch.Generator().manual_seed(seed)) * 2 - 1
    return encode_tensor(values, "float32")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    workdir = tmp_path_factory.mktemp("fuzz-rpc")
    party_b = {"max_message_mb": MAX_MESSAGE_MB, "receipt_log": str(workdir / "party_b" / "receipts.jsonl")}
    with LocalCluster(workdir, party_a={"secret_seed": 11}, party_b=party_b) as cluster, \
            grpc.insecure_channel(cluster.party_a_address) as a_channel, \
            grpc.insecure_channel(cluster.party_b_address) as b_channel, \
            grpc.insecure_channel(cluster.accountant_address) as accountant_channel:
        baseline = _real_run(cluster, workdir / "baseline.json")
        b = lp_grpc.LabelPartyStub(b_channel)
        accountant = acc_grpc.AccountantStub(accountant_channel)
        auth = {
            "A": (("authorization", f"Bearer {read_token(cluster.charge_token_file)}"),),
            "B": (("authorization", f"Bearer {read_token(cluster.label_token_file)}"),),
        }
        # EDGE_RUN's budget holds one charge, not two: every new charge there is refused
        one, two = (epsilon_of(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(3.0), n), DELTA).epsilon for n in (1, 2))
        accountant.CreateRun(_create_request(EDGE_RUN, (one + two) / 2), metadata=auth["A"], timeout=30)
        charged = dict(run_id=EDGE_RUN, release_key="train-0/0", pass_id="train-0", kind="train", num_nodes=3,
                       nodes_digest="d0", release_event_json=EVENT)
        receipt = accountant.Charge(acc.ChargeRequest(**charged), metadata=auth["A"], timeout=30)
        assert receipt.seq == 0 and receipt.counted and not receipt.replayed
        accountant.CreateRun(_create_request(CLOSED_RUN, 4.0), metadata=auth["A"], timeout=30)
        for status in ("interrupted", "failed"):
            accountant.CloseRun(acc.CloseRunRequest(run_id=CLOSED_RUN, status=status), metadata=auth["A"], timeout=30)
            if status == "interrupted":  # an interrupted run is the one ReopenRun takes back
                reopened = accountant.ReopenRun(acc.ReopenRunRequest(run_id=CLOSED_RUN), metadata=auth["A"], timeout=30)
                assert reopened.status == "active"
        split = b.SetupRun(_setup_request(TRAIN_RUN), timeout=60)
        # party A announces a run before B opens its label ledger (accountant/leases.py)
        accountant.AnnounceRun(acc.LeaseRequest(run_id=PATE_RUN, lease="fuzz-trainer", ttl_s=3600), metadata=auth["A"], timeout=30)
        pate = b.SetupRun(_setup_request(PATE_RUN, label_privacy_json=PATE_SETTINGS), timeout=60)
        b.SetupRun(_setup_request(FINISHED_RUN), timeout=60)
        b.FinishRun(lp.FinishRunRequest(run_id=FINISHED_RUN, status="completed"), timeout=60)
        world = World(
            cluster, workdir, ga_grpc.GraphPartyStub(a_channel), b, accountant, auth, split, pate, baseline, charged,
            sessions={TRAIN_RUN, PATE_RUN},
        )
        world.snapshot = _snapshot(world)
        yield world


# -- shared strategies ------------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
TOKEN_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x7E)  # what a header value may hold


@st.composite
def bad_tensors(draw: st.DrawFn, rows: int) -> tuple[tensor_pb2.Tensor, Expect]:
    """Embeddings for ``rows`` nodes, wrong in one drawn way."""
    seed = draw(st.integers(0, 2**16))
    values = torch.rand(rows, D, L, generator=torch.Generator().manual_seed(seed))
    fault = draw(st.sampled_from([
        "wrong dtype", "unknown dtype", "wrong shape", "byte count", "impossible shape", "past the transport limit",
        "non-finite", "absurd norm",
    ]))
    message = encode_tensor(values, "float32")
    if fault == "wrong dtype":
        return encode_tensor(values, "bfloat16"), Expect(INVALID, "dtype bfloat16 but this run sends float32")
    if fault == "unknown dtype":
        message.dtype = draw(st.integers(-(2**31), 2**31 - 1).filter(lambda c: c not in (1, 2)))
        return message, Expect(INVALID, "unsupported tensor dtype")
    if fault == "wrong shape":
        shape = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4).filter(lambda s: s != [rows, D, L]))
        return encode_tensor(torch.zeros(shape), "float32"), Expect(INVALID, rf"but expected \[{rows}, {D}, {L}\]")
    if fault == "byte count":
        cut = draw(st.integers(1, 16))
        shorter = draw(st.booleans()) and len(message.data) >= cut
        message.data = message.data[:-cut] if shorter else message.data + bytes(cut)
        return message, Expect(INVALID, "bytes of data for shape")
    if fault == "impossible shape":
        message.shape[:] = draw(st.one_of(
            st.lists(st.integers(2**31, 2**63 - 1), min_size=1, max_size=4),  # more elements than allowed
            st.lists(st.integers(-(2**63), -1), min_size=1, max_size=3),  # negative
            st.lists(st.integers(0, 3), min_size=9, max_size=70),  # more dimensions than any tensor here
            st.tuples(st.just(0), st.integers(2**31, 2**63 - 1), st.integers(2**31, 2**63 - 1)).map(list),
        ))
        return message, Expect(INVALID, "exceed the configured maximum|negative dimension|dimensions; at most|is empty but")
    if fault == "past the transport limit":
        message.data = bytes(MAX_MESSAGE_MB * 2**20 + draw(st.integers(1, 4096)))
        return message, Expect(EXHAUSTED, "larger than max")
    positions = draw(st.lists(st.integers(0, values.numel() - 1), min_size=1, max_size=4)) if rows else []
    if not positions:  # no element to spoil: send it one row too many instead
        return _good_tensor(rows + 1, seed), Expect(INVALID, rf"but expected \[{rows}, {D}, {L}\]")
    if fault == "non-finite":
        values.view(-1)[positions] = draw(st.sampled_from([NAN, INF, -INF]))
        return encode_tensor(values, "float32"), Expect(INVALID, "non-finite values")
    values.view(-1)[positions] = draw(st.sampled_from([1e30, -1e30, 3e38, 2e9, -1e15]))
    return encode_tensor(values, "float32"), Expect(INVALID, "values of magnitude above")


@st.composite
def good_ids(draw: st.DrawFn, allowed: Sequence[int], max_size: int = 4) -> list[int]:
    return draw(st.lists(st.sampled_from(list(allowed)), min_size=1, max_size=max_size, unique=True))


@st.composite
def bad_ids(draw: st.DrawFn, allowed: Sequence[int], forbidden: Sequence[int]) -> tuple[list[int], Expect]:
    """Node ids wrong in one drawn way: ``forbidden`` are ids of the graph the receiver does not take here."""
    ids = draw(good_ids(allowed))
    position = draw(st.integers(0, len(ids)))
    fault = draw(st.sampled_from(["negative", "duplicate", "outside the graph", "not allowed", "none"]))
    if fault == "none":
        return [], Expect(INVALID, "no node ids")
    if fault == "negative":
        ids.insert(position, draw(st.integers(-(2**63), -1)))
        return ids, Expect(INVALID, "negative node id")
    if fault == "duplicate":
        ids.insert(position, draw(st.sampled_from(ids)))
        return ids, Expect(INVALID, "duplicate node ids")
    if fault == "outside the graph":
        ids.insert(position, draw(st.integers(NUM_NODES, 2**63 - 1)))
        return ids, Expect(INVALID, rf"unknown node id \d+; the graph has {NUM_NODES} nodes")
    ids.insert(position, draw(st.sampled_from(list(forbidden))))
    return ids, Expect(INVALID, "is not in the allowed set")


UNKNOWN_DATASETS = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["/etc/passwd", "/nonexistent/graph.npz", "../cora.npz", ".", "/", "~nosuchuser/x.npz"]),
).filter(lambda t: t not in BUNDLED)


def unknown_run_ids(known: set[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=80),
        st.from_regex(B_RUN_ID, fullmatch=True),
        st.sampled_from(["../../etc/passwd", "fuzz-train ", "FUZZ-TRAIN", "fuzz-train.labels", "\x00", "runs/x"]),
    ).filter(lambda run_id: run_id not in known)


def _stream_error(call: Callable[[], Iterator[object]], replies: list[object]) -> Callable[[], None]:
    def run() -> None:
        for reply in call():
            replies.append(reply)

    return run


# -- party B: LabelParty ----------------------------------------------------------------------
def _train_forbidden(world: World) -> list[int]:
    return list(world.split.val_ids) + list(world.split.test_ids)


def _sync_next_step(world: World) -> int:
    """Party B's next training step for TRAIN_RUN, as B states it when asked for a far one."""
    step = lp.TrainStep(run_id=TRAIN_RUN, step=2**64 - 1, node_ids=[world.split.train_ids[0]], embeddings=_good_tensor(1, 0))
    error = assert_refused(lambda: list(world.b.Train(iter([step]), timeout=30)), [Expect(PRECONDITION, "out-of-order step")])
    return int(re.search(r"expected step (\d+)", error.details()).group(1))


@dataclass(frozen=True)
class TrainPlan:
    """A training stream, drawn without knowing B's next step (hypothesis needs strategies that
    do not read outside state): good steps, then one wrong in the drawn ways."""

    lead: list[tuple[list[int], bool]]  # node ids and checkpoint flag of each good step
    faults: frozenset[str]
    run_id: str  # for "run id"
    distance: int  # how far back ("replayed step") or ahead ("skipped step") the bad step is
    node_ids: list[int]
    ids_expect: Expect | None
    tensor: tensor_pb2.Tensor | None
    tensor_expect: Expect | None
    checkpoint: bool
    trailing: int  # good steps sent after the bad one, never read

    def stream(self, first: int) -> tuple[list[lp.TrainStep], list[Expect]]:
        """The steps, when party B's next step is ``first``, and the refusals they justify."""
        steps = [
            lp.TrainStep(run_id=TRAIN_RUN, step=first + i, node_ids=ids, embeddings=_good_tensor(len(ids), first + i),
                         checkpoint=checkpoint)
            for i, (ids, checkpoint) in enumerate(self.lead)
        ]
        number = first + len(self.lead)
        bad = lp.TrainStep(run_id=TRAIN_RUN, step=number, node_ids=self.node_ids, checkpoint=self.checkpoint)
        bad.embeddings.CopyFrom(self.tensor if self.tensor is not None else _good_tensor(len(self.node_ids), number))
        expects = [e for e in (self.ids_expect, self.tensor_expect) if e is not None]
        if "run id" in self.faults:
            bad.run_id = self.run_id
            expects.append(Expect(NOT_FOUND, "unknown run id") if not self.lead
                           else Expect(INVALID, "wrong run id .* on the stream of run"))
        if "replayed step" in self.faults and number > 0:
            bad.step = max(number - self.distance, 0)
        elif self.faults & {"replayed step", "skipped step"} or not expects:
            bad.step = min(number + self.distance, 2**64 - 1)
        if bad.step != number:
            expects.append(Expect(PRECONDITION, f"out-of-order step: expected step {number}, got {bad.step}"))
        return steps + [bad] + steps[: self.trailing], expects


@st.composite
def train_plans(draw: st.DrawFn, world: World) -> TrainPlan:
    train_ids = list(world.split.train_ids)
    faults = frozenset(draw(st.sets(
        st.sampled_from(["run id", "replayed step", "skipped step", "node ids", "tensor"]), min_size=1, max_size=3,
    )))
    node_ids, ids_expect = draw(good_ids(train_ids)), None
    if "node ids" in faults:
        node_ids, ids_expect = draw(bad_ids(train_ids, _train_forbidden(world)))
    tensor, tensor_expect = draw(bad_tensors(len(node_ids))) if "tensor" in faults else (None, None)
    return TrainPlan(
        lead=[(draw(good_ids(train_ids)), draw(st.booleans())) for _ in range(draw(st.integers(0, 2)))],
        faults=faults, run_id=draw(unknown_run_ids(world.sessions)), distance=draw(st.integers(1, 2**64 - 1)),
        node_ids=node_ids, ids_expect=ids_expect, tensor=tensor, tensor_expect=tensor_expect,
        checkpoint=draw(st.booleans()), trailing=draw(st.integers(0, 1)),
    )


@pytest.mark.parametrize("examples", DEPTHS)
def test_train_stream_refuses_every_bad_step_and_answers_the_good_ones(world: World, examples: int) -> None:
    world.next_step = _sync_next_step(world)

    @given(plan=train_plans(world))
    @fuzz_settings(examples)
    def check(plan: TrainPlan) -> None:
        steps, expects = plan.stream(world.next_step)
        replies: list[lp.TrainStepReply] = []
        assert_refused(_stream_error(lambda: world.b.Train(iter(steps), timeout=60), replies), expects)
        lead = len(plan.lead)
        assert [r.step for r in replies] == [world.next_step + i for i in range(lead)]
        assert all(r.run_id == TRAIN_RUN and list(r.gradient.shape) == [len(s.node_ids), D, L] for r, s in zip(replies, steps))
        world.next_step += lead
        assert _sync_next_step(world) == world.next_step  # the refused step changed nothing

    check()


@st.composite
def eval_streams(draw: st.DrawFn, world: World) -> tuple[list[lp.EvalChunk], list[Expect]]:
    """Good chunks of the validation and test nodes, then one wrong in one drawn way."""
    split = world.split
    members = {"val": list(split.val_ids), "test": list(split.test_ids)}
    eval_id = draw(st.integers(0, 2**64 - 1))
    chunks, sent = [], {"val": [], "test": []}
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(["val", "test"]))
        ids = draw(good_ids([i for i in members[name] if i not in sent[name]]))
        sent[name] += ids
        chunks.append(lp.EvalChunk(run_id=TRAIN_RUN, eval_id=eval_id, split=name, node_ids=ids, embeddings=_good_tensor(len(ids), len(chunks))))
    faults = ["unknown run", "unknown split", "node ids", "tensor", "no chunk"]
    if chunks:
        faults += ["sent twice", "second run id", "second eval id"]
    fault = draw(st.sampled_from(faults))
    if fault == "no chunk":
        return [], [Expect(INVALID, "empty evaluation stream")]
    name = draw(st.sampled_from(["val", "test"]))
    ids = draw(good_ids([i for i in members[name] if i not in sent[name]]))
    bad = lp.EvalChunk(run_id=TRAIN_RUN, eval_id=eval_id, split=name, node_ids=ids, embeddings=_good_tensor(len(ids), 99))
    if fault == "unknown run":
        bad.run_id = draw(unknown_run_ids(world.sessions))
        expect = Expect(NOT_FOUND, "unknown run id") if not chunks else Expect(INVALID, "one run id and one eval id")
    elif fault == "second run id":
        bad.run_id = draw(st.sampled_from([PATE_RUN, "other"]))
        expect = Expect(INVALID, "one run id and one eval id")
    elif fault == "second eval id":
        bad.eval_id = draw(st.integers(0, 2**64 - 1).filter(lambda e: e != eval_id))
        expect = Expect(INVALID, "one run id and one eval id")
    elif fault == "unknown split":
        bad.split = draw(st.text(max_size=12).filter(lambda s: s not in ("val", "test")))
        expect = Expect(INVALID, "unknown split .*; expected test or val")
    elif fault == "sent twice":
        bad.split = next(chunk.split for chunk in chunks)
        again = draw(st.sampled_from(sent[bad.split]))
        bad.node_ids[:] = [again]
        bad.embeddings.CopyFrom(_good_tensor(1, 98))
        expect = Expect(INVALID, "node sent twice in one evaluation")
    elif fault == "node ids":
        ids, expect = draw(bad_ids(members[name], list(split.train_ids)))
        bad.node_ids[:] = ids
        bad.embeddings.CopyFrom(_good_tensor(len(ids), 97))
    else:
        tensor, expect = draw(bad_tensors(len(ids)))
        bad.embeddings.CopyFrom(tensor)
    return chunks + [bad], [expect]


@pytest.mark.parametrize("examples", DEPTHS)
def test_evaluate_refuses_every_bad_stream(world: World, examples: int) -> None:
    split = world.split
    good = [
        lp.EvalChunk(run_id=TRAIN_RUN, eval_id=1, split=name, node_ids=list(ids), embeddings=_good_tensor(len(ids), 1))
        for name, ids in (("val", split.val_ids), ("test", split.test_ids))
    ]
    result = world.b.Evaluate(iter(good), timeout=60)  # the right input is answered
    assert {(m.split, m.count) for m in result.metrics} == {("val", len(split.val_ids)), ("test", len(split.test_ids))}

    @given(data=st.data())
    @fuzz_settings(examples)
    def check(data: st.DataObject) -> None:
        chunks, expects = data.draw(eval_streams(world))
        assert_refused(lambda: world.b.Evaluate(iter(chunks), timeout=60), expects)

    check()


@st.composite
def collect_streams(draw: st.DrawFn, world: World) -> tuple[list[lp.EvalChunk], list[Expect]]:
    """pate's collection, never complete and right: a wrong chunk, or good chunks that miss a node."""
    pate = world.pate
    members = {"train": list(pate.train_ids), "query": list(pate.query_ids)}
    forbidden = list(pate.val_ids) + list(pate.test_ids)
    chunks, sent = [], {"train": [], "query": []}
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(["train", "query"]))
        left = [i for i in members[name] if i not in sent[name]]
        if len(left) < 2:
            continue
        ids = draw(good_ids(left[:-1], max_size=8))  # the last node of each split is never sent here
        sent[name] += ids
        chunks.append(lp.EvalChunk(run_id=PATE_RUN, split=name, node_ids=ids, embeddings=_good_tensor(len(ids), len(chunks))))
    fault = draw(st.sampled_from(
        ["unknown run", "not a pate run", "unknown split", "node ids", "tensor", "incomplete", "no chunk"]
        + (["sent twice", "second run id"] if chunks else [])
    ))
    if fault == "no chunk":
        return [], [Expect(INVALID, "empty collect stream")]
    if fault == "incomplete":  # every chunk right, but a labelled node or a query is missing
        return chunks or [lp.EvalChunk(run_id=PATE_RUN, split="query", node_ids=members["query"][:1],
                                       embeddings=_good_tensor(1, 0))], [Expect(INVALID, "the collection lacks some")]
    name = draw(st.sampled_from(["train", "query"]))
    ids = draw(good_ids([i for i in members[name] if i not in sent[name]]))
    bad = lp.EvalChunk(run_id=PATE_RUN, split=name, node_ids=ids, embeddings=_good_tensor(len(ids), 99))
    if fault in ("unknown run", "not a pate run", "second run id"):
        bad.run_id = TRAIN_RUN if fault == "not a pate run" else draw(unknown_run_ids(world.sessions))
        if chunks:
            expect = Expect(INVALID, "a collect stream must carry one run id")
        elif fault == "not a pate run":
            expect = Expect(PRECONDITION, "does not use label_privacy.mode=pate")
        else:
            expect = Expect(NOT_FOUND, "unknown run id")
    elif fault == "unknown split":
        bad.split = draw(st.text(max_size=12).filter(lambda s: s not in ("train", "query")))
        expect = Expect(INVALID, "unknown split .*; expected train or query")
    elif fault == "sent twice":
        bad.split = chunks[0].split
        bad.node_ids[:] = [chunks[0].node_ids[0]]
        bad.embeddings.CopyFrom(_good_tensor(1, 98))
        expect = Expect(INVALID, "node sent twice in one collection")
    elif fault == "node ids":
        ids, expect = draw(bad_ids(members[name], forbidden))
        bad.node_ids[:] = ids
        bad.embeddings.CopyFrom(_good_tensor(len(ids), 97))
    else:
        tensor, expect = draw(bad_tensors(len(ids)))
        bad.embeddings.CopyFrom(tensor)
    return chunks + [bad], [expect]


@pytest.mark.parametrize("examples", DEPTHS)
def test_collect_refuses_every_bad_or_incomplete_collection(world: World, examples: int) -> None:
    """A right collection is answered and charged (tests/test_e2e_bad_input.py); none is drawn here."""

    @given(data=st.data())
    @fuzz_settings(examples)
    def check(data: st.DataObject) -> None:
        chunks, expects = data.draw(collect_streams(world))
        assert_refused(lambda: world.b.Collect(iter(chunks), timeout=60), expects)

    check()
    label_ledger = world.pate.label_ledger_id
    assert ledger(world.cluster.status_url, label_ledger)["rows"] == []  # nothing was answered, nothing charged


# SetupRun: each fault makes the request wrong on its own, whatever else is drawn
def _setup_fault(name: str, draw: st.DrawFn, request: lp.SetupRunRequest) -> Expect:
    if name == "run id":
        request.run_id = draw(st.one_of(
            st.just(""), st.text(max_size=30).filter(lambda t: not B_RUN_ID.match(t)),
            st.from_regex(r"[a-z0-9]{65,90}", fullmatch=True),
        ))
        return Expect(INVALID, "run id .* must match")
    if name == "set up already":
        request.run_id = TRAIN_RUN
        return Expect(EXISTS, f"run '{TRAIN_RUN}' is already set up")
    if name in ("embedding dim", "layers"):
        wrong = draw(st.one_of(st.just(0), st.integers(4097 if name == "embedding dim" else 9, 2**32 - 1)))
        setattr(request, "embedding_dim" if name == "embedding dim" else "num_layers", wrong)
        return Expect(INVALID, "embedding shape d=.* outside")
    if name == "wire dtype":
        request.wire_dtype = draw(st.integers(-(2**31), 2**31 - 1).filter(lambda c: c not in (1, 2)))
        return Expect(INVALID, "unsupported tensor dtype")
    if name == "decoder":
        spec = draw(st.sampled_from([
            lp.DecoderSpec(kind="transformer", hidden_dim=8), lp.DecoderSpec(kind="", hidden_dim=8),
            lp.DecoderSpec(kind="concat", hidden_dim=0), lp.DecoderSpec(kind="gru", hidden_dim=16385),
            lp.DecoderSpec(kind="concat", hidden_dim=8, dropout=1.0), lp.DecoderSpec(kind="concat", hidden_dim=8, dropout=-0.5),
            lp.DecoderSpec(kind="concat", hidden_dim=8, dropout=NAN),
        ]))
        request.decoder.CopyFrom(spec)
        return Expect(INVALID, "bad run set-up")
    if name == "optimizer":
        spec = draw(st.sampled_from([
            lp.OptimizerSpec(name="rmsprop", lr=0.01), lp.OptimizerSpec(name="adam", lr=0.0),
            lp.OptimizerSpec(name="adam", lr=-1.0), lp.OptimizerSpec(name="sgd", lr=11.0),
            lp.OptimizerSpec(name="adam", lr=NAN), lp.OptimizerSpec(name="adam", lr=INF),
            lp.OptimizerSpec(name="adam", lr=0.01, weight_decay=-1.0), lp.OptimizerSpec(name="adam", lr=0.01, weight_decay=NAN),
        ]))
        request.optimizer.CopyFrom(spec)
        return Expect(INVALID, "bad run set-up")
    if name == "dataset":
        request.dataset = draw(UNKNOWN_DATASETS)
        return Expect(NOT_FOUND, "unknown dataset|is not an .npz file")
    if name == "label privacy":
        request.label_privacy_json = draw(st.one_of(
            st.text(min_size=1, max_size=40).filter(_not_json),
            st.sampled_from(['{"mode": "sometimes"}', '{"zz": 1}', "[]", "null", '{"mode": "rr"}', '{"epsilon": -1}']),
        ))
        return Expect(INVALID, "bad label privacy settings")
    if name == "label run id":
        request.label_run_id = draw(st.text(min_size=1, max_size=30).filter(lambda t: not B_RUN_ID.match(t)))
        return Expect(INVALID, "label run id .* must match")
    assert name == "resume"
    request.resume, request.resume_step = True, draw(st.integers(1, 2**64 - 1))
    return Expect(PRECONDITION, "has no checkpoint of run")


SETUP_FAULTS = ["run id", "set up already", "embedding dim", "layers", "wire dtype", "decoder", "optimizer", "dataset",
                "label privacy", "label run id", "resume"]


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


@st.composite
def setup_requests(draw: st.DrawFn) -> tuple[lp.SetupRunRequest, list[Expect]]:
    faults = draw(st.sets(st.sampled_from(SETUP_FAULTS), min_size=1, max_size=3))
    if "set up already" in faults:
        faults.discard("resume")  # a resume replaces the session it names (test_a_failed_resume_leaves_the_session_as_it_was)
    request = _setup_request(SETUP_RUN)
    return request, [_setup_fault(name, draw, request) for name in sorted(faults)]


@pytest.mark.parametrize("examples", DEPTHS)
def test_setup_run_refuses_every_bad_request(world: World, examples: int) -> None:
    """The same request with a fresh run id and no fault set up TRAIN_RUN (the fixture)."""

    @given(case=setup_requests())
    @fuzz_settings(examples)
    def check(case: tuple[lp.SetupRunRequest, list[Expect]]) -> None:
        request, expects = case
        assert_refused(lambda: world.b.SetupRun(request, timeout=60), expects)

    check()
    assert _sync_next_step(world) == world.next_step  # TRAIN_RUN's session is untouched


@pytest.mark.parametrize("examples", DEPTHS)
def test_finish_run_refuses_unknown_runs(world: World, examples: int) -> None:
    """FINISHED_RUN was finished by the same call (the fixture)."""

    @given(run_id=unknown_run_ids(world.sessions | {FINISHED_RUN}), status=st.text(max_size=20), reason=st.text(max_size=40))
    @fuzz_settings(examples)
    def check(run_id: str, status: str, reason: str) -> None:
        request = lp.FinishRunRequest(run_id=run_id, status=status, reason=reason)
        assert_refused(lambda: world.b.FinishRun(request, timeout=30), [Expect(NOT_FOUND, "unknown run id")])

    check()


# -- party A: GraphParty.StartRun -------------------------------------------------------------
# (path, value): each breaks RunConfig on its own
BAD_CONFIG_VALUES: list[tuple[tuple[str, ...], object]] = [
    (("epochs",), 0), (("epochs",), 100_001), (("epochs",), "many"), (("epochs",), 1.5), (("batch_size",), 0),
    (("seed",), -1), (("seed",), 1e30), (("split_seed",), -3), (("wire_dtype",), "float64"), (("eval_chunk",), 0),
    (("privacy", "epsilon"), 0), (("privacy", "epsilon"), -8), (("privacy", "delta"), 1.5), (("privacy", "delta"), 0),
    (("privacy", "accounting"), "sometimes"), (("privacy", "accountant"), "abacus"),
    (("privacy", "edge_sample_rate"), 1.0), (("extractor", "name"), "Bad Name!"), (("extractor", "layers"), 0),
    (("extractor", "layers"), 9), (("extractor", "dim"), 0), (("extractor", "dim"), 4097), (("extractor", "fanout"), -1),
    (("extractor", "dropout"), 1.0), (("extractor", "noise_multiplier"), 0), (("decoder", "kind"), "transformer"),
    (("decoder", "hidden_dim"), 0), (("optimizer", "name"), "rmsprop"), (("optimizer", "lr"), 11),
    (("label_privacy", "mode"), "sometimes"), (("audit", "canaries"), -1), (("record_gradients",), "maybe"),
    (("privacy",), "eight"), (("extractor",), [1, 2]),
]


def _put(config: dict, path: tuple[str, ...], value: object) -> None:
    for key in path[:-1]:
        if not isinstance(config.get(key), dict):
            config[key] = {}
        config = config[key]
    config[path[-1]] = value


@st.composite
def start_requests(draw: st.DrawFn, world: World) -> tuple[ga.StartRunRequest, list[Expect]]:
    invalid_config = Expect(INVALID, "invalid run configuration")
    mode = draw(st.sampled_from(["text", "config", "config", "resume"]))
    if mode == "text":
        text = draw(st.one_of(
            st.text(min_size=1, max_size=60).filter(_not_json),
            st.one_of(st.integers(), st.lists(st.integers(), max_size=3), st.text(max_size=10), st.none(),
                      st.floats(allow_nan=False)).map(json.dumps),
        ))
        return ga.StartRunRequest(run_config_json=text), [invalid_config]
    if mode == "resume":
        fault = draw(st.sampled_from(["malformed id", "unknown run", "settings too"]))
        if fault == "malformed id":
            run_id = draw(st.text(min_size=1, max_size=30).filter(lambda t: not re.fullmatch(r"[0-9a-f]{12}", t)))
            return ga.StartRunRequest(resume_run_id=run_id), [Expect(INVALID, "must match")]
        if fault == "unknown run":
            run_id = draw(st.from_regex(r"[0-9a-f]{12}", fullmatch=True).filter(lambda t: t != world.baseline_run))
            return ga.StartRunRequest(resume_run_id=run_id), [Expect(PRECONDITION, f"cannot resume run {run_id}")]
        request = ga.StartRunRequest(resume_run_id=world.baseline_run, run_config_json=json.dumps({"epochs": 2}))
        return request, [Expect(INVALID, "takes its settings from party A's record")]
    config: dict = {"dataset": "cora", "epochs": 1}
    expects = []
    faults = draw(st.sets(st.sampled_from(["unknown field", "bad value", "dataset", "d_min"]), min_size=1, max_size=3))
    if "unknown field" in faults:
        key = draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in RunConfig.model_fields))
        config[key] = draw(st.one_of(st.integers(), st.text(max_size=5), st.none()))
        expects.append(invalid_config)
    if "bad value" in faults:
        for path, value in draw(st.lists(st.sampled_from(BAD_CONFIG_VALUES), min_size=1, max_size=2)):
            _put(config, path, value)
        expects.append(invalid_config)
    if "d_min" in faults:
        fanout = draw(st.integers(1, 20))
        for key, value in (("name", "pmp-gcn"), ("fanout", fanout), ("d_min", fanout + draw(st.integers(1, 50)))):
            _put(config, ("extractor", key), value)
        expects.append(Expect(INVALID, "exceeds extractor.fanout"))
    if "dataset" in faults or not expects:
        config["dataset"] = draw(UNKNOWN_DATASETS)
        expects.append(Expect(NOT_FOUND, "unknown dataset|is not an .npz file"))
    return ga.StartRunRequest(run_config_json=json.dumps(config)), expects


@pytest.mark.parametrize("examples", DEPTHS)
def test_start_run_refuses_every_bad_configuration(world: World, examples: int) -> None:
    """The right request trains: the module's first and last real runs."""
    runs_before = set(_ledgers(world.cluster.status_url))

    @given(data=st.data())
    @fuzz_settings(examples)
    def check(data: st.DataObject) -> None:
        request, expects = data.draw(start_requests(world))
        assert_refused(lambda: list(world.a.StartRun(request, timeout=60)), expects)

    check()
    assert set(_ledgers(world.cluster.status_url)) == runs_before  # no refused run reached the accountant


# -- the accountant ---------------------------------------------------------------------------
KNOWN_ACCOUNT_RUNS = {EDGE_RUN, CLOSED_RUN}


def _plan(releases: int = 10) -> acc.ReleasePlan:
    return acc.ReleasePlan(passes=[acc.PlannedPass(kind="train", releases=releases)], rules=[acc.PlanRule(kind="train")])


BAD_DELTAS = st.sampled_from([0.0, 1.0, 1.5, -1e-5, NAN, INF, -INF])
BAD_EVENTS = st.one_of(
    st.text(min_size=1, max_size=40).filter(_not_json),
    st.sampled_from([
        "{}", "[]", "null", '{"type": "LaplaceDpEvent"}', '{"type": "GaussianDpEvent", "noise_multiplier": -1}',
        '{"type": "GaussianDpEvent", "noise_multiplier": NaN}', '{"type": "NoSuchDpEvent"}',
        '{"type": "PoissonSampledDpEvent", "sampling_probability": 2, "event": {"type": "GaussianDpEvent", "noise_multiplier": 1}}',
        '{"type": "GaussianDpEvent", "noise_multiplier": 1, "extra": 2}', '{"type": "ComposedDpEvent", "events": 3}',
    ]),
)


def _bad_accounting_setting(
    draw: st.DrawFn, request: acc.CalibrateRequest | acc.EstimateRequest, fault: str, expects: list[Expect]
) -> bool:
    """The faults Calibrate and Estimate share (the same delta, accounting and accountant
    fields): applies ``fault`` if it is one of them and says whether it was."""
    if fault == "delta":
        request.delta = draw(BAD_DELTAS)
        expects.append(Expect(INVALID, "delta must be in"))
    elif fault == "accounting":
        request.accounting = draw(st.text(min_size=1, max_size=12).filter(lambda a: a not in ("visible-batch", "hidden-batch", "labels")))
        expects.append(Expect(INVALID, "unknown accounting mode"))
    elif fault == "accountant":
        request.accountant = draw(st.text(min_size=1, max_size=12).filter(lambda a: a not in ("pld", "rdp")))
        expects.append(Expect(INVALID, "unknown accountant"))
    else:
        return False
    return True


@st.composite
def calibrate_requests(draw: st.DrawFn) -> tuple[acc.CalibrateRequest, list[Expect]]:
    request = acc.CalibrateRequest(mechanism="gaussian", plan=_plan(), target_epsilon=4.0, delta=DELTA)
    expects = []
    for fault in sorted(draw(st.sets(st.sampled_from(
        ["mechanism", "epsilon", "delta", "accounting", "accountant", "pass without rule", "rule", "two rules", "nothing"]
    ), min_size=1, max_size=3))):
        if _bad_accounting_setting(draw, request, fault, expects):
            continue
        if fault == "mechanism":
            request.mechanism = draw(st.text(max_size=12).filter(lambda m: m != "gaussian"))
            expects.append(Expect(INVALID, "unknown mechanism"))
        elif fault == "epsilon":
            request.target_epsilon = draw(st.sampled_from([0.0, -1.0, NAN, INF, -INF]))
            expects.append(Expect(INVALID, "target epsilon must be finite and > 0"))
        elif fault == "pass without rule":
            request.plan.passes.append(acc.PlannedPass(kind=draw(st.sampled_from(["eval", "one-shot", "pre-train"])), releases=3))
            expects.append(Expect(INVALID, "no rule for"))
        elif fault == "rule":
            rule = draw(st.sampled_from([
                acc.PlanRule(kind="training"), acc.PlanRule(kind="train", sampling_probability=1.5),
                acc.PlanRule(kind="train", sampling_probability=-0.5), acc.PlanRule(kind="train", noise_scale=-2.0),
                acc.PlanRule(kind="train", mechanism="laplace"), acc.PlanRule(kind="train", mechanism="mixture-of-gaussians"),
                acc.PlanRule(kind="train", sampling_probability=NAN), acc.PlanRule(kind="train", noise_scale=NAN),
            ]))
            request.plan.rules[0].CopyFrom(rule)
            expects.append(Expect(INVALID, "in the request: |no rule for"))
        elif fault == "two rules":
            request.plan.rules.append(acc.PlanRule(kind="train"))
            expects.append(Expect(INVALID, "one rule per kind"))
        else:
            request.plan.passes[0].releases = 0
            expects.append(Expect(INVALID, "the plan counts no release"))
    return request, expects


@pytest.mark.parametrize("examples", DEPTHS)
def test_calibrate_refuses_every_bad_plan(world: World, examples: int) -> None:
    right = world.accountant.Calibrate(acc.CalibrateRequest(mechanism="gaussian", plan=_plan(), target_epsilon=4.0, delta=DELTA), timeout=60)
    assert right.noise_multiplier > 0 and right.epsilon <= 4.0

    @given(case=calibrate_requests())
    @fuzz_settings(examples)
    def check(case: tuple[acc.CalibrateRequest, list[Expect]]) -> None:
        request, expects = case
        assert_refused(lambda: world.accountant.Calibrate(request, timeout=60), expects)

    check()


@st.composite
def estimate_requests(draw: st.DrawFn) -> tuple[acc.EstimateRequest, list[Expect]]:
    request = acc.EstimateRequest(
        rules=[acc.ChargeRule(kind="train", release_event_json=EVENT)], passes=[acc.PlannedPass(kind="train", releases=10)],
        delta=DELTA,
    )
    expects = []
    for fault in sorted(draw(st.sets(st.sampled_from(
        ["event", "no train rule", "two rules", "rule kind", "delta", "accounting", "accountant", "pass without rule", "hidden-batch"]
    ), min_size=1, max_size=3))):
        if _bad_accounting_setting(draw, request, fault, expects):
            continue
        if fault == "event":
            request.rules[0].release_event_json = draw(BAD_EVENTS)
            expects.append(Expect(INVALID, "bad release event"))
        elif fault == "no train rule":
            request.rules[0].kind = "eval"
            expects.append(Expect(INVALID, "needs a rule for its train releases|no rule for"))
        elif fault == "two rules":
            request.rules.append(acc.ChargeRule(kind=request.rules[0].kind, release_event_json=EVENT))
            expects.append(Expect(INVALID, "one rule per kind"))
        elif fault == "rule kind":
            request.rules.append(acc.ChargeRule(kind=draw(st.text(max_size=10).filter(
                lambda k: k not in ("train", "eval", "one-shot", "pre-train"))), release_event_json=EVENT))
            expects.append(Expect(INVALID, "in the request: "))
        elif fault == "pass without rule":
            request.passes.append(acc.PlannedPass(kind="one-shot", releases=draw(st.integers(1, 2**64 - 1))))
            expects.append(Expect(INVALID, "no rule for one-shot"))
        else:
            request.accounting = draw(st.sampled_from(["hidden-batch", "labels"]))
            expects.append(Expect(INVALID, "hidden-batch training releases must be|a label ledger charges"))
    return request, expects


@pytest.mark.parametrize("examples", DEPTHS)
def test_estimate_refuses_every_bad_plan(world: World, examples: int) -> None:
    right = world.accountant.Estimate(acc.EstimateRequest(
        rules=[acc.ChargeRule(kind="train", release_event_json=EVENT)], passes=[acc.PlannedPass(kind="train", releases=10)],
        delta=DELTA,
    ), timeout=60)
    assert right.counted_releases == 10 and right.epsilon > 0

    @given(case=estimate_requests())
    @fuzz_settings(examples)
    def check(case: tuple[acc.EstimateRequest, list[Expect]]) -> None:
        request, expects = case
        assert_refused(lambda: world.accountant.Estimate(request, timeout=60), expects)

    check()


@st.composite
def credentials(draw: st.DrawFn, world: World, needed: str) -> tuple[tuple[tuple[str, str], ...], Expect | None]:
    """The metadata of a spending call: usually ``needed``'s token, else none, a bad one, or the other party's."""
    kind = draw(st.sampled_from(["right", "right", "none", "garbage", "not bearer", "other party"]))
    if kind == "right":
        return world.auth[needed], None
    if kind == "none":
        return (), Expect(UNAUTHENTICATED, "needs a charge token")
    if kind == "other party":
        return world.auth["B" if needed == "A" else "A"], Expect(DENIED, "needs party A's charge token")
    token = draw(st.text(TOKEN_CHARS, max_size=40))
    value = f"Bearer {token}" if kind == "garbage" else token
    return (("authorization", value),), Expect(UNAUTHENTICATED, "needs a charge token")


@st.composite
def create_requests(draw: st.DrawFn, world: World) -> tuple[acc.CreateRunRequest, tuple, list[Expect]]:
    request = _create_request("fuzz-new-run", 4.0)
    metadata, auth_expect = draw(credentials(world, "A"))
    expects = [auth_expect] if auth_expect else []
    faults = draw(st.sets(st.sampled_from([
        "run id taken", "run id length", "unit", "accounting", "accountant", "delta", "budget", "note", "no train rule",
        "two rules", "event", "details not json", "details not an object",
    ]), min_size=0 if expects else 1, max_size=3))
    for fault in sorted(faults):
        if fault == "run id taken":
            request.run_id = draw(st.sampled_from(sorted(world.accountant_runs)))
            expects.append(Expect(EXISTS, "already exists"))
            if request.run_id.endswith(".labels"):  # B's label ledgers: only B opens those ids
                expects.append(Expect(INVALID, "names party B's label ledgers"))
        elif fault == "run id length":
            request.run_id = draw(st.sampled_from(["", "r" * 129, "x" * 200]))
            expects.append(Expect(INVALID, r"run id.* 1 to 128"))
        elif fault == "unit":  # a unit of party A's with a mode that is not: refused, whoever asks
            request.accounting = "labels"
            expects.append(Expect(INVALID, "privacy unit 'edge' with accounting 'labels'|a label ledger charges"))
        elif fault == "accounting":
            request.accounting = draw(st.text(max_size=12).filter(lambda a: a not in ("visible-batch", "hidden-batch", "labels")))
            expects.append(Expect(INVALID, "unknown accounting mode"))
        elif fault == "accountant":
            request.accountant = draw(st.text(min_size=1, max_size=12).filter(lambda a: a not in ("pld", "rdp")))
            expects.append(Expect(INVALID, "unknown accountant"))
        elif fault == "delta":
            request.delta = draw(BAD_DELTAS)
            expects.append(Expect(INVALID, "delta must be in"))
        elif fault == "budget":
            request.epsilon_budget = draw(st.sampled_from([0.0, -1.0, NAN, -INF]))
            expects.append(Expect(INVALID, "epsilon budget must be > 0"))
        elif fault == "note":
            request.assumption_note = "n" * draw(st.integers(1001, 5000))
            expects.append(Expect(INVALID, "limited to 1000 characters"))
        elif fault == "no train rule":
            request.rules[0].kind = "eval"
            expects.append(Expect(INVALID, "needs a rule for its train releases"))
        elif fault == "two rules":
            request.rules.append(acc.ChargeRule(kind=request.rules[0].kind, release_event_json=EVENT))
            expects.append(Expect(INVALID, "one rule per kind"))
        elif fault == "event":
            request.rules[0].release_event_json = draw(BAD_EVENTS)
            expects.append(Expect(INVALID, "bad release event"))
        elif fault == "details not json":
            request.details_json = draw(st.text(min_size=1, max_size=40).filter(_not_json))
            expects.append(Expect(INVALID, "details_json is not JSON"))
        else:
            request.details_json = json.dumps(draw(st.one_of(st.integers(), st.lists(st.integers(), max_size=3), st.text(max_size=8))))
            expects.append(Expect(INVALID, "invalid RunRecord in the request: "))
    return request, metadata, expects


@pytest.mark.parametrize("examples", DEPTHS)
def test_create_run_refuses_every_bad_request(world: World, examples: int) -> None:
    """The same request with a fresh run id and no fault created EDGE_RUN (the fixture)."""

    @given(data=st.data())
    @fuzz_settings(examples)
    def check(data: st.DataObject) -> None:
        request, metadata, expects = data.draw(create_requests(world))
        assert_refused(lambda: world.accountant.CreateRun(request, metadata=metadata, timeout=30), expects)

    check()


@st.composite
def charge_requests(draw: st.DrawFn, world: World) -> tuple[acc.ChargeRequest, tuple, list[Expect]]:
    """A charge to EDGE_RUN, whose budget is spent: even a right new release is refused (RESOURCE_EXHAUSTED)."""
    request = acc.ChargeRequest(**world.charged_release)
    request.release_key = draw(st.text(min_size=1, max_size=40).filter(lambda k: k != world.charged_release["release_key"]))
    request.pass_id = draw(st.sampled_from(["train-0", "train-1", "train-7"]))
    metadata, auth_expect = draw(credentials(world, "A"))
    expects = [auth_expect] if auth_expect else []
    budget = Expect(EXHAUSTED, "budget exhausted")
    for fault in sorted(draw(st.sets(st.sampled_from([
        "unknown run", "key", "kind", "no rule", "pass id", "no nodes", "event", "other event", "changed retry", "pass kind",
    ]), max_size=3))):
        if fault == "unknown run":
            request.run_id = draw(unknown_run_ids(world.accountant_runs))
            expects.append(Expect(NOT_FOUND, "unknown run id"))
        elif fault == "key":
            request.release_key = draw(st.sampled_from(["", "k" * 129]))
            expects.append(Expect(INVALID, "release key of 1 to 128 characters"))
        elif fault == "kind":
            request.kind = draw(st.text(max_size=10).filter(lambda k: k not in ("train", "eval", "one-shot", "pre-train")))
            expects.append(Expect(INVALID, "kind must be one of"))
        elif fault == "no rule":
            request.kind = draw(st.sampled_from(["eval", "one-shot", "pre-train"]))
            expects.append(Expect(INVALID, "has no rule for"))
        elif fault == "pass id":
            request.pass_id = ""
            expects.append(Expect(INVALID, "needs a pass id and at least one node"))
        elif fault == "no nodes":
            request.num_nodes = 0
            expects.append(Expect(INVALID, "needs a pass id and at least one node"))
        elif fault == "event":
            request.release_event_json = draw(BAD_EVENTS)
            expects.append(Expect(INVALID, "bad release event"))
        elif fault == "other event":
            request.release_event_json = event_to_json(dpa.GaussianDpEvent(draw(st.floats(0.01, 100).filter(lambda z: z != 3.0))))
            expects.append(Expect(INVALID, "differs from the one declared"))
        elif fault == "changed retry":  # the charged release's key, with something else changed
            request.release_key = world.charged_release["release_key"]
            request.nodes_digest = draw(st.text(max_size=20).filter(lambda d: d != world.charged_release["nodes_digest"]))
            expects.append(Expect(EXISTS, "was charged for a different release"))
        else:
            request.pass_id = "train-0"
            request.kind = draw(st.sampled_from(["eval", "one-shot"]))
            expects.append(Expect(INVALID, "holds train releases|has no rule for"))
    if request.release_key == world.charged_release["release_key"]:
        # a retry of the charged key differs in at least one field the accountant compares
        expects.append(Expect(EXISTS, "was charged for a different release"))
    return request, metadata, expects + [budget]


@pytest.mark.parametrize("examples", DEPTHS)
def test_charge_refuses_every_bad_or_unaffordable_release_and_replays_the_charged_one(world: World, examples: int) -> None:
    rows_before = ledger(world.cluster.status_url, EDGE_RUN)["rows"]

    @given(data=st.data(), exact_retry=st.integers(0, 9))
    @fuzz_settings(examples)
    def check(data: st.DataObject, exact_retry: int) -> None:
        if exact_retry == 0:  # the charged release itself, retried: its receipt, nothing charged
            receipt = world.accountant.Charge(acc.ChargeRequest(**world.charged_release), metadata=world.auth["A"], timeout=30)
            assert receipt.replayed and receipt.seq == 0 and receipt.counted
            return
        request, metadata, expects = data.draw(charge_requests(world))
        assert_refused(lambda: world.accountant.Charge(request, metadata=metadata, timeout=30), expects)

    check()
    assert ledger(world.cluster.status_url, EDGE_RUN)["rows"] == rows_before


@pytest.mark.parametrize("examples", DEPTHS)
def test_get_run_refuses_unknown_runs(world: World, examples: int) -> None:
    assert world.accountant.GetRun(acc.GetRunRequest(run_id=EDGE_RUN), timeout=30).charges == 1

    @given(run_id=unknown_run_ids(world.accountant_runs))
    @fuzz_settings(examples)
    def check(run_id: str) -> None:
        assert_refused(lambda: world.accountant.GetRun(acc.GetRunRequest(run_id=run_id), timeout=30),
                       [Expect(NOT_FOUND, "unknown run id")])

    check()


CLOSE_STATUSES = ("completed", "failed", "refused", "cancelled", "interrupted")


@st.composite
def close_requests(draw: st.DrawFn, world: World, rpc: str) -> tuple[object, tuple, list[Expect]]:
    """CloseRun of EDGE_RUN (never with a status it takes) or ReopenRun of CLOSED_RUN (failed, not interrupted)."""
    metadata, auth_expect = draw(credentials(world, "A"))
    expects = [auth_expect] if auth_expect else []
    run_id = EDGE_RUN if rpc == "close" else CLOSED_RUN
    if draw(st.booleans()):
        run_id = draw(unknown_run_ids(world.accountant_runs))
        expects.append(Expect(NOT_FOUND, "unknown run id"))
    if rpc == "reopen":
        expects.append(Expect(PRECONDITION, "only an interrupted run can be reopened"))
        return acc.ReopenRunRequest(run_id=run_id, reason=draw(st.text(max_size=30))), metadata, expects
    status = draw(st.text(max_size=15).filter(lambda s: s not in CLOSE_STATUSES))
    expects.append(Expect(INVALID, "cannot close a run as"))
    return acc.CloseRunRequest(run_id=run_id, status=status, reason=draw(st.text(max_size=30))), metadata, expects


@pytest.mark.parametrize("examples", DEPTHS)
def test_close_and_reopen_refuse_bad_requests(world: World, examples: int) -> None:
    """CLOSED_RUN was closed, reopened while interrupted, and closed again by the same calls (the fixture)."""

    @given(data=st.data(), rpc=st.sampled_from(["close", "reopen"]))
    @fuzz_settings(examples)
    def check(data: st.DataObject, rpc: str) -> None:
        request, metadata, expects = data.draw(close_requests(world, rpc))
        call = world.accountant.CloseRun if rpc == "close" else world.accountant.ReopenRun
        assert_refused(lambda: call(request, metadata=metadata, timeout=30), expects)

    check()
    statuses = {run_id: world.accountant.GetRun(acc.GetRunRequest(run_id=run_id), timeout=30).status for run_id in KNOWN_ACCOUNT_RUNS}
    assert statuses == {EDGE_RUN: "active", CLOSED_RUN: "failed"}


# -- bugs the fuzzing found outside this test's files, fixed: their regression tests -----------
def assert_answered_clearly(call: Callable[[], object]) -> object | None:
    """The call answers, or is refused with a clear status (never UNKNOWN or INTERNAL)."""
    try:
        return call()
    except grpc.RpcError as error:
        assert error.code() in CLEAR, f"unclear status {error.code().name}: {error.details()}"
        return None


def test_a_noise_multiplier_too_small_to_matter_is_answered_clearly(world: World) -> None:
    tiny = event_to_json(dpa.GaussianDpEvent(1e-300))
    request = acc.EstimateRequest(rules=[acc.ChargeRule(kind="train", release_event_json=tiny)],
                                  passes=[acc.PlannedPass(kind="train", releases=10)], delta=DELTA)
    reply = assert_answered_clearly(lambda: world.accountant.Estimate(request, timeout=60))
    assert reply is None or reply.epsilon == INF  # next to no noise: no privacy
    plan = acc.ReleasePlan(passes=[acc.PlannedPass(kind="train", releases=10)], rules=[acc.PlanRule(kind="train", noise_scale=1e-300)])
    request = acc.CalibrateRequest(mechanism="gaussian", plan=plan, target_epsilon=4.0, delta=DELTA)
    assert_refused(lambda: world.accountant.Calibrate(request, timeout=60), [Expect(INVALID, "")])


def test_deeply_nested_json_is_refused_clearly(world: World) -> None:
    deep = "[" * 5000 + "]" * 5000
    request = acc.EstimateRequest(rules=[acc.ChargeRule(kind="train", release_event_json=deep)],
                                  passes=[acc.PlannedPass(kind="train", releases=10)], delta=DELTA)
    assert_refused(lambda: world.accountant.Estimate(request, timeout=60), [Expect(INVALID, "bad release event")])
    taken = _create_request(EDGE_RUN, 4.0)  # an existing id: even once parsed, nothing is created
    taken.details_json = deep
    assert_refused(lambda: world.accountant.CreateRun(taken, metadata=world.auth["A"], timeout=60),
                   [Expect(INVALID, "details_json"), Expect(EXISTS, "already exists")])


def test_a_huge_unknown_run_id_gets_its_own_status(world: World) -> None:
    huge = "x" * 20_000
    assert_refused(lambda: world.accountant.GetRun(acc.GetRunRequest(run_id=huge), timeout=30),
                   [Expect(NOT_FOUND, "unknown run id")])
    assert_refused(lambda: world.b.FinishRun(lp.FinishRunRequest(run_id=huge), timeout=30),
                   [Expect(NOT_FOUND, "unknown run id")])


def test_a_failed_resume_leaves_the_session_as_it_was(world: World) -> None:
    victim = "fuzz-resume-victim"
    world.sessions.add(victim)
    split = world.b.SetupRun(_setup_request(victim), timeout=60)
    assert_refused(lambda: world.b.SetupRun(_setup_request(victim, resume=True, resume_step=7), timeout=60),
                   [Expect(PRECONDITION, "has no checkpoint")])
    step = lp.TrainStep(run_id=victim, step=0, node_ids=list(split.train_ids[:2]), embeddings=_good_tensor(2, 0))
    assert [r.step for r in world.b.Train(iter([step]), timeout=60)] == [0]


def test_an_infinite_weight_decay_is_refused(world: World) -> None:
    world.sessions.add("fuzz-weight-decay")
    request = _setup_request("fuzz-weight-decay", optimizer=lp.OptimizerSpec(name="adam", lr=0.01, weight_decay=INF))
    assert_refused(lambda: world.b.SetupRun(request, timeout=60), [Expect(INVALID, "bad run set-up")])


def test_a_home_directory_of_nobody_is_an_unknown_dataset(world: World) -> None:
    dataset = "~nosuchuser/graph.npz"
    request = ga.StartRunRequest(run_config_json=json.dumps({"dataset": dataset, "epochs": 1}))
    assert_refused(lambda: list(world.a.StartRun(request, timeout=60)), [Expect(NOT_FOUND, "nosuchuser")])
    assert_refused(lambda: world.b.SetupRun(_setup_request(SETUP_RUN, dataset=dataset), timeout=60),
                   [Expect(NOT_FOUND, "nosuchuser")])


def test_a_run_id_with_a_trailing_newline_is_refused(world: World) -> None:
    world.sessions.add("fuzz-newline\n")
    assert_refused(lambda: world.b.SetupRun(_setup_request("fuzz-newline\n"), timeout=60), [Expect(INVALID, "must match")])


def test_an_unknown_extractor_is_refused_before_the_run_starts(world: World) -> None:
    request = ga.StartRunRequest(run_config_json=json.dumps({"dataset": "cora", "epochs": 1, "extractor": {"name": "nosuch"}}))
    assert_refused(lambda: list(world.a.StartRun(request, timeout=60)), [Expect(INVALID, "unknown extractor 'nosuch'")])


def _digests(directory: Path) -> dict[str, str]:
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def _accountant(tmp_path: Path) -> Accountant:
    return Accountant(LedgerStore(tmp_path / "ledger.sqlite"))


def _create(accountant: Accountant, run_id: str, unit: str = "edge") -> None:
    accountant.create_run(run_id, unit, "visible-batch", "pld", 4.0, DELTA, [ChargeRule(kind="train", release_event=EVENT,
                          participation_bound=None)], "fuzz", {})


def test_the_accountant_creates_runs_of_party_a_units_with_plain_ids(tmp_path: Path) -> None:
    """The right input of the two refusals below (no cluster: nothing reaches the module's ledger)."""
    accountant = _accountant(tmp_path)
    for run_id, unit in (("0123abcd4567", "edge"), ("run_2.b-c", "node")):
        _create(accountant, run_id, unit)
        assert accountant.status(run_id).privacy_unit == unit


def test_the_accountant_refuses_an_unknown_privacy_unit(tmp_path: Path) -> None:
    with pytest.raises(AccountantError, match="privacy unit"):
        _create(_accountant(tmp_path), "fuzz-banana", "banana")


def test_the_accountant_refuses_run_ids_its_status_cannot_serve(tmp_path: Path) -> None:
    accountant = _accountant(tmp_path)
    for run_id in ("a/b", "x/../y"):
        with pytest.raises(AccountantError, match="run id"):
            _create(accountant, run_id)


# -- afterwards --------------------------------------------------------------------------------
def _healthy(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _check_after_the_fuzzing(world: World) -> None:
    """Every service serves a real run; the ledger and the files are what they were, plus that run."""
    cluster, before = world.cluster, world.snapshot
    assert before is not None
    for name, service in cluster.services.items():
        assert service.process.poll() is None, f"{name} died:\n{service.log_tail()}"
        assert _healthy(service.grpc_address), name
    assert httpx.get(f"{cluster.status_url}/healthz", timeout=10).json() == {"status": "ok"}

    real = _real_run(cluster, world.workdir / f"after-{len(world.real_runs)}.json")
    world.real_runs.append(real)

    # the ledger: the rows before, plus the real runs'; every run replays to its reported epsilon
    after = _ledgers(cluster.status_url)
    assert set(after) == set(before.ledgers) | set(world.real_runs)
    for run_id, view in before.ledgers.items():
        assert after[run_id] == view, f"run {run_id} changed"
    assert after[real]["run"]["status"] == "completed" and after[real]["rows"]
    for run_id, view in after.items():
        result = replay(RunRecord.model_validate(view["run"]), [LedgerRow.model_validate(r) for r in view["rows"]])
        assert result.consistent, (run_id, result.problems)
    with closing(sqlite3.connect(f"file:{cluster.ledger}?mode=ro", uri=True)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert db.execute("SELECT count(*) FROM charges").fetchone()[0] == sum(len(v["rows"]) for v in after.values())

    # files: every one that existed is unchanged, or (append-only) grew at its end
    for relative, digest in before.digests.items():
        path = world.workdir / relative
        assert path.is_file(), f"{relative} is gone"
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f"{relative} changed"
    for relative, content in before.appended.items():
        now = (world.workdir / relative).read_bytes()
        assert now.startswith(content), f"{relative} was rewritten, not appended to"
        assert all(json.loads(line) for line in now[len(content):].decode().splitlines())


def test_after_the_fuzzing_every_service_serves_and_nothing_changed_but_a_real_run(world: World) -> None:
    _check_after_the_fuzzing(world)


@pytest.mark.slow
def test_after_the_deep_fuzzing_every_service_serves_and_nothing_changed_but_a_real_run(world: World) -> None:
    _check_after_the_fuzzing(world)


# last: while the bug is there, the attempt rewrites the baseline run's files, which the checks above compare
def test_resuming_a_finished_run_is_refused_and_leaves_its_files(world: World) -> None:
    finished = world.baseline_run
    files = {party: _digests(world.workdir / party / "runs" / finished) for party in ("party_a", "party_b")}
    request = ga.StartRunRequest(resume_run_id=finished)
    refused = [Expect(PRECONDITION, "only an interrupted run resumes")]
    try:
        assert_refused(lambda: list(world.a.StartRun(request, timeout=60)), refused)
    finally:
        for party, digests in files.items():
            assert _digests(world.workdir / party / "runs" / finished) == digests, f"{party}'s files of the run changed"
