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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vesper.common.charge_token import ensure_distinct_tokens
from vesper.common.config import TlsConfig
from vesper.common.tls import open_channel


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
    # the certificate its health is asked with (any role of the deployment's CA will do)
    tls: TlsConfig | None = None
    # False for a service in another network namespace: its loopback is not ours, so the
    # ready file (written once its server serves) is all we can see
    probe: bool = True

    def wait_ready(self, timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceStartError(
                    f"{self.name} exited with code {self.process.returncode}; see {self.log_path}:\n{self.log_tail()}"
                )
            if self.ready_file.exists():
                self.info = json.loads(self.ready_file.read_text())
                if not self.probe or _healthy(f"127.0.0.1:{self.info['grpc_port']}", self.tls):
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

    def terminate(self) -> None:
        """SIGTERM, without waiting (``stop`` waits)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.terminate()
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


def _healthy(address: str, tls: TlsConfig | None = None) -> bool:
    with open_channel(address, tls) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def start_service(
    kind: str, config_path: Path, workdir: Path, env: dict[str, str] | None = None,
    prefix: Sequence[str] = (), tls: TlsConfig | None = None, log_format: str = "text",
) -> ServiceProcess:
    """Start ``vesper serve KIND`` as a process of its own, logging to ``workdir/logs/KIND.log``
    in ``log_format`` (text or json lines).

    ``prefix``: a command the service runs under, e.g. ``["ip", "netns", "exec", NS]`` for a
    host of its own (its health is then not probed from here); ``tls``: a certificate of the
    deployment to probe its health with, when the service runs with mutual TLS.
    """
    ready = workdir / f"{kind}.ready.json"
    ready.unlink(missing_ok=True)
    log_path = workdir / "logs" / f"{kind}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        *prefix, sys.executable, "-m", "vesper.coordinator", "serve", kind, "--config", str(config_path),
        "--ready-file", str(ready), "--log-format", log_format,
    ]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, start_new_session=True
        )
    return ServiceProcess(kind, process, ready, log_path, tls=tls, probe=not prefix)


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


def _check_ports(service: ServiceProcess, **reserved: int) -> None:
    """A service serves on the ports its peers were told of (a setting given to the cluster may
    not move them: listen, rest_listen)."""
    served = {name: service.info.get(name) for name in reserved}
    if served != reserved:
        raise ServiceStartError(
            f"{service.name} serves on {served}, not on the ports reserved for it, {reserved}: "
            "a LocalCluster's settings may not set listen or rest_listen"
        )


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
        tls: bool = False,
        accountant: dict[str, Any] | None = None,
        log_format: str = "text",
    ) -> None:
        """``tls``: every connection mutual TLS, with certificates made in ``workdir/certs``
        (``vesper certs``; kept and reused when the cluster starts again); ``party_a``,
        ``party_b``, ``accountant``: settings added to each service's section (e.g.
        ``metrics_listen``); ``log_format``: the services' logs, text or json lines."""
        self.workdir = workdir
        self.tls = tls
        self.certs_dir = workdir / "certs"
        self.extra_a = party_a or {}
        self.extra_b = party_b or {}
        self.extra_accountant = accountant or {}
        self.log_format = log_format
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

    def role_tls(self, role: str) -> TlsConfig | None:
        """The TLS settings of ``role``'s certificate in this cluster (None without TLS)."""
        if not self.tls:
            return None
        return TlsConfig(
            ca_file=self.certs_dir / "ca.pem", cert_file=self.certs_dir / f"{role}.pem",
            key_file=self.certs_dir / f"{role}.key",
        )

    @property
    def coordinator_tls(self) -> TlsConfig | None:
        """What a client of this cluster presents: the coordinator's certificate (or None)."""
        return self.role_tls("coordinator")

    def _tls_section(self, role: str) -> dict[str, str] | None:
        tls = self.role_tls(role)
        return None if tls is None else {key: str(path) for key, path in tls.model_dump().items()}

    def start(self) -> None:
        """Start the three services side by side (each spends seconds importing torch and the
        accounting libraries): the ports each must know of another's are reserved first."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.tls and not (self.certs_dir / "ca.pem").exists():
            from vesper.coordinator.certs import make_certificates

            make_certificates(self.certs_dir)
        configs = self.workdir / "config"
        configs.mkdir(exist_ok=True)
        # each peer's address goes into another's settings before either has started: reserve
        # ports the servers then share (SO_REUSEPORT: gRPC sets it, the accountant's REST
        # socket too), so the three start at once; the token files exist before any reads them
        reservations = [_reserve_port() for _ in range(3)]
        accountant_port, rest_port, party_b_port = (sock.getsockname()[1] for sock in reservations)
        accountant_address = f"127.0.0.1:{accountant_port}"
        party_b_address = f"127.0.0.1:{party_b_port}"
        ensure_distinct_tokens(self.charge_token_file, self.label_token_file)
        try:
            write_section(configs / "accountant.toml", "accountant", {
                "listen": accountant_address, "rest_listen": f"127.0.0.1:{rest_port}", "ledger": str(self.ledger),
                "charge_token_file": str(self.charge_token_file),
                "label_charge_token_file": str(self.label_token_file),
                "tls": self._tls_section("accountant"),
                **self.extra_accountant,
            })
            write_section(configs / "party_b.toml", "party_b", {
                "listen": party_b_address, "workdir": str(self.workdir / "party_b"),
                "datasets": self.datasets,
                "accountant": accountant_address,
                "accountant_token_file": str(self.label_token_file),
                "tls": self._tls_section("party-b"),
                **self.extra_b,
            })
            write_section(configs / "party_a.toml", "party_a", {
                "listen": "127.0.0.1:0",
                "label_party": party_b_address,
                "accountant": accountant_address,
                "accountant_status_url": f"{'https' if self.tls else 'http'}://127.0.0.1:{rest_port}",
                "accountant_token_file": str(self.charge_token_file),
                "workdir": str(self.workdir / "party_a"),
                "datasets": self.datasets,
                "tls": self._tls_section("party-a"),
                **self.extra_a,
            })
            for kind, section in (("accountant", "accountant"), ("party-b", "party_b"), ("party-a", "party_a")):
                self.services[kind] = self._start(kind, configs / f"{section}.toml")
            for service in self.services.values():
                service.wait_ready()
            _check_ports(self.services["accountant"], grpc_port=accountant_port, rest_port=rest_port)
            _check_ports(self.services["party-b"], grpc_port=party_b_port)
        finally:
            for sock in reservations:
                sock.close()

    def _start(self, kind: str, config_path: Path) -> ServiceProcess:
        return start_service(kind, config_path, self.workdir, tls=self.coordinator_tls, log_format=self.log_format)

    def stop(self) -> None:
        """Party A first (a run it is driving ends before its peers go), then B and the
        accountant together."""
        if "party-a" in self.services:
            self.services["party-a"].stop()
        peers = [self.services[name] for name in ("party-b", "accountant") if name in self.services]
        for service in peers:
            service.terminate()
        for service in peers:
            service.stop()

    def restart(self, name: str) -> ServiceProcess:
        """Start ``name`` (party-a, party-b or accountant) again, after a kill, on the ports
        it had: its peers reconnect to the same addresses (the fault drills)."""
        old = self.services[name]
        old.kill()
        section = name.replace("-", "_")
        path = self.workdir / "config" / f"{section}.toml"
        values = tomllib.loads(path.read_text())[section]
        values["listen"] = f"127.0.0.1:{old.info['grpc_port']}"
        if "rest_port" in old.info:
            values["rest_listen"] = f"127.0.0.1:{old.info['rest_port']}"
        write_section(path, section, values)
        service = self._start(name, path)
        self.services[name] = service
        service.wait_ready()
        return service

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
