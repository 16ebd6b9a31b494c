"""LocalCluster (coordinator/processes.py): the three services start side by side on ports
reserved for them, and a service that stops ends its process at once (coordinator/cli/serve.py)."""

from __future__ import annotations

import signal
import sqlite3
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest
from service_commands import accountant_config, free_port

from vesper.coordinator.processes import LocalCluster, ServiceStartError, _check_ports, start_service

pytestmark = pytest.mark.e2e


def test_each_peer_was_told_the_address_it_serves_on(cluster: LocalCluster) -> None:
    """Party A's settings were written before its peers served: they name the ports those took."""
    settings = tomllib.loads((cluster.workdir / "config" / "party_a.toml").read_text())["party_a"]
    assert settings["label_party"] == cluster.party_b_address
    assert settings["accountant"] == cluster.accountant_address
    assert settings["accountant_status_url"] == cluster.status_url
    party_b = tomllib.loads((cluster.workdir / "config" / "party_b.toml").read_text())["party_b"]
    assert party_b["accountant"] == cluster.accountant_address


def test_a_service_on_other_ports_than_reserved_is_a_start_error() -> None:
    accountant = SimpleNamespace(name="accountant", info={"grpc_port": 5000, "rest_port": 5002})
    _check_ports(accountant, grpc_port=5000, rest_port=5002)
    with pytest.raises(ServiceStartError, match="accountant serves on .* not on the ports reserved for it"):
        _check_ports(accountant, grpc_port=5000, rest_port=5001)


def test_a_stopped_service_exits_0_with_its_log_written_and_its_ledger_closed(tmp_path: Path) -> None:
    """SIGTERM: the accountant closes its ledger (the write-ahead log moved into the file), its
    last log line is written, and the process ends with 0 without the interpreter's teardown."""
    service = start_service("accountant", accountant_config(tmp_path, free_port()), tmp_path)
    try:
        service.wait_ready()
    finally:
        service.process.send_signal(signal.SIGTERM)
        assert service.process.wait(timeout=30) == 0, service.log_tail()
    assert service.log_tail().splitlines()[-1].endswith("ledger.sqlite closed"), service.log_tail()
    assert not (tmp_path / "ledger.sqlite-wal").exists()
    with sqlite3.connect(tmp_path / "ledger.sqlite") as ledger:
        assert ledger.execute("PRAGMA integrity_check").fetchone() == ("ok",)
