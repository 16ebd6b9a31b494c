"""Two hosts on one machine: party B alone in one network namespace, the accountant and
party A in another, joined by a veth pair on private addresses; certificates from
``vesper certs`` for those addresses; a Cora run across them over mutual TLS, with B's
label ledger charged across the link too. The namespaces are removed afterwards, even
on failure. Skipped, with the failing command and its error, where namespaces cannot be
made (not root, no ``ip``, no CAP_NET_ADMIN)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e import NO_PATH_STAGE, vesper

from vesper.common.charge_token import ensure_distinct_tokens
from vesper.coordinator.processes import ServiceProcess, start_service, write_section

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# a /30 of our own between the two namespaces: nothing else on the machine routes to it
A_HOST, B_HOST, PREFIX = "10.231.0.1", "10.231.0.2", 30
ACCOUNTANT, REST, PARTY_A, PARTY_B = f"{A_HOST}:50053", f"{A_HOST}:8443", f"{A_HOST}:50051", f"{B_HOST}:50052"


@dataclass(frozen=True)
class TwoHosts:
    a: str  # namespace of party A and the accountant
    b: str  # namespace of party B

    def exec(self, namespace: str) -> list[str]:
        return ["ip", "netns", "exec", namespace]


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _namespaces() -> set[str]:
    return {line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()}


@pytest.fixture
def two_hosts():
    if shutil.which("ip") is None:
        pytest.skip("network namespaces: no `ip` command here (Debian package iproute2)")
    tag = str(os.getpid())
    hosts = TwoHosts(a=f"vesper-a-{tag}", b=f"vesper-b-{tag}")
    veth_a, veth_b = f"vsa{tag}"[:15], f"vsb{tag}"[:15]  # interface names have at most 15 characters
    created: list[str] = []
    steps = [
        ("netns", "add", hosts.a), ("netns", "add", hosts.b),
        ("link", "add", veth_a, "netns", hosts.a, "type", "veth", "peer", "name", veth_b, "netns", hosts.b),
        ("-n", hosts.a, "addr", "add", f"{A_HOST}/{PREFIX}", "dev", veth_a),
        ("-n", hosts.b, "addr", "add", f"{B_HOST}/{PREFIX}", "dev", veth_b),
        ("-n", hosts.a, "link", "set", veth_a, "up"), ("-n", hosts.b, "link", "set", veth_b, "up"),
        ("-n", hosts.a, "link", "set", "lo", "up"), ("-n", hosts.b, "link", "set", "lo", "up"),
    ]
    try:
        for step in steps:
            result = _ip(*step)
            if result.returncode != 0:
                pytest.skip(
                    f"cannot make two hosts in network namespaces here: `ip {' '.join(step)}` failed "
                    f"(exit {result.returncode}): {result.stderr.strip()}"
                )
            if step[:2] == ("netns", "add"):
                created.append(step[2])
        yield hosts
    finally:
        for namespace in created:  # deleting a namespace deletes its end of the veth pair, and so the pair
            _ip("netns", "del", namespace)
        left = _namespaces() & set(created)
        assert not left, f"network namespaces left behind: {sorted(left)}"


def _tls(certs: Path, role: str) -> dict[str, str]:
    return {"ca_file": str(certs / "ca.pem"), "cert_file": str(certs / f"{role}.pem"), "key_file": str(certs / f"{role}.key")}


def _in_namespace(namespace: str, service: ServiceProcess) -> bool:
    result = _ip("netns", "identify", str(service.process.pid))
    return result.stdout.split() == [namespace]


def test_a_run_across_two_hosts_in_network_namespaces_over_mutual_tls(two_hosts: TwoHosts, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    code, output = vesper(
        "certs", "--out", str(certs),
        "--host", f"accountant={A_HOST}", "--host", f"party-a={A_HOST}", "--host", f"party-b={B_HOST}",
    )
    assert code == 0, output
    charge_token, label_token = tmp_path / "charge.token", tmp_path / "label-charge.token"
    ensure_distinct_tokens(charge_token, label_token)  # B reads its copy when it starts
    configs = tmp_path / "config"
    configs.mkdir()
    write_section(configs / "accountant.toml", "accountant", {
        "listen": ACCOUNTANT, "rest_listen": REST, "ledger": str(tmp_path / "ledger.sqlite"),
        "charge_token_file": str(charge_token), "label_charge_token_file": str(label_token),
        "tls": _tls(certs, "accountant"),
    })
    write_section(configs / "party_b.toml", "party_b", {
        "listen": PARTY_B, "workdir": str(tmp_path / "party_b"), "accountant": ACCOUNTANT,
        "accountant_status_url": f"https://{REST}", "accountant_token_file": str(label_token),
        "tls": _tls(certs, "party-b"),
    })
    write_section(configs / "party_a.toml", "party_a", {
        "listen": PARTY_A, "label_party": PARTY_B, "accountant": ACCOUNTANT,
        "accountant_status_url": f"https://{REST}", "accountant_token_file": str(charge_token),
        "workdir": str(tmp_path / "party_a"), "tls": _tls(certs, "party-a"),
    })
    write_section(configs / "coordinator.toml", "coordinator", {
        "party_a": PARTY_A, "accountant_status_url": f"https://{REST}", "tls": _tls(certs, "coordinator"),
    })
    services: list[ServiceProcess] = []
    try:
        for kind, config, namespace in (
            ("accountant", "accountant.toml", two_hosts.a), ("party-b", "party_b.toml", two_hosts.b),
            ("party-a", "party_a.toml", two_hosts.a),
        ):
            service = start_service(kind, configs / config, tmp_path, prefix=two_hosts.exec(namespace))
            services.append(service)
            service.wait_ready()
            assert _in_namespace(namespace, service), f"{kind} is not in namespace {namespace}"

        def coordinator(*args: str) -> subprocess.CompletedProcess:
            """``vesper`` on A's host: the coordinator reaches party A and the REST status there."""
            command = [*two_hosts.exec(two_hosts.a), sys.executable, "-m", "vesper.coordinator", *args]
            return subprocess.run(command, capture_output=True, text=True, timeout=600)

        out = tmp_path / "run.json"
        run = coordinator(
            "train", "--config", str(configs / "coordinator.toml"), "--dataset", "cora", "--epochs", "1",
            *NO_PATH_STAGE, "--label-privacy", "rr", "--label-epsilon", "4", "--json-out", str(out),
        )
        logs = "\n".join(f"--- {s.name}:\n{s.log_tail()}" for s in services)
        assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{logs}"
        summary = json.loads(out.read_text())
        assert summary["status"] == "completed" and 0 < summary["epsilon_spent"] <= summary["epsilon_budget"]
        assert summary["label_run_id"] == f"{summary['run_id']}.labels"
        # both ledgers, read over https from A's host and checked against the CA, replay exactly
        for ledger_id in (summary["run_id"], summary["label_run_id"]):
            verify = coordinator("ledger", "verify", ledger_id, "--config", str(configs / "coordinator.toml"))
            assert verify.returncode == 0 and "verified" in verify.stdout, f"{verify.stdout}\n{verify.stderr}"
        # B really served from its own host: every step it answered came over the link
        assert "finished at B: completed" in services[1].log_tail(50)
    finally:
        for service in reversed(services):
            service.stop()
