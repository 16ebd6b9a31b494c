"""The ``world`` fixture: the one cluster every test_fuzz_rpc_*.py module fuzzes.

Those modules load this file as a pytest plugin (``pytest_plugins = ["fuzz_rpc_cluster"]``),
so the fixture is defined once and, session-scoped, built once: the modules share the cluster
and its state as the tests of the one module they were split from did (the fuzzing leaves it as
test_fuzz_rpc_survival.py checks). A module that imported the fixture instead would get a copy
of its own, and a cluster of its own. The cluster stops after the last test that uses it, as it
did when the fixture was module-scoped, not at the end of the session (later modules, such as
test_soak_bench.py, watch this process's threads and file descriptors). Nothing else lives
here: pytest imports a plugin itself, so its assertions are rewritten, and no test module
imports it before pytest does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import dp_accounting as dpa
import grpc
import pytest
from fuzz_rpc_world import (
    CLOSED_RUN,
    DELTA,
    EDGE_RUN,
    EVENT,
    FINISHED_RUN,
    MAX_MESSAGE_MB,
    PATE_RUN,
    PATE_SETTINGS,
    TRAIN_RUN,
    World,
    _create_request,
    _real_run,
    _setup_request,
    _snapshot,
)

from vesper.common.charge_token import read_token
from vesper.common.privacy.accounting import epsilon_of
from vesper.coordinator.processes import LocalCluster
from vesper.proto.v1 import accountant_pb2 as acc
from vesper.proto.v1 import accountant_pb2_grpc as acc_grpc
from vesper.proto.v1 import graph_party_pb2_grpc as ga_grpc
from vesper.proto.v1 import label_party_pb2 as lp
from vesper.proto.v1 import label_party_pb2_grpc as lp_grpc

_LIVE: list[ExitStack] = []  # the cluster's, from its first test to its last


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with ExitStack() as stack:
        _LIVE.append(stack)
        yield stack.enter_context(_world(tmp_path_factory))


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the cluster once no later test uses it (closing it twice is harmless)."""
    if not _LIVE or "world" not in getattr(item, "fixturenames", ()):
        return
    later = item.session.items[item.session.items.index(item) + 1:]
    if not any("world" in getattr(other, "fixturenames", ()) for other in later):
        _LIVE.pop().close()


@contextmanager
def _world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
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
