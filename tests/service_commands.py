"""Helpers of the tests that run `vesper` as a service's health check or install it (test_deploy,
test_health_command): a free port, the command as a process or in this process, an accountant's config."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from vesper.coordinator.processes import write_section


# -- the command and a service to ask --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vesper(*args: str, executable: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The `vesper` command as a process, as a container's HEALTHCHECK runs it."""
    command = [str(executable)] if executable else [sys.executable, "-m", "vesper.coordinator"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout)


def health(*args: str) -> tuple[int, str, str]:
    """`vesper health ...` in this process (no interpreter start-up): exit code, stdout, stderr."""
    from typer.testing import CliRunner

    from vesper.coordinator.cli import app

    result = CliRunner().invoke(app, ["health", *args])
    return result.exit_code, result.stdout, result.stderr


def accountant_config(workdir: Path, port: int, tls: dict[str, str] | None = None) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "accountant.toml"
    write_section(path, "accountant", {
        "listen": f"127.0.0.1:{port}", "rest_listen": "127.0.0.1:0", "ledger": str(workdir / "ledger.sqlite"),
        "charge_token_file": str(workdir / "charge.token"), "label_charge_token_file": str(workdir / "label.token"),
    })
    if tls:
        with path.open("a") as handle:
            handle.write("[accountant.tls]\n" + "".join(f'{k} = "{v}"\n' for k, v in tls.items()))
    return path


def tls_settings(directory: Path, role: str) -> dict[str, str]:
    return {"ca_file": str(directory / "ca.pem"), "cert_file": str(directory / f"{role}.pem"),
            "key_file": str(directory / f"{role}.key")}


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])
