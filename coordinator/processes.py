"""Start the three services as real processes on loopback (``vesper demo`` and the tests).

Each service gets its own TOML file in the work directory, listens on an ephemeral
port and announces the port in a ready file; party A is started last, once it can
be told where party B and the accountant listen.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vesper.common.charge_token import ensure_distinct_tokens


class ServiceStartError(RuntimeError):
    """A service did not come up; the message points at its log."""


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {_toml_value(v)}' for k, v in value.items()) + " }"
    return json.dumps(str(value))


def write_section(path: Path, section: str, values: dict[str, Any]) -> None:
    lines = [f"[{section}]"] + [f"{key} = {_toml_value(v)}" for key, v in values.items() if v is not None]
    path.write_text("\n".join(lines) + "\n")
    tomllib.loads(path.read_text())  # what we write must read back


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen
    ready_file: Path
    log_path: Path
    info: dict = field(default_factory=dict)

    def wait_ready(self, timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceStartError(
                    f"{self.name} exited with code {self.process.returncode}; see {self.log_path}:\n{self.log_tail()}"
                )
            if self.ready_file.exists():
                self.info = json.loads(self.ready_file.read_text())
                if _healthy(f"127.0.0.1:{self.info['grpc_port']}"):
                    return self.info
            time.sleep(0.05)
        raise ServiceStartError(f"{self.name} was not ready after {timeout_s:g} s; see {self.log_path}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.info['grpc_port']}"

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        """SIGKILL: a crash, for fault tests."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _healthy(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def start_service(kind: str, config_path: Path, workdir: Path, env: dict[str, str] | None = None) -> ServiceProcess:
    ready = workdir / f"{kind}.ready.json"
    ready.unlink(missing_ok=True)
    log_path = workdir / "logs" / f"{kind}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "vesper.coordinator", "serve", kind, "--config", str(config_path), "--ready-file", str(ready)]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
    return ServiceProcess(kind, process, ready, log_path)


def _exit_on_sigterm() -> object:
    """Make SIGTERM unwind like Ctrl-C, so a killed command still stops the services it
    started (they run in their own sessions and would not get the signal)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)


def _restore_sigterm(previous: object) -> None:
    if previous is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, previous)


def _reserve_port() -> socket.socket:
    """A bound, non-listening loopback socket: its port stays ours until a server that also
    sets SO_REUSEPORT (gRPC does by default on Linux) binds it and we close this one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class LocalCluster:
    """Accountant, party B and party A on loopback, each its own process."""

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
        self.services: dict[str, ServiceProcess] = {}

    def __enter__(self) -> LocalCluster:
        self._previous_sigterm = _exit_on_sigterm()
        try:
            self.start()
        except BaseException:
            self.stop()
            _restore_sigterm(self._previous_sigterm)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            _restore_sigterm(self._previous_sigterm)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        configs = self.workdir / "config"
        configs.mkdir(exist_ok=True)
        # party B needs the accountant's address (its own label ledger) before either has
        # started: reserve a port the accountant's gRPC server then shares (SO_REUSEPORT),
        # so the two start side by side; the token files exist before either reads them
        reservation = _reserve_port()
        accountant_address = f"127.0.0.1:{reservation.getsockname()[1]}"
        ensure_distinct_tokens(self.charge_token_file, self.label_token_file)
        try:
            write_section(configs / "accountant.toml", "accountant", {
                "listen": accountant_address, "rest_listen": "127.0.0.1:0", "ledger": str(self.ledger),
                "charge_token_file": str(self.charge_token_file),
                "label_charge_token_file": str(self.label_token_file),
            })
            write_section(configs / "party_b.toml", "party_b", {
                "listen": "127.0.0.1:0", "workdir": str(self.workdir / "party_b"),
                "datasets": self.datasets,
                "accountant": accountant_address,
                "accountant_token_file": str(self.label_token_file),
                **self.extra_b,
            })
            accountant = start_service("accountant", configs / "accountant.toml", self.workdir)
            party_b = start_service("party-b", configs / "party_b.toml", self.workdir)
            self.services = {"accountant": accountant, "party-b": party_b}
            accountant.wait_ready()
            party_b.wait_ready()
        finally:
            reservation.close()
        write_section(configs / "party_a.toml", "party_a", {
            "listen": "127.0.0.1:0",
            "label_party": party_b.grpc_address,
            "accountant": accountant.grpc_address,
            "accountant_status_url": accountant.info["rest_url"],
            "accountant_token_file": str(self.charge_token_file),
            "workdir": str(self.workdir / "party_a"),
            "datasets": self.datasets,
            **self.extra_a,
        })
        party_a = start_service("party-a", configs / "party_a.toml", self.workdir)
        self.services["party-a"] = party_a
        party_a.wait_ready()

    def stop(self) -> None:
        for name in ("party-a", "party-b", "accountant"):
            if name in self.services:
                self.services[name].stop()

    @property
    def party_a_address(self) -> str:
        return self.services["party-a"].grpc_address

    @property
    def party_b_address(self) -> str:
        return self.services["party-b"].grpc_address

    @property
    def accountant_address(self) -> str:
        return self.services["accountant"].grpc_address

    @property
    def status_url(self) -> str:
        return self.services["accountant"].info["rest_url"]
