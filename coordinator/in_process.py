"""The accountant, party B and party A's runs in this process, with no network between them.

``InProcessCluster`` is the counterpart of :class:`vesper.coordinator.processes.LocalCluster`
for benchmarks (``vesper bench utility --in-process``): the same code runs — A's trainer
(``party_a.run.GraphPartyRun``), B's servicer (``party_b.service.LabelPartyService``)
and the accountant's (``accountant.service.AccountantService`` over its SQLite ledger) —
and only gRPC's transport is replaced, by :class:`InProcessChannel`.

The transport and what it keeps as on the wire: coordinator/in_process_grpc.py.

Equal numbers: a run here and the same run through ``LocalCluster`` end with the same
metrics, ε, ledger rows and parameters of both parties, bit for bit (tests/test_in_process.py),
given the same two hidden inputs: the parties' ``secret_seed``s, and torch's intra-op thread
count (another count adds parallel reductions in another order; the services take theirs
from OMP_NUM_THREADS or the cores, this process from ``torch.set_num_threads``). Dropout
draws from nothing process-wide: A's is keyed (party_a/keyed_dropout.py), B's has a
generator seeded per run (party_b/seeded_dropout.py), so concurrent ``drive`` calls do not
share a stream; and both parties build their initial parameters under the run's seed one
build at a time (common/seeded_init.py: two jobs building at once took each other's draws).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import torch
from pydantic import ValidationError

from vesper.accountant.budget import Accountant
from vesper.accountant.ledger_store import LedgerStore
from vesper.accountant.service import AccountantService
from vesper.common.accountant_client import AccountantClient
from vesper.common.charge_token import TokenError, ensure_distinct_tokens, read_token
from vesper.common.config import PartyAConfig, PartyBConfig, RunConfig, RunSummary
from vesper.common.dataset_files import DatasetNotFound, resolve_dataset
from vesper.coordinator.in_process_grpc import InProcessServer
from vesper.coordinator.run_client import RunClientError
from vesper.party_a.peers import LabelPartyClient
from vesper.party_a.run import GraphData, GraphPartyRun, ProgressEvent
from vesper.party_b.service import LabelPartyService
from vesper.proto.v1 import accountant_pb2_grpc, label_party_pb2_grpc

log = logging.getLogger(__name__)

# Where A's settings say its peers are: names, not addresses (they appear in A's messages).
PARTY_B_TARGET = "in-process:party-b"
ACCOUNTANT_TARGET = "in-process:accountant"
STATUS_URL = "in-process://accountant"


# -- the cluster -------------------------------------------------------------------------------
def _refused(code: grpc.StatusCode, details: str) -> RunClientError:
    """What ``run_client.drive_run`` raises when party A's StartRun aborts with ``code``."""
    return RunClientError(f"party A refused the run: {code.name}: {details}")


def _settings(values: dict[str, Any]) -> dict[str, Any]:
    """As LocalCluster's TOML files carry them: a None value is left out (the default holds)."""
    return {key: value for key, value in values.items() if value is not None}


class InProcessCluster:
    """Accountant, party B and party A in this process; the counterpart of ``LocalCluster``,
    with the same settings, token files, ledger location and work directories."""

    accountant: Accountant
    accountant_server: InProcessServer
    party_b_server: InProcessServer
    settings_a: PartyAConfig
    settings_b: PartyBConfig

    def __init__(
        self,
        workdir: Path,
        *,
        party_a: dict[str, Any] | None = None,
        party_b: dict[str, Any] | None = None,
        ledger: Path | None = None,
        datasets: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.extra_a = party_a or {}
        self.extra_b = party_b or {}
        self.ledger = ledger or workdir / "ledger.sqlite"
        self.charge_token_file = self.ledger.parent / "charge.token"
        self.label_token_file = self.ledger.parent / "label-charge.token"
        self.datasets = datasets or {}
        self._graphs: dict[Path, GraphData] = {}
        self._graphs_lock = threading.Lock()
        self._servers: list[InProcessServer] = []
        self._store: LedgerStore | None = None

    def __enter__(self) -> InProcessCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        token, label_token = ensure_distinct_tokens(self.charge_token_file, self.label_token_file)
        self._store = LedgerStore(self.ledger)
        self.accountant = Accountant(self._store)
        self.accountant_server = InProcessServer(ACCOUNTANT_TARGET)
        accountant_pb2_grpc.add_AccountantServicer_to_server(
            AccountantService(self.accountant, token, label_token), self.accountant_server
        )
        self._servers.append(self.accountant_server)

        self.settings_b = PartyBConfig.model_validate(_settings({
            "listen": PARTY_B_TARGET, "workdir": str(self.workdir / "party_b"), "datasets": self.datasets,
            "accountant": ACCOUNTANT_TARGET, "accountant_token_file": str(self.label_token_file),
            **self.extra_b,
        }))
        # B's client for its label ledger, built from its settings as always, over this process's channel
        service_b = LabelPartyService(
            self.settings_b,
            self.accountant_server.channel(self.settings_b.accountant) if self.settings_b.accountant else None,
        )
        self.party_b_server = InProcessServer(PARTY_B_TARGET)
        label_party_pb2_grpc.add_LabelPartyServicer_to_server(service_b, self.party_b_server)
        self._servers.append(self.party_b_server)

        self.settings_a = PartyAConfig.model_validate(_settings({
            "listen": "in-process:party-a", "label_party": PARTY_B_TARGET, "accountant": ACCOUNTANT_TARGET,
            "accountant_status_url": STATUS_URL, "accountant_token_file": str(self.charge_token_file),
            "workdir": str(self.workdir / "party_a"), "datasets": self.datasets,
            **self.extra_a,
        }))

    def stop(self) -> None:
        for server in self._servers:
            server.stop()
        self._servers = []
        if self._store is not None:
            self._store.close()
            self._store = None

    @property
    def status_url(self) -> str:
        """Not a URL anyone can fetch: there is no REST endpoint in process (see the module docstring)."""
        return self.settings_a.accountant_status_url

    # -- one run -----------------------------------------------------------------------------
    def _graph(self, dataset: str) -> GraphData:
        """Party A's graph and features, loaded once per dataset file (as A's service caches them)."""
        try:
            path = resolve_dataset(dataset, self.settings_a.datasets)
            with self._graphs_lock:
                key = path.resolve()
                if key not in self._graphs:
                    log.info("loading graph %s onto %s", path, self.settings_a.device)
                    self._graphs[key] = GraphData.load(path, torch.device(self.settings_a.device))
                return self._graphs[key]
        except DatasetNotFound as exc:
            raise _refused(grpc.StatusCode.NOT_FOUND, f"party A: {exc}") from None
        except ValueError as exc:  # DatasetError included: the file is there, its contents cannot be used
            raise _refused(
                grpc.StatusCode.FAILED_PRECONDITION, f"party A cannot use dataset {dataset!r}: {exc}"
            ) from None

    def _charge_token(self) -> str | None:
        if self.settings_a.accountant_token_file is None:
            return None
        try:
            return read_token(self.settings_a.accountant_token_file)
        except TokenError as exc:
            raise _refused(grpc.StatusCode.FAILED_PRECONDITION, f"party A: {exc}") from None

    def drive(self, config: RunConfig, report: Callable[[ProgressEvent], None] | None = None) -> RunSummary:
        """Run ``config`` to its summary, as ``drive_run`` does through party A's service.

        ``report`` receives A's ``ProgressEvent``s, from the run's thread. The checks A's
        StartRun makes before a run fail with the same ``RunClientError``; a Ctrl-C cancels
        the run after its current step (closed at the accountant as cancelled), then re-raises.
        """
        try:  # the configuration crosses as JSON, as the coordinator sends it to A
            config = RunConfig.model_validate_json(config.model_dump_json(exclude_unset=True))
        except ValidationError as exc:
            raise _refused(grpc.StatusCode.INVALID_ARGUMENT, f"invalid run configuration: {exc}") from None
        settings = self.settings_a
        data = self._graph(config.dataset)
        token = self._charge_token()
        label_party = LabelPartyClient(
            settings.label_party, settings.max_message_mb, settings.step_timeout_s,
            channel=self.party_b_server.channel(settings.label_party),
        )
        accountant = AccountantClient(
            settings.accountant, token, channel=self.accountant_server.channel(settings.accountant)
        )
        stop = threading.Event()
        run = GraphPartyRun(
            config, settings, data, label_party, accountant,
            report=report or (lambda event: None), cancelled=stop.is_set,
        )
        outcome: list[RunSummary | Exception] = []
        finished = threading.Event()

        def work() -> None:
            try:
                outcome.append(run.execute())
            except Exception as exc:  # noqa: BLE001 — a bug, not a peer failure: reported as A's service does
                log.exception("run %s crashed", run.run_id)
                outcome.append(exc)
            finally:
                label_party.close()
                accountant.close()
                finished.set()

        log.info(
            "run %s: %s on %s, epsilon=%s", run.run_id, run.config.extractor.name, config.dataset, config.privacy.epsilon
        )
        # a thread of its own, as in A's service: the caller's thread-local torch state stays out
        threading.Thread(target=work, name=f"run-{run.run_id}", daemon=True).start()
        # an Event, not Thread.join: a join interrupted by Ctrl-C marks the thread as stopped
        # in Python 3.11 (bpo-45274's fix), so a second join would not wait for the run's end
        try:
            finished.wait()
        except BaseException:
            stop.set()
            finished.wait()
            raise
        result = outcome[0]
        if isinstance(result, Exception):
            raise _refused(grpc.StatusCode.INTERNAL, f"run {run.run_id} crashed in party A: {result!r}")
        return result
