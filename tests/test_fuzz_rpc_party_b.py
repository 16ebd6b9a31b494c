"""Fuzzing party B's LabelParty RPCs (Train, Evaluate, Collect, SetupRun, FinishRun), live on
loopback, and the regression tests of the bugs it found there.

The cluster, shared by every test_fuzz_rpc_*.py module: fuzz_rpc_world.py and
fuzz_rpc_cluster.py; the expectations and shared strategies: fuzz_rpc_strategies.py.
tests/test_e2e_bad_input.py holds the hand-picked cases.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from e2e import ledger
from fuzz_rpc_strategies import (
    DEPTHS,
    EXISTS,
    INF,
    INVALID,
    NAN,
    NOT_FOUND,
    PRECONDITION,
    UNKNOWN_DATASETS,
    Expect,
    _not_json,
    assert_refused,
    bad_ids,
    bad_tensors,
    fuzz_settings,
    good_ids,
    unknown_run_ids,
)
from fuzz_rpc_world import (
    B_RUN_ID,
    FINISHED_RUN,
    PATE_RUN,
    SETUP_RUN,
    TRAIN_RUN,
    D,
    L,
    World,
    _good_tensor,
    _setup_request,
)
from hypothesis import given
from hypothesis import strategies as st

from vesper.proto.v1 import label_party_pb2 as lp
from vesper.proto.v1 import tensor_pb2

pytest_plugins = ["fuzz_rpc_cluster"]  # the `world` fixture: one cluster for every fuzz module
# the RPC fuzzers share that cluster and a real run (~2 minutes on 2 cores): make test-slow
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _stream_error(call: Callable[[], Iterator[object]], replies: list[object]) -> Callable[[], None]:
    def run() -> None:
        for reply in call():
            replies.append(reply)

    return run


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


# -- bugs the fuzzing found outside this test's files, fixed: their regression tests -----------
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


def test_a_run_id_with_a_trailing_newline_is_refused(world: World) -> None:
    world.sessions.add("fuzz-newline\n")
    assert_refused(lambda: world.b.SetupRun(_setup_request("fuzz-newline\n"), timeout=60), [Expect(INVALID, "must match")])
