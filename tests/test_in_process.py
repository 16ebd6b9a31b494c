"""The in-process mode (coordinator/in_process.py): the same code, without the network.

1. One Cora run through LocalCluster (three processes, gRPC) and through InProcessCluster
   gives the same summary, ledger rows and final parameters of both parties, bit for bit;
   so do a run refused by the budget and an unknown dataset (same summary, same message).
2. The in-process channel against a real gRPC server in this process, on the same servicer
   code: the same outcome (response bytes, or error and message) for any sequence of
   accountant calls (hypothesis), for party B's error paths through A's client, and for a
   handler's unexpected exception, a deadline and a cancel.

Both sides of (1) run with one torch thread, because the final parameters depend on
torch's intra-op thread count (parallel reductions add in another order). Dropout stays
on: it draws from generators seeded per run (party_b/seeded_dropout.py; A's dropout is keyed, party_a/keyed_dropout.py), not from torch's
process-wide RNG (test_a_run_does_not_depend_on_the_process_rng).
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dp_accounting as dpa
import grpc
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from rich.console import Console

from vesper.accountant.budget import Accountant
from vesper.accountant.ledger_store import LedgerStore
from vesper.accountant.service import AccountantService
from vesper.common.accountant_client import AccountantClient, BudgetRefused, PeerError
from vesper.common.charge_token import ensure_distinct_tokens
from vesper.common.config import PartyBConfig, RunConfig, RunSummary
from vesper.common.dataset_files import resolve_dataset
from vesper.common.grpc_server import start_server
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule
from vesper.common.wire import dtype_to_proto, encode_tensor
from vesper.coordinator.in_process import InProcessCluster, InProcessServer
from vesper.coordinator.processes import LocalCluster
from vesper.coordinator.run_client import RunClientError, drive_run
from vesper.party_a.peers import LabelPartyClient
from vesper.party_a.run import GraphData, ProgressEvent
from vesper.party_b.service import LabelPartyService
from vesper.proto.v1 import accountant_pb2, accountant_pb2_grpc
from vesper.proto.v1 import label_party_pb2 as lp_pb
from vesper.proto.v1 import label_party_pb2_grpc as lp_grpc

PARTY_A = {"secret_seed": 7}
PARTY_B = {"secret_seed": 9}
THREADS = 1


def _config(**update: object) -> RunConfig:
    base = {
        "dataset": "cora", "epochs": 2, "seed": 3, "privacy": {"epsilon": 4.0},
        "extractor": {"name": "pmp-gcn"},
    }
    return RunConfig.model_validate({**base, **update})


IDENTICAL = _config()
REFUSED = _config(privacy={"epsilon": 0.01}, extractor={"name": "pmp-gcn", "noise_multiplier": 0.5})
NO_DATASET = _config(dataset="no-such-graph")
VOLATILE = {"run_id", "seconds", "status_url"}  # differ between any two runs


@dataclass
class Outcome:
    workdir: Path
    ledger: Path
    summaries: dict[str, RunSummary]
    errors: dict[str, str]


def _run_all(drive: Callable[[RunConfig], RunSummary], workdir: Path, ledger: Path) -> Outcome:
    outcome = Outcome(workdir, ledger, {}, {})
    for name, config in (("identical", IDENTICAL), ("refused", REFUSED), ("no-dataset", NO_DATASET)):
        try:
            outcome.summaries[name] = drive(config)
        except RunClientError as exc:
            outcome.errors[name] = str(exc)
    return outcome


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread here and in the services (they inherit OMP_NUM_THREADS)."""
    before, env = torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(THREADS)
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(before)
    if env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = env


@pytest.fixture(scope="module")
def through_services(tmp_path_factory, one_thread) -> Outcome:
    workdir = tmp_path_factory.mktemp("services")
    with LocalCluster(workdir, party_a=PARTY_A, party_b=PARTY_B) as cluster:
        return _run_all(lambda c: drive_run(cluster.party_a_address, c, Console(quiet=True)), workdir, cluster.ledger)


@pytest.fixture(scope="module")
def in_process(tmp_path_factory, one_thread) -> Iterator[InProcessCluster]:
    with InProcessCluster(tmp_path_factory.mktemp("in-process"), party_a=PARTY_A, party_b=PARTY_B) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def in_process_runs(in_process: InProcessCluster) -> Outcome:
    return _run_all(in_process.drive, in_process.workdir, in_process.ledger)


def _ledger(path: Path, run_id: str) -> tuple[dict, list[dict]]:
    """The run's record and rows, without what names or dates them."""
    store = LedgerStore(path)
    try:
        record = store.get_run(run_id)
        rows = store.charges(run_id)
    finally:
        store.close()
    assert record is not None
    return (
        record.model_dump(exclude={"run_id", "created_at", "closed_at"}),
        [row.model_dump(exclude={"run_id", "created_at"}) for row in rows],
    )


def _parameters(workdir: Path, run_id: str) -> dict[str, torch.Tensor]:
    """Both parties' final parameters: A's extractor, B's decoder."""
    a = torch.load(workdir / "party_a" / "runs" / run_id / "extractor.pt", weights_only=False)["extractor"]
    b = torch.load(workdir / "party_b" / "runs" / run_id / "decoder.pt", weights_only=False)["decoder"]
    return {**{f"A.{k}": v for k, v in a.items()}, **{f"B.{k}": v for k, v in b.items()}}


def _same_tensors(left: dict[str, torch.Tensor], right: dict[str, torch.Tensor]) -> bool:
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


# -- 1. the same runs through the services and in process --------------------------------------
@pytest.mark.e2e
def test_the_same_run_gives_identical_numbers(through_services: Outcome, in_process_runs: Outcome) -> None:
    services, local = through_services.summaries["identical"], in_process_runs.summaries["identical"]
    assert services.status == local.status == "completed", (services.message, local.message)
    assert services.test_metric is not None and services.val_metric is not None
    # exactly equal floats, not approximately
    assert (services.test_metric.value, services.val_metric.value) == (local.test_metric.value, local.val_metric.value)
    assert services.epsilon_spent == local.epsilon_spent and 0 < local.epsilon_spent <= 4.0
    assert services.steps == local.steps == 2 * math.ceil(1354 / 256)
    assert services.model_dump(exclude=VOLATILE) == local.model_dump(exclude=VOLATILE)
    record_s, rows_s = _ledger(through_services.ledger, services.run_id)
    record_l, rows_l = _ledger(in_process_runs.ledger, local.run_id)
    assert len(rows_s) == services.steps + 2  # and the evaluation pass's val and test chunks
    assert rows_s == rows_l and record_s == record_l
    assert _same_tensors(
        _parameters(through_services.workdir, services.run_id), _parameters(in_process_runs.workdir, local.run_id)
    )


@pytest.mark.e2e
def test_a_run_refused_by_the_budget_ends_the_same_way(through_services: Outcome, in_process_runs: Outcome) -> None:
    services, local = through_services.summaries["refused"], in_process_runs.summaries["refused"]
    assert local.status == "refused" and "above the budget 0.01; nothing was sent" in local.message
    assert services.model_dump(exclude=VOLATILE) == local.model_dump(exclude=VOLATILE)
    assert local.epsilon_spent == 0 and local.steps == 0
    record_s, rows_s = _ledger(through_services.ledger, services.run_id)
    record_l, rows_l = _ledger(in_process_runs.ledger, local.run_id)
    assert rows_s == rows_l == [] and record_s == record_l and record_l["status"] == "refused"


@pytest.mark.e2e
def test_an_unknown_dataset_fails_with_the_same_message(through_services: Outcome, in_process_runs: Outcome) -> None:
    assert through_services.errors["no-dataset"] == in_process_runs.errors["no-dataset"]
    assert in_process_runs.errors["no-dataset"].startswith("party A refused the run: NOT_FOUND: party A: ")
    assert "no-such-graph" in in_process_runs.errors["no-dataset"]


def test_graph_data_is_loaded_once_per_dataset_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[Path] = []
    load = GraphData.load

    def counted(cls: type[GraphData], path: Path, device: torch.device) -> GraphData:
        loads.append(path)
        return load(path, device)

    monkeypatch.setattr(GraphData, "load", classmethod(counted))
    config = _config(extractor={"name": "no-such-extractor"})  # fails in A's run, after A loaded its graph
    with InProcessCluster(tmp_path, datasets={"alias": str(resolve_dataset("cora"))}) as cluster:
        summaries = [cluster.drive(config), cluster.drive(config.model_copy(update={"dataset": "alias"}))]
    assert [s.status for s in summaries] == ["failed", "failed"]
    assert all("no-such-extractor" in s.message for s in summaries)
    assert loads == [resolve_dataset("cora")]


def test_progress_events_reach_the_callback(in_process: InProcessCluster) -> None:
    events: list[ProgressEvent] = []
    summary = in_process.drive(_config(epochs=1), report=events.append)
    train = [e for e in events if e.phase == "train"]
    assert summary.status == "completed" and len(train) == summary.steps
    assert [e.step for e in train] == list(range(1, summary.steps + 1))
    assert train[-1].epsilon_spent <= summary.epsilon_spent


def test_ctrl_c_cancels_the_run_and_closes_it_at_the_accountant(in_process: InProcessCluster) -> None:
    """As when the coordinator goes away from A's service: the run stops after its step."""

    interrupted = threading.Event()

    def ctrl_c(signum: int, frame: object) -> None:
        interrupted.set()
        signal.default_int_handler(signum, frame)

    def interrupt_once(event: ProgressEvent) -> None:
        if event.phase == "train" and event.step == 1:
            os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler in the main thread, in drive()
            # on a loaded machine the main thread may run the handler only steps later: the run
            # waits for it here (as a person's Ctrl-C arrives while a step is still running)
            interrupted.wait(30)

    # Python installs its KeyboardInterrupt handler only where SIGINT was not ignored at start
    # (a background job's is): install it here, as an interactive shell's Python has it
    previous = signal.signal(signal.SIGINT, ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt):
            in_process.drive(_config(epochs=3), report=interrupt_once)
    finally:
        signal.signal(signal.SIGINT, previous)
    run = in_process.accountant.list_runs()[-1]
    assert run.status == "cancelled"
    assert 1 <= run.charges < 3 * math.ceil(1354 / 256)


def test_a_run_does_not_depend_on_the_process_rng(in_process: InProcessCluster) -> None:
    config = _config(epochs=1, extractor={"name": "pmp-gcn", "dropout": 0.5})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        first = in_process.drive(config)
        torch.manual_seed(2)
        second = in_process.drive(config)
    assert _same_tensors(
        _parameters(in_process.workdir, first.run_id), _parameters(in_process.workdir, second.run_id)
    )


# -- 2. the channel against a real gRPC server ----------------------------------------------------
@dataclass
class Transports:
    """The same servicer code twice: one copy behind a real gRPC server, one in process."""

    grpc_channel: Callable[[], grpc.Channel]
    in_process_channel: Callable[[], grpc.Channel]

    def both(self) -> tuple[grpc.Channel, grpc.Channel]:
        return self.grpc_channel(), self.in_process_channel()


@pytest.fixture
def serve_twice() -> Iterator[Callable[[Callable, object, object, str], Transports]]:
    servers: list[grpc.Server] = []

    def serve(add: Callable, over_grpc: object, in_process: object, name: str) -> Transports:
        server, port = start_server("127.0.0.1:0", [(add, over_grpc, name)], 16)
        servers.append(server)
        local = InProcessServer(name)
        add(in_process, local)
        return Transports(lambda: grpc.insecure_channel(f"127.0.0.1:{port}"), local.channel)

    yield serve
    for server in servers:
        server.stop(0)


@pytest.fixture(scope="module")
def accountants(tmp_path_factory) -> Iterator[tuple[tuple[str, str], Transports]]:
    root = tmp_path_factory.mktemp("accountants")
    tokens = ensure_distinct_tokens(root / "charge.token", root / "label-charge.token")
    stores = [LedgerStore(root / f"{name}.sqlite") for name in ("grpc", "in-process")]
    services = [AccountantService(Accountant(store), *tokens) for store in stores]
    name = accountant_pb2.DESCRIPTOR.services_by_name["Accountant"].full_name
    server, port = start_server(
        "127.0.0.1:0", [(accountant_pb2_grpc.add_AccountantServicer_to_server, services[0], name)], 16
    )
    local = InProcessServer(name)
    accountant_pb2_grpc.add_AccountantServicer_to_server(services[1], local)
    yield tokens, Transports(lambda: grpc.insecure_channel(f"127.0.0.1:{port}"), local.channel)
    server.stop(0)
    for store in stores:
        store.close()


def _outcome(call: Callable[..., object], *args: object) -> tuple[str, str]:
    try:
        reply = call(*args)
    except (PeerError, BudgetRefused) as exc:
        return type(exc).__name__, str(exc)
    return "reply", reply.SerializeToString(deterministic=True).hex()  # type: ignore[attr-defined]


RULES = [
    ChargeRule(kind=kind, release_event=event_to_json(dpa.GaussianDpEvent(3.0)), participation_bound=1)
    for kind in ("train", "eval")
]

_runs = st.integers(0, 2)
_tokens = st.sampled_from(["A", "B", "none"])
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("create"), _runs, _tokens, st.sampled_from([1.0, 2.5, 8.0])),
        st.tuples(st.just("charge"), _runs, _tokens, st.sampled_from(["train", "eval", "bogus"]), st.integers(0, 3),
                  st.integers(0, 1)),
        st.tuples(st.just("get"), _runs),
        st.tuples(st.just("close"), _runs, _tokens),
    ),
    min_size=1, max_size=8,
)


# every outcome at least once: replies, a retry, a refusal, and each error the accountant gives
EVERY_OUTCOME = [
    ("create", 0, "A", 2.5), ("charge", 0, "A", "train", 0, 0), ("charge", 0, "A", "train", 0, 0),
    ("charge", 0, "A", "train", 0, 1), ("charge", 0, "A", "train", 1, 0), ("charge", 0, "A", "train", 2, 0),
    ("charge", 0, "A", "train", 3, 0), ("get", 0), ("close", 0, "B"), ("close", 0, "A"),
    ("charge", 0, "A", "train", 3, 1), ("charge", 1, "A", "eval", 0, 0), ("create", 1, "A", 1.0),
    ("charge", 1, "A", "bogus", 0, 0), ("create", 2, "B", 1.0), ("create", 2, "none", 1.0), ("get", 2),
]


@given(steps=_steps)
@example(steps=EVERY_OUTCOME)
@settings(max_examples=20, deadline=None)
def test_any_accountant_calls_end_the_same_in_process_and_over_grpc(accountants, steps) -> None:
    """Responses byte for byte, refusals (BudgetRefused) and errors (PeerError) word for word."""
    tokens, transports = accountants
    prefix = uuid.uuid4().hex[:8]  # both ledgers see the same run ids, new in each example

    def replay(channel: grpc.Channel) -> list[tuple[str, str]]:
        clients = {
            who: AccountantClient("the accountant", token, charge_retries=0, channel=channel)
            for who, token in (("A", tokens[0]), ("B", tokens[1]), ("none", None))
        }
        outcomes = []
        for step in steps:
            run_id = f"{prefix}-{step[1]}"
            if step[0] == "create":
                client = clients[step[2]]
                outcomes.append(_outcome(
                    client.create_run, run_id, step[3], 1e-5, RULES, "pmp-gcn", "visible-batch", "pld", {"test": True},
                ))
            elif step[0] == "charge":
                client, kind, pass_index, digest = clients[step[2]], step[3], step[4], step[5]
                event = RULES[0].release_event
                outcomes.append(_outcome(
                    client.charge, run_id, f"{kind}-{pass_index}/0", f"{kind}-{pass_index}", kind, 4, f"digest{digest}", event,
                ))
            elif step[0] == "get":
                outcomes.append(_outcome(clients["none"].get_run, run_id))
            else:
                outcomes.append(_outcome(clients[step[2]].close_run, run_id, "completed", "done"))
        channel.close()
        return outcomes

    over_grpc, in_process = transports.both()
    assert replay(over_grpc) == replay(in_process)


def test_party_b_errors_reach_party_a_the_same_way(tmp_path: Path, serve_twice) -> None:
    """A's client (PeerError messages) over B's servicer: set-up, training and evaluation errors."""
    settings_b = [PartyBConfig(workdir=tmp_path / name) for name in ("grpc", "in-process")]
    name = lp_pb.DESCRIPTOR.services_by_name["LabelParty"].full_name
    transports = serve_twice(lp_grpc.add_LabelPartyServicer_to_server, *map(LabelPartyService, settings_b), name)

    def setup(run_id: str, dataset: str = "cora") -> lp_pb.SetupRunRequest:
        return lp_pb.SetupRunRequest(
            run_id=run_id, dataset=dataset, decoder=lp_pb.DecoderSpec(kind="concat", hidden_dim=8),
            optimizer=lp_pb.OptimizerSpec(name="adam", lr=0.01), seed=1, embedding_dim=4, num_layers=1,
            wire_dtype=dtype_to_proto("float32"),
        )

    def step(run_id: str, index: int, node_ids: list[int]) -> lp_pb.TrainStep:
        embeddings = torch.linspace(0, 1, len(node_ids) * 4).reshape(len(node_ids), 4, 1)
        return lp_pb.TrainStep(
            run_id=run_id, step=index, node_ids=node_ids, embeddings=encode_tensor(embeddings, "float32")
        )

    def scenario(channel: grpc.Channel) -> list[tuple[str, str]]:
        client = LabelPartyClient("party B", 16, 120.0, channel=channel)
        outcomes = [_outcome(lambda: client.setup(setup("r1", "no-such-graph")))]
        reply = client.setup(setup("r1"))
        outcomes.append(("reply", reply.SerializeToString(deterministic=True).hex()))
        outcomes.append(_outcome(lambda: client.setup(setup("r1"))))
        train, val = list(reply.train_ids), list(reply.val_ids)
        # out of order; a node outside the training split; two good steps
        streams = (
            [step("r1", 1, train[:3])], [step("r1", 0, val[:3])], [step("r1", 0, train[:3]), step("r1", 1, train[3:5])]
        )
        for steps in streams:
            stream = client.training()
            for request in steps:
                outcomes.append(_outcome(stream.exchange, request))
            stream.close()
        evaluation = client.evaluation()
        outcomes.append(_outcome(evaluation.result))
        evaluation = client.evaluation()
        embeddings = encode_tensor(torch.ones(4, 4, 1), "float32")
        evaluation.send(lp_pb.EvalChunk(run_id="r1", eval_id=0, split="val", node_ids=val[:4], embeddings=embeddings))
        outcomes.append(_outcome(evaluation.result))
        evaluation = client.evaluation()
        evaluation.send(lp_pb.EvalChunk(run_id="r1", eval_id=0, split="test", node_ids=val[:4], embeddings=embeddings))
        outcomes.append(_outcome(evaluation.result))
        client.finish("r1", "completed", "done")
        outcomes.append(_outcome(lambda: client.setup(setup("bad id!"))))
        client.close()
        return outcomes

    over_grpc, in_process = transports.both()
    seen = scenario(in_process)
    assert seen == scenario(over_grpc)
    assert [kind for kind, _ in seen].count("reply") == 4  # set-up, two steps, an evaluation
    errors = [text for kind, text in seen if kind == "PeerError"]
    expected = [
        "refused the run set-up: NOT_FOUND: unknown dataset 'no-such-graph'",
        "refused the run set-up: ALREADY_EXISTS: run 'r1' is already set up",
        "rejected step 1: FAILED_PRECONDITION: out-of-order step: expected step 0, got 1",
        "rejected step 0: INVALID_ARGUMENT: step 0: training batch: node",
        "failed the evaluation: INVALID_ARGUMENT: empty evaluation stream",
        "failed the evaluation: INVALID_ARGUMENT: test nodes: node",
        "refused the run set-up: INVALID_ARGUMENT: run id 'bad id!' must match",
    ]
    assert len(errors) == len(expected)
    assert all(text.startswith(f"party B at party B {part}") for part, text in zip(expected, errors, strict=True))


class _Misbehaving(lp_grpc.LabelPartyServicer):
    """A party B whose handlers fail in the ways a transport must report faithfully."""

    def __init__(self) -> None:
        self.stream_closed = threading.Event()

    def SetupRun(self, request, context):
        raise RuntimeError("boom")

    def FinishRun(self, request, context):
        time.sleep(0.3)
        return lp_pb.FinishRunReply()

    def Train(self, request_iterator, context):
        try:
            for request in request_iterator:
                if request.step == 1:
                    raise ValueError("bad step")
                if request.step == 5:
                    context.set_code(grpc.StatusCode.DATA_LOSS)
                    context.set_details("set, not aborted")
                    return
                yield lp_pb.TrainStepReply(run_id=request.run_id, step=request.step)
        finally:
            self.stream_closed.set()

    def Evaluate(self, request_iterator, context):
        for _ in request_iterator:
            pass
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "no evaluation today")


def _status(call: Callable[[], object]) -> tuple[str, str]:
    try:
        call()
    except grpc.RpcError as error:
        return error.code().name, error.details()
    return "OK", ""


def test_failures_cancels_and_deadlines_look_the_same(serve_twice) -> None:
    name = lp_pb.DESCRIPTOR.services_by_name["LabelParty"].full_name
    servicers = (_Misbehaving(), _Misbehaving())
    transports = serve_twice(lp_grpc.add_LabelPartyServicer_to_server, *servicers, name)

    def scenario(channel: grpc.Channel) -> list[tuple[str, str]]:
        stub = lp_grpc.LabelPartyStub(channel)
        outcomes = [
            _status(lambda: stub.SetupRun(lp_pb.SetupRunRequest(run_id="r"))),
            _status(lambda: stub.FinishRun(lp_pb.FinishRunRequest(run_id="r"), timeout=0.05)),
            _status(lambda: stub.Evaluate(iter([lp_pb.EvalChunk(run_id="r")]))),
            _status(lambda: list(stub.Train(iter([lp_pb.TrainStep(step=0), lp_pb.TrainStep(step=1)])))),
            _status(lambda: list(stub.Train(iter([lp_pb.TrainStep(step=0), lp_pb.TrainStep(step=5)])))),
        ]
        future = stub.Evaluate.future(iter(()))
        outcomes.append(_status(lambda: future.result(timeout=5)))
        gate = threading.Event()

        def held() -> Iterator[lp_pb.TrainStep]:
            yield lp_pb.TrainStep(step=0)
            gate.wait(5)

        call = stub.Train(held())
        first = next(call)
        call.cancel()
        outcomes.append(("first", str(first.step)))
        outcomes.append(_status(lambda: next(call)))
        gate.set()
        not_served = accountant_pb2_grpc.AccountantStub(channel)
        outcomes.append(_status(lambda: not_served.GetRun(accountant_pb2.GetRunRequest())))
        channel.close()
        try:
            stub.FinishRun(lp_pb.FinishRunRequest())
        except ValueError as exc:
            outcomes.append(("ValueError", str(exc)))
        return outcomes

    over_grpc, in_process = transports.both()
    seen = scenario(in_process)
    assert seen == scenario(over_grpc)
    assert seen[:5] == [
        ("UNKNOWN", "Exception calling application: boom"),
        ("DEADLINE_EXCEEDED", "Deadline Exceeded"),
        ("PERMISSION_DENIED", "no evaluation today"),
        ("UNKNOWN", "Exception iterating responses: bad step"),
        ("DATA_LOSS", "set, not aborted"),
    ]
    assert seen[-4:] == [
        ("first", "0"), ("CANCELLED", "Locally cancelled by application!"), ("UNIMPLEMENTED", "Method not found!"),
        ("ValueError", "Cannot invoke RPC on closed channel!"),
    ]
    assert servicers[1].stream_closed.wait(5)  # the cancelled handler's clean-up ran


def test_the_cluster_lays_out_its_files_like_local_cluster(in_process: InProcessCluster) -> None:
    """Same scheme as LocalCluster: token files beside the ledger, one work directory per party."""
    assert in_process.charge_token_file.parent == in_process.ledger.parent == in_process.workdir
    assert in_process.settings_a.workdir == in_process.workdir / "party_a"
    assert in_process.settings_b.workdir == in_process.workdir / "party_b"
    assert in_process.charge_token_file.read_text() != in_process.label_token_file.read_text()
