"""Malformed input on every RPC gets a clear gRPC status; services keep serving; the ledger is intact."""

from __future__ import annotations

import json

import dp_accounting as dpa
import grpc
import numpy as np
import pytest
import torch
from e2e import ledger, vesper

from vesper.common.accountant_client import AccountantClient
from vesper.common.charge_token import read_token
from vesper.common.privacy.accounting import epsilon_of
from vesper.common.privacy.events import event_to_json
from vesper.common.wire import encode_tensor
from vesper.proto.v1 import accountant_pb2 as acc
from vesper.proto.v1 import accountant_pb2_grpc as acc_grpc
from vesper.proto.v1 import graph_party_pb2 as ga
from vesper.proto.v1 import graph_party_pb2_grpc as ga_grpc
from vesper.proto.v1 import label_party_pb2 as lp
from vesper.proto.v1 import label_party_pb2_grpc as lp_grpc
from vesper.proto.v1 import tensor_pb2

pytestmark = pytest.mark.e2e
D, L = 4, 2


@pytest.fixture(scope="module")
def b(cluster):
    with grpc.insecure_channel(cluster.party_b_address) as channel:
        yield lp_grpc.LabelPartyStub(channel)


@pytest.fixture(scope="module")
def split(b):
    reply = b.SetupRun(lp.SetupRunRequest(
        run_id="bad-input", dataset="cora", decoder=lp.DecoderSpec(kind="concat", hidden_dim=8),
        optimizer=lp.OptimizerSpec(name="adam", lr=0.01), embedding_dim=D, num_layers=L,
        wire_dtype=tensor_pb2.DTYPE_FLOAT32,
    ))
    return reply


def _step(split, step=0, ids=None, tensor=None, run_id="bad-input", dtype="float32") -> lp.TrainStep:
    ids = list(split.train_ids[:3]) if ids is None else ids
    tensor = torch.rand(len(ids), D, L) if tensor is None else tensor
    return lp.TrainStep(run_id=run_id, step=step, node_ids=ids, embeddings=encode_tensor(tensor, dtype))


def _train_error(b, *steps: lp.TrainStep) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        list(b.Train(iter(steps), timeout=30))
    return info.value


def _huge(split) -> lp.TrainStep:
    message = _step(split)
    message.embeddings.shape[:] = [10**9, D, L]
    return message


def _nan(split) -> lp.TrainStep:
    tensor = torch.rand(3, D, L)
    tensor[1, 2, 0] = float("nan")
    return _step(split, tensor=tensor)


def _unknown_dtype(split) -> lp.TrainStep:
    message = _step(split)
    message.embeddings.dtype = 9
    return message


CASES = {
    "wrong shape": (lambda s: _step(s, tensor=torch.rand(3, D + 1, L)), grpc.StatusCode.INVALID_ARGUMENT, "shape [3, 5, 2] but expected [3, 4, 2]"),
    "wrong dtype": (lambda s: _step(s, dtype="bfloat16"), grpc.StatusCode.INVALID_ARGUMENT, "dtype bfloat16 but this run sends float32"),
    "unknown dtype": (_unknown_dtype, grpc.StatusCode.INVALID_ARGUMENT, "unsupported tensor dtype 9"),
    "NaN embedding": (_nan, grpc.StatusCode.INVALID_ARGUMENT, "1 non-finite values"),
    "Inf embedding": (lambda s: _step(s, tensor=torch.full((3, D, L), float("inf"))), grpc.StatusCode.INVALID_ARGUMENT, "non-finite"),
    "oversized tensor": (_huge, grpc.StatusCode.INVALID_ARGUMENT, "exceed the configured maximum"),
    "unknown node id": (lambda s: _step(s, ids=[5000, 1]), grpc.StatusCode.INVALID_ARGUMENT, "unknown node id 5000"),
    "negative node id": (lambda s: _step(s, ids=[-4, 1]), grpc.StatusCode.INVALID_ARGUMENT, "negative node id -4"),
    "duplicate node ids": (lambda s: _step(s, ids=[s.train_ids[0]] * 2), grpc.StatusCode.INVALID_ARGUMENT, "duplicate node ids"),
    "not a training node": (lambda s: _step(s, ids=[s.test_ids[0]]), grpc.StatusCode.INVALID_ARGUMENT, "is not in the allowed set"),
    "wrong run id": (lambda s: _step(s, run_id="someone-else"), grpc.StatusCode.NOT_FOUND, "unknown run id 'someone-else'"),
    "out-of-order step": (lambda s: _step(s, step=3), grpc.StatusCode.FAILED_PRECONDITION, "out-of-order step: expected step 0, got 3"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_party_b_refuses_malformed_training_steps(b, split, case: str) -> None:
    make, code, fragment = CASES[case]
    error = _train_error(b, make(split))
    assert error.code() == code and fragment in error.details(), error.details()


def test_party_b_keeps_serving_and_enforces_step_order(b, split) -> None:
    # all the refusals above changed nothing: step 0 is still the next step
    replies = list(b.Train(iter([_step(split, 0), _step(split, 1)]), timeout=30))
    assert [r.step for r in replies] == [0, 1]
    assert replies[0].gradient.shape == [3, D, L] and np.isfinite(replies[0].loss)
    error = _train_error(b, _step(split, 1))  # a replayed step
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "expected step 2, got 1" in error.details()
    error = _train_error(b, _step(split, 2), _step(split, 3, run_id="other"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "wrong run id 'other'" in error.details()


def test_party_b_refuses_bad_evaluations_and_set_ups(b, split) -> None:
    chunk = lp.EvalChunk(run_id="bad-input", eval_id=0, split="val", node_ids=list(split.train_ids[:2]),
                         embeddings=encode_tensor(torch.rand(2, D, L), "float32"))
    with pytest.raises(grpc.RpcError) as info:
        b.Evaluate(iter([chunk]), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not in the allowed set" in info.value.details()
    chunk.split, chunk.node_ids[:] = "holdout", list(split.val_ids[:2])
    with pytest.raises(grpc.RpcError) as info:
        b.Evaluate(iter([chunk]), timeout=30)
    assert "unknown split 'holdout'" in info.value.details()

    good = dict(run_id="new-run", dataset="cora", decoder=lp.DecoderSpec(kind="concat", hidden_dim=8),
                optimizer=lp.OptimizerSpec(name="adam", lr=0.01), embedding_dim=D, num_layers=L, wire_dtype=1)
    bad = {
        grpc.StatusCode.NOT_FOUND: {"dataset": "atlantis"},
        grpc.StatusCode.INVALID_ARGUMENT: {"decoder": lp.DecoderSpec(kind="transformer", hidden_dim=8)},
    }
    for code, change in bad.items():
        with pytest.raises(grpc.RpcError) as info:
            b.SetupRun(lp.SetupRunRequest(**{**good, **change}))
        assert info.value.code() == code, info.value.details()
    for change, fragment in [({"run_id": "has space"}, "must match"), ({"embedding_dim": 0}, "embedding shape"), ({"wire_dtype": 0}, "unsupported tensor dtype")]:
        with pytest.raises(grpc.RpcError) as info:
            b.SetupRun(lp.SetupRunRequest(**{**good, **change}))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        b.SetupRun(lp.SetupRunRequest(**{**good, "run_id": "bad-input"}))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS


def _collect_error(b, *chunks: lp.EvalChunk) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        b.Collect(iter(chunks), timeout=60)
    return info.value


def _chunk(run_id: str, split: str, ids) -> lp.EvalChunk:
    ids = list(ids)
    return lp.EvalChunk(run_id=run_id, eval_id=0, split=split, node_ids=ids,
                        embeddings=encode_tensor(torch.rand(len(ids), D, L), "float32"))


def test_party_b_refuses_bad_label_privacy_and_bad_collections(cluster, b, split) -> None:
    """Collect (pate only) and label settings: clear statuses, nothing charged to B's ledger."""
    good = dict(dataset="cora", decoder=lp.DecoderSpec(kind="concat", hidden_dim=8),
                optimizer=lp.OptimizerSpec(name="adam", lr=0.01), embedding_dim=D, num_layers=L, wire_dtype=1)
    for settings, code, fragment in [
        ('{"mode": "rr"}', grpc.StatusCode.INVALID_ARGUMENT, "needs a finite label_privacy.epsilon"),
        ('{"mode": "pate", "epsilon": 2, "pate": {"teachers": 5000}}', grpc.StatusCode.FAILED_PRECONDITION, "exceeds B's"),
        ("not json", grpc.StatusCode.INVALID_ARGUMENT, "bad label privacy settings"),
    ]:
        with pytest.raises(grpc.RpcError) as info:
            b.SetupRun(lp.SetupRunRequest(run_id="label-bad", label_privacy_json=settings, **good))
        assert info.value.code() == code and fragment in info.value.details(), info.value.details()
    # a run without pate has nothing to collect
    error = _collect_error(b, _chunk("bad-input", "train", split.train_ids[:2]))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "does not use label_privacy.mode=pate" in error.details()
    # party A announces a run before party B may open its label ledger (docs/faults.md, section 6)
    announcer = AccountantClient(cluster.accountant_address, read_token(cluster.charge_token_file))
    announcer.hold("a-trainer", 3600.0)
    announcer.announce_run("pate-bad")
    announcer.close()
    pate = b.SetupRun(lp.SetupRunRequest(
        run_id="pate-bad", label_privacy_json='{"mode": "pate", "epsilon": 2, "pate": {"teachers": 10, "queries": 20}}',
        **good,
    ))
    assert len(pate.query_ids) == 20 and not set(pate.query_ids) & set(pate.val_ids)
    teachers, queries = list(pate.train_ids), list(pate.query_ids)
    cases = [
        ([_chunk("pate-bad", "holdout", queries)], "unknown split 'holdout'"),
        ([_chunk("pate-bad", "query", teachers[:3])], "not in the allowed set"),
        ([_chunk("pate-bad", "train", teachers[:5]), _chunk("pate-bad", "train", teachers[:5])], "sent twice"),
        ([_chunk("pate-bad", "train", teachers[:-1]), _chunk("pate-bad", "query", queries)], "lacks some train nodes"),
        ([_chunk("pate-bad", "train", teachers), _chunk("other-run", "query", queries)], "one run id"),
    ]
    for chunks, fragment in cases:
        error = _collect_error(b, *chunks)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and fragment in error.details(), error.details()
    # nothing was answered, so nothing was charged: B's ledger is open and empty
    status = ledger(cluster.status_url, pate.label_ledger_id)
    assert status["run"]["privacy_unit"] == "label" and status["rows"] == []
    # and a good collection still works afterwards
    reply = b.Collect(iter([_chunk("pate-bad", "train", teachers), _chunk("pate-bad", "query", queries)]), timeout=120)
    assert set(reply.answered_ids) <= set(queries) and "of 20 queries" in reply.label_note
    assert len(ledger(cluster.status_url, pate.label_ledger_id)["rows"]) == 20
    error = _collect_error(b, _chunk("pate-bad", "train", teachers), _chunk("pate-bad", "query", queries))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "already answered" in error.details()


def test_accountant_refuses_bad_charges_and_keeps_the_ledger(cluster) -> None:
    event = event_to_json(dpa.GaussianDpEvent(3.0))
    two, three = (epsilon_of(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(3.0), n), 1e-5).epsilon for n in (2, 3))
    auth = (("authorization", f"Bearer {read_token(cluster.charge_token_file)}"),)
    with grpc.insecure_channel(cluster.accountant_address) as channel:
        stub = acc_grpc.AccountantStub(channel)
        stub.CreateRun(acc.CreateRunRequest(
            run_id="acct", privacy_unit="edge", accounting="visible-batch", accountant="pld",
            epsilon_budget=(two + three) / 2, delta=1e-5, extractor="pmp-gin",
            rules=[acc.ChargeRule(kind="train", release_event_json=event, participation_bound=2)],
        ), metadata=auth)
        good = dict(run_id="acct", pass_id="train-0", kind="train", num_nodes=3, nodes_digest="d", release_event_json=event)
        for i in (0, 1):  # two counted releases of pass train-0: the budget holds two, not three
            stub.Charge(acc.ChargeRequest(**good, release_key=f"train-0/{i}"), metadata=auth)
        before = ledger(cluster.status_url, "acct")
        bad = [
            (dict(run_id="ghost"), grpc.StatusCode.NOT_FOUND, "unknown run id 'ghost'"),
            (dict(release_key="train-0/1", nodes_digest="other"), grpc.StatusCode.ALREADY_EXISTS, "different release"),
            (dict(release_key=""), grpc.StatusCode.INVALID_ARGUMENT, "release key"),
            (dict(release_event_json="{nope"), grpc.StatusCode.INVALID_ARGUMENT, "bad release event"),
            (dict(release_event_json=event_to_json(dpa.GaussianDpEvent(0.1))), grpc.StatusCode.INVALID_ARGUMENT, "differs from the one declared"),
            (dict(num_nodes=0), grpc.StatusCode.INVALID_ARGUMENT, "at least one node"),
            (dict(kind="eval"), grpc.StatusCode.INVALID_ARGUMENT, "no rule for eval"),
            (dict(pass_id="train-1"), grpc.StatusCode.RESOURCE_EXHAUSTED, "budget exhausted"),
        ]
        for change, code, fragment in bad:
            with pytest.raises(grpc.RpcError) as info:
                stub.Charge(acc.ChargeRequest(**(good | {"release_key": "train-0/2"} | change)), metadata=auth)
            assert info.value.code() == code and fragment in info.value.details(), (change, info.value.details())
            assert ledger(cluster.status_url, "acct") == before
        # without A's credential nothing can be spent; reading needs none
        for metadata in ((), (("authorization", "Bearer not-the-token-at-all"),)):
            with pytest.raises(grpc.RpcError) as info:
                stub.Charge(acc.ChargeRequest(**good, release_key="train-0/2"), metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "charge token" in info.value.details()
            with pytest.raises(grpc.RpcError) as info:
                stub.CloseRun(acc.CloseRunRequest(run_id="acct", status="failed"), metadata=metadata)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert ledger(cluster.status_url, "acct") == before
        assert stub.GetRun(acc.GetRunRequest(run_id="acct")).epsilon_spent == two
        # a retry of an acknowledged charge is recognised, not charged again
        retry = stub.Charge(acc.ChargeRequest(**good, release_key="train-0/1"), metadata=auth)
        assert retry.replayed and retry.seq == 1 and ledger(cluster.status_url, "acct") == before
        # pass train-0 has reached its participation bound: a third release there adds nothing
        receipt = stub.Charge(acc.ChargeRequest(**good, release_key="train-0/2"), metadata=auth)
        assert not receipt.counted and receipt.epsilon_spent == two and receipt.seq == 2
        with pytest.raises(grpc.RpcError) as info:
            stub.Calibrate(acc.CalibrateRequest(mechanism="laplace", target_epsilon=1, delta=1e-5))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as info:
            stub.Calibrate(acc.CalibrateRequest(
                mechanism="gaussian", target_epsilon=1, delta=1e-5, accounting="hidden-batch",
                plan=acc.ReleasePlan(passes=[acc.PlannedPass(kind="train", releases=3)],
                                     rules=[acc.PlanRule(kind="train", sampling_probability=2.0)]),
            ))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "config, code, fragment",
    [
        ("{not json", grpc.StatusCode.INVALID_ARGUMENT, "invalid run configuration"),
        (json.dumps({"extractor": {"name": "pmp-gcn", "fanout": 3, "d_min": 5}}), grpc.StatusCode.INVALID_ARGUMENT, "exceeds extractor.fanout"),
        (json.dumps({"dataset": "atlantis"}), grpc.StatusCode.NOT_FOUND, "unknown dataset 'atlantis'"),
        (json.dumps({"epochs": 0}), grpc.StatusCode.INVALID_ARGUMENT, "greater than or equal to 1"),
    ],
)
def test_party_a_refuses_bad_run_configurations(cluster, config: str, code, fragment: str) -> None:
    with grpc.insecure_channel(cluster.party_a_address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            list(ga_grpc.GraphPartyStub(channel).StartRun(ga.StartRunRequest(run_config_json=config), timeout=30))
    assert info.value.code() == code and fragment in info.value.details(), info.value.details()


def test_misaligned_node_ids_end_the_run_before_anything_is_sent(cluster) -> None:
    code, output = vesper("train", "--party-a", cluster.party_a_address, "--dataset", "mismatch", "--epochs", "1")
    text = " ".join(output.split())
    assert code == 1 and "node ids are not aligned: party B's labels cover 100 nodes, party A's graph has 2708" in text, output
