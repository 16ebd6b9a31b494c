"""The accountant as a real process: SIGKILL and restart keep every charge, retries are
not charged twice, B can audit but not spend, and the CLI replays the ledger exactly."""

from __future__ import annotations

import socket
import threading
import time

import dp_accounting as dpa
import grpc
import httpx
import pytest
from e2e import vesper

from vesper.common.charge_token import read_token
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule
from vesper.coordinator.processes import start_service, write_section
from vesper.party_a.peers import AccountantClient, PeerError

pytestmark = pytest.mark.e2e
EVENT = event_to_json(dpa.GaussianDpEvent(4.0))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Accountant:
    """One accountant process on fixed ports, restartable on the same ledger."""

    def __init__(self, workdir) -> None:
        self.workdir = workdir
        self.ledger = workdir / "ledger.sqlite"
        self.token_file = workdir / "charge.token"
        self.port, self.rest_port = _free_port(), _free_port()
        self.config = workdir / "accountant.toml"
        write_section(self.config, "accountant", {
            "listen": f"127.0.0.1:{self.port}", "rest_listen": f"127.0.0.1:{self.rest_port}",
            "ledger": str(self.ledger), "charge_token_file": str(self.token_file),
            "label_charge_token_file": str(workdir / "label-charge.token"),
        })
        self.process = None

    def start(self) -> None:
        self.process = start_service("accountant", self.config, self.workdir)
        self.process.wait_ready()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"


@pytest.fixture
def accountant(tmp_path):
    service = Accountant(tmp_path)
    service.start()
    yield service
    service.process.stop()


def _client(service: Accountant, token: bool = True, retries: int = 5) -> AccountantClient:
    return AccountantClient(service.address, read_token(service.token_file) if token else None, charge_retries=retries)


def _create(client: AccountantClient, run_id: str = "r1") -> None:
    rules = [ChargeRule(kind="train", release_event=EVENT, participation_bound=None)]
    client.create_run(run_id, 50.0, 1e-5, rules, "pmp-gin", "visible-batch", "pld", {})


def _charge(client: AccountantClient, i: int, run_id: str = "r1"):
    return client.charge(run_id, f"train-0/{i}", "train-0", "train", 8, f"digest-{i}", EVENT)


def _status(service: Accountant, run_id: str = "r1") -> dict:
    return httpx.get(f"{service.url}/v1/runs/{run_id}", timeout=10).json()


def test_a_killed_accountant_keeps_every_charge_and_a_retry_is_not_charged_twice(accountant) -> None:
    client = _client(accountant)
    _create(client)
    receipts = [_charge(client, i) for i in range(20)]
    before = _status(accountant)
    assert before["charges"] == 20 and before["epsilon_spent"] == receipts[-1].epsilon_spent
    accountant.process.kill()  # SIGKILL: no shutdown hook runs
    accountant.start()
    after = _status(accountant)
    assert after["charges"] == 20 and after["epsilon_spent"] == before["epsilon_spent"]
    assert after["epsilon_curve"] == before["epsilon_curve"]
    # A did not see the receipt of release 19 (say): it retries, and nothing is added
    retry = _charge(client, 19)
    assert retry.replayed and retry.seq == 19 and retry.epsilon_spent == receipts[-1].epsilon_spent
    assert _status(accountant)["charges"] == 20
    fresh = _charge(client, 20)
    assert not fresh.replayed and fresh.seq == 20 and fresh.epsilon_spent > before["epsilon_spent"]
    # the CLI replays the stored events and reproduces the reported ε exactly, by REST and from the file
    for source in (["--url", accountant.url], ["--ledger", str(accountant.ledger)]):
        code, output = vesper("ledger", "verify", "r1", *source)
        assert code == 0 and f"= {fresh.epsilon_spent!r}" in output and "exactly as recorded" in output, output


def test_a_charge_in_flight_during_a_restart_is_retried_and_charged_once(accountant) -> None:
    client = _client(accountant, retries=8)  # backoff 0.2 s doubling: about 25 s of patience
    _create(client)
    _charge(client, 0)
    accountant.process.kill()
    result: dict = {}

    def charge_while_down() -> None:
        try:
            result["receipt"] = _charge(client, 1)
        except PeerError as exc:  # pragma: no cover - reported below
            result["error"] = exc

    thread = threading.Thread(target=charge_while_down)
    thread.start()
    time.sleep(0.5)
    accountant.start()
    thread.join(timeout=60)
    assert "error" not in result, result.get("error")
    assert result["receipt"].seq == 1 and _status(accountant)["charges"] == 2


def test_party_b_can_audit_but_not_charge(accountant, tmp_path) -> None:
    _create(_client(accountant))
    outsider = _client(accountant, token=False)
    with pytest.raises(PeerError, match="no charge token"):
        _charge(outsider, 0)
    forger = AccountantClient(accountant.address, "x" * 43)
    for call in (lambda: _charge(forger, 0), lambda: _create(forger, "r2"), lambda: forger.close_run("r1", "failed", "")):
        with pytest.raises(PeerError, match="UNAUTHENTICATED"):
            call()
    assert _status(accountant)["charges"] == 0
    # reading is open: status, ledger, and the plot made from them
    assert httpx.get(f"{accountant.url}/v1/runs/r1/ledger", timeout=10).status_code == 200
    _charge(_client(accountant), 0)
    png = tmp_path / "epsilon.png"
    code, output = vesper("status", "r1", "--url", accountant.url, "--plot", str(png))
    assert code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", output


def test_the_token_file_is_private(accountant) -> None:
    assert accountant.token_file.stat().st_mode & 0o077 == 0
    assert len(read_token(accountant.token_file)) >= 32


def test_concurrent_workers_over_grpc(accountant) -> None:
    client = _client(accountant)
    _create(client)
    errors: list[Exception] = []

    def worker(w: int) -> None:
        try:
            for i in range(10):
                client.charge("r1", f"w{w}/{i}", f"train-{i}", "train", 4, "d", EVENT)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    code, output = vesper("ledger", "verify", "r1", "--url", accountant.url)
    assert code == 0 and "40 ledger rows" in output, output


def test_grpc_status_codes_for_unauthenticated_calls(accountant) -> None:
    from vesper.proto.v1 import accountant_pb2 as acc
    from vesper.proto.v1 import accountant_pb2_grpc as acc_grpc

    with grpc.insecure_channel(accountant.address) as channel:
        stub = acc_grpc.AccountantStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.CreateRun(acc.CreateRunRequest(run_id="x"))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:
            stub.GetRun(acc.GetRunRequest(run_id="x"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND  # reading is allowed; the run just does not exist
