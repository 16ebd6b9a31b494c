"""The cluster the test_fuzz_rpc_*.py modules fuzz, live on loopback, and what it holds.

One cluster serves every fuzz module (the ``world`` fixture of fuzz_rpc_cluster.py). Before
any fuzzing it holds a finished real run (ledger rows, checkpoints, receipts), an accountant
run whose budget is spent, a closed one, and party B sessions to aim at; each of those was
made by the same call the fuzzing then corrupts, so the right input is shown to succeed.
:class:`World` is what the tests see of it; :class:`Snapshot`, what must survive the fuzzing
(test_fuzz_rpc_survival.py compares it afterwards).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dp_accounting as dpa
import httpx
import torch
from e2e import ledger, vesper

from vesper.common.privacy.events import event_to_json
from vesper.common.wire import encode_tensor
from vesper.coordinator.processes import LocalCluster
from vesper.proto.v1 import accountant_pb2 as acc
from vesper.proto.v1 import accountant_pb2_grpc as acc_grpc
from vesper.proto.v1 import graph_party_pb2_grpc as ga_grpc
from vesper.proto.v1 import label_party_pb2 as lp
from vesper.proto.v1 import label_party_pb2_grpc as lp_grpc
from vesper.proto.v1 import tensor_pb2

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
KNOWN_ACCOUNT_RUNS = {EDGE_RUN, CLOSED_RUN}


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
