"""After the fuzzing: every service still serves a real run, and neither the ledger nor any
file that existed before the fuzzing changed, except by that run.

The test_fuzz_rpc_*.py modules share one cluster (fuzz_rpc_cluster.py) and pytest runs them in
file order: this module is named to come last, so that its tests see what all the fuzzing left.
Run alone, they check a cluster that nothing fuzzed.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from contextlib import closing
from pathlib import Path

import grpc
import httpx
import pytest
from fuzz_rpc_strategies import PRECONDITION, Expect, assert_refused
from fuzz_rpc_world import World, _ledgers, _real_run
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vesper.common.privacy.ledger import LedgerRow, RunRecord, replay
from vesper.proto.v1 import graph_party_pb2 as ga

pytest_plugins = ["fuzz_rpc_cluster"]  # the `world` fixture: one cluster for every fuzz module
# the RPC fuzzers share that cluster and a real run (~2 minutes on 2 cores): make test-slow
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _digests(directory: Path) -> dict[str, str]:
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


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
