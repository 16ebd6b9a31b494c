"""`vesper health` (docs/deployment.md): what a container's HEALTHCHECK runs, against a live
service, with its own TLS certificate, and what it cannot check."""

from __future__ import annotations

from pathlib import Path

import pytest
from service_commands import accountant_config, free_port, health, port_of, tls_settings, vesper

from vesper.common.config import load_config
from vesper.coordinator.processes import start_service

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("accountant", "party-a", "party-b", "coordinator")  # vesper certs' roles


def test_health_says_serving_for_a_live_service_and_not_once_it_stops(tmp_path: Path) -> None:
    config = accountant_config(tmp_path, free_port())
    port = port_of(load_config(config).accountant.listen)
    service = start_service("accountant", config, tmp_path)
    try:
        service.wait_ready()
        live = vesper("health", "--config", str(config), "accountant")
        assert live.returncode == 0, live.stderr
        assert live.stdout.strip() == f"accountant at 127.0.0.1:{port}: SERVING"
    finally:
        service.stop()
    code, out, err = health("--config", str(config), "accountant")
    assert code == 1 and out == ""
    (line,) = err.strip().splitlines()  # one line, naming the problem
    assert line.startswith(f"accountant at 127.0.0.1:{port}: not serving: UNAVAILABLE"), line


def test_health_checks_a_tls_service_with_its_own_certificate(tmp_path: Path) -> None:
    from vesper.common.config import TlsConfig
    from vesper.common.grpc_server import start_server
    from vesper.coordinator.certs import CertificatePlan, make_certificates

    # certificates naming only the compose service names, not 127.0.0.1: the health check
    # dials loopback and must still verify the service's own certificate
    ours, theirs = tmp_path / "tls", tmp_path / "other-ca"
    for directory in (ours, theirs):
        make_certificates(directory, CertificatePlan(hosts={r: [r] for r in ROLES}))
    port = free_port()
    # the server every vesper service runs (health service included), with mutual TLS
    server, _ = start_server(f"127.0.0.1:{port}", [], max_message_mb=4,
                             tls=TlsConfig(**tls_settings(ours, "accountant")))
    try:
        config = accountant_config(tmp_path / "tls-config", port, tls_settings(ours, "accountant"))
        code, out, err = health("--config", str(config), "accountant")
        assert code == 0, err
        assert out.strip() == f"accountant at 127.0.0.1:{port}: SERVING"

        # the same server asked in plaintext, or with a certificate of another deployment's CA
        plain = accountant_config(tmp_path / "plain", port)
        foreign = accountant_config(tmp_path / "foreign", port, tls_settings(theirs, "accountant"))
        for refused in (plain, foreign):
            code, out, err = health("--config", str(refused), "accountant", "--timeout", "2")
            assert code == 1 and f"accountant at 127.0.0.1:{port}: not serving" in err, (refused, err)
    finally:
        server.stop(grace=None)


def test_health_explains_what_it_cannot_check(tmp_path: Path) -> None:
    port = free_port()
    closed = accountant_config(tmp_path, port)  # nothing listens there
    code, _, err = health("--config", str(closed), "accountant", "--timeout", "1")
    assert code == 1 and "UNAVAILABLE" in err

    code, _, err = health("--config", str(closed), "party-a")
    assert code == 1 and "has no [party_a] section" in err

    any_port = tmp_path / "any-port.toml"
    any_port.write_text(closed.read_text().replace(f"127.0.0.1:{port}", "0.0.0.0:0"))
    code, _, err = health("--config", str(any_port), "accountant")
    assert code == 1 and "port 0" in err

    missing = tmp_path / "missing-key.toml"
    missing.write_text(closed.read_text() + '[accountant.tls]\nca_file = "/nonexistent/ca.pem"\n'
                       'cert_file = "/nonexistent/a.pem"\nkey_file = "/nonexistent/a.key"\n')
    code, _, err = health("--config", str(missing), "accountant")
    assert code == 1 and "accountant.tls.ca_file = /nonexistent/ca.pem" in err


def test_health_asks_loopback_for_a_wildcard_listen_address() -> None:
    from vesper.coordinator.health_check import HealthCheckError, connect_address

    assert connect_address("0.0.0.0:50051") == "127.0.0.1:50051"
    assert connect_address("[::]:50052") == "[::1]:50052"
    assert connect_address("accountant:50053") == "accountant:50053"
    with pytest.raises(HealthCheckError, match="not host:port"):
        connect_address("50053")
