"""Every service's /metrics (issue #23, item 4), scraped from three real processes on loopback
after a short training run, and checked against what the ledger, the run's summary and the
services' JSON logs say happened. One cluster for the whole module (and for the JSON log
lines: the services run with ``--log-format json``), to keep ``make test`` short."""

from __future__ import annotations

import json
import re
import urllib.request
from collections import Counter
from pathlib import Path

import dp_accounting as dpa
import grpc
import httpx
import pytest
from e2e import ledger, vesper
from prometheus_client.parser import text_string_to_metric_families

from vesper.common.accountant_client import AccountantClient, BudgetRefused
from vesper.common.charge_token import read_token
from vesper.common.config import AccountantConfig, PartyAConfig, PartyBConfig
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import ChargeRule
from vesper.coordinator.processes import LocalCluster
from vesper.proto.v1 import accountant_pb2 as acc_pb
from vesper.proto.v1 import accountant_pb2_grpc as acc_grpc

pytestmark = pytest.mark.e2e
METRICS = {"metrics_listen": "127.0.0.1:0"}
ACCOUNTANT = "vesper.v1.Accountant"
GRPC_FAMILIES = {"vesper_grpc_server_handled", "vesper_grpc_server_received_bytes", "vesper_grpc_server_sent_bytes"}
FAMILIES = {
    "accountant": GRPC_FAMILIES | {
        "vesper_accountant_charges", "vesper_accountant_charge_retries", "vesper_accountant_charge_refusals",
        "vesper_accountant_charge_seconds", "vesper_accountant_epsilon_spent", "vesper_accountant_epsilon_budget",
    },
    "party-a": GRPC_FAMILIES | {"vesper_party_a_steps", "vesper_party_a_releases", "vesper_party_a_release_bytes"},
    "party-b": GRPC_FAMILIES | {"vesper_party_b_step_seconds"},
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Scrape:
    """One scrape of a service's /metrics: its families (with types) and every sample's value."""

    def __init__(self, text: str) -> None:
        self.types: dict[str, str] = {}
        self.samples: Samples = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value

    def value(self, name: str, **labels: str) -> float:
        """A sample's value; 0 for a counter child that was never touched (absent)."""
        return self.samples.get((name, tuple(sorted(labels.items()))), 0.0)

    def by(self, name: str, label: str, **fixed: str) -> dict[str, float]:
        """``name``'s samples matching ``fixed``, keyed by the value of ``label``."""
        return {
            dict(labels)[label]: value for (sample, labels), value in self.samples.items()
            if sample == name and fixed.items() <= dict(labels).items()
        }


def scrape(cluster: LocalCluster, service: str) -> Scrape:
    port = cluster.services[service].info["metrics_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        return Scrape(response.read().decode())


# the tests that share one training run through three services that serve metrics (~85 s in all):
# make test-slow; the settings' checks below stay in make test
TRAINED_RUN = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("metrics")
    with LocalCluster(
        workdir, party_a={"secret_seed": 11, **METRICS}, party_b=METRICS, accountant=METRICS, log_format="json",
    ) as c:
        yield c


@pytest.fixture(scope="module")
def trained(cluster: LocalCluster, tmp_path_factory) -> dict:
    """One short private run; the scrapes before and after it, its summary and its ledger rows."""
    before = {name: scrape(cluster, name) for name in cluster.services}
    out = tmp_path_factory.mktemp("run") / "run.json"
    code, output = vesper(
        "train", "--party-a", cluster.party_a_address, "--dataset", "cora", "--epochs", "1", "--batch-size", "256",
        "--epsilon", "8", "--json-out", str(out),
    )
    assert code == 0, output
    summary = json.loads(out.read_text())
    after = {name: scrape(cluster, name) for name in cluster.services}
    return {"before": before, "after": after, "summary": summary, "rows": ledger(cluster.status_url, summary["run_id"])["rows"]}


@TRAINED_RUN
def test_each_service_serves_the_listed_families_with_their_types(cluster: LocalCluster, trained: dict) -> None:
    for service, families in FAMILIES.items():
        served = trained["after"][service].types
        assert families <= set(served), f"{service} lacks {sorted(families - set(served))}"
    accountant, party_b = trained["after"]["accountant"].types, trained["after"]["party-b"].types
    assert accountant["vesper_accountant_charges"] == "counter"
    assert accountant["vesper_accountant_charge_seconds"] == "histogram"
    assert accountant["vesper_accountant_epsilon_spent"] == "gauge"
    assert party_b["vesper_party_b_step_seconds"] == "histogram"
    assert trained["after"]["party-a"].types["vesper_party_a_steps"] == "counter"


@TRAINED_RUN
def test_the_accountant_counts_what_its_ledger_holds(cluster: LocalCluster, trained: dict) -> None:
    run_id, after, before = trained["summary"]["run_id"], trained["after"]["accountant"], trained["before"]["accountant"]
    rows = Counter(row["kind"] for row in trained["rows"])
    assert rows["train"] > 0 and rows["eval"] > 0
    assert after.by("vesper_accountant_charges_total", "kind", run=run_id) == dict(rows)
    status = httpx.get(f"{cluster.status_url}/v1/runs/{run_id}", timeout=10).json()
    assert after.value("vesper_accountant_epsilon_spent", run=run_id) == status["epsilon_spent"] > 0
    assert after.value("vesper_accountant_epsilon_budget", run=run_id) == 8.0
    timed = after.value("vesper_accountant_charge_seconds_count") - before.value("vesper_accountant_charge_seconds_count")
    assert timed == sum(rows.values())  # every charge of the run is timed, nothing else was charged
    charges = after.value("vesper_grpc_server_handled_total", service=ACCOUNTANT, method="Charge", code="OK")
    assert charges - before.value("vesper_grpc_server_handled_total", service=ACCOUNTANT, method="Charge", code="OK") == timed
    assert after.value("vesper_grpc_server_received_bytes_total", service=ACCOUNTANT, method="Charge") > 0


@TRAINED_RUN
def test_party_a_counts_its_steps_and_releases(trained: dict) -> None:
    run_id, party_a = trained["summary"]["run_id"], trained["after"]["party-a"]
    assert party_a.value("vesper_party_a_steps_total", run=run_id) == trained["summary"]["steps"] > 0
    assert party_a.by("vesper_party_a_releases_total", "kind", run=run_id) == dict(Counter(r["kind"] for r in trained["rows"]))
    # what A released reached B: B received at least those bytes on its Train and Evaluate streams
    released = party_a.by("vesper_party_a_release_bytes_total", "kind", run=run_id)
    received = trained["after"]["party-b"].by("vesper_grpc_server_received_bytes_total", "method")
    received_before = trained["before"]["party-b"].by("vesper_grpc_server_received_bytes_total", "method")
    for kind, method in (("train", "Train"), ("eval", "Evaluate")):
        assert 0 < released[kind] <= received[method] - received_before.get(method, 0.0)


@TRAINED_RUN
def test_party_b_times_every_step(trained: dict) -> None:
    before, after = trained["before"]["party-b"], trained["after"]["party-b"]
    steps = after.value("vesper_party_b_step_seconds_count") - before.value("vesper_party_b_step_seconds_count")
    assert steps == trained["summary"]["steps"]
    assert after.value("vesper_party_b_step_seconds_bucket", le="+Inf") == after.value("vesper_party_b_step_seconds_count")
    assert after.value("vesper_party_b_step_seconds_sum") > before.value("vesper_party_b_step_seconds_sum")
    handled = after.by("vesper_grpc_server_handled_total", "method", code="OK", service="vesper.v1.LabelParty")
    assert {"SetupRun", "Train", "Evaluate", "FinishRun"} <= set(handled)


def _charge(client: AccountantClient, run_id: str, i: int) -> acc_pb.ChargeReceipt:
    return client.charge(run_id, f"train-0/{i}", "train", "train", 8, f"digest-{i}", EVENT)


EVENT = event_to_json(dpa.GaussianDpEvent(2.0))


@TRAINED_RUN
def test_refusals_and_failed_calls_are_counted_by_status(cluster: LocalCluster, trained: dict) -> None:
    run_id = "metrics-refusal"
    client = AccountantClient(cluster.accountant_address, read_token(cluster.charge_token_file), charge_retries=0)
    try:
        rules = [ChargeRule(kind="train", release_event=EVENT, participation_bound=None)]
        client.create_run(run_id, 6.0, 1e-5, rules, "pmp-gin", "visible-batch", "pld", {})
        receipts = []
        with pytest.raises(BudgetRefused, match="budget exhausted"):
            for i in range(100):  # ε of σ = 2 grows past 6 within a few charges
                receipts.append(_charge(client, run_id, i))
        assert receipts, "the first charge fits the budget"
        _charge(client, run_id, 0)  # a retry: answered from the ledger, not charged again
    finally:
        client.close()
    with grpc.insecure_channel(cluster.accountant_address) as channel:
        with pytest.raises(grpc.RpcError) as info:
            acc_grpc.AccountantStub(channel).GetRun(acc_pb.GetRunRequest(run_id="no-such-run"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    metrics = scrape(cluster, "accountant")
    assert metrics.value("vesper_accountant_charges_total", run=run_id, kind="train") == len(receipts)
    assert metrics.value("vesper_accountant_charge_retries_total", run=run_id, kind="train") == 1
    assert metrics.by("vesper_accountant_charge_refusals_total", "reason", run=run_id, kind="train") == {
        "RESOURCE_EXHAUSTED": 1.0,
    }
    status = httpx.get(f"{cluster.status_url}/v1/runs/{run_id}", timeout=10).json()
    assert metrics.value("vesper_accountant_epsilon_spent", run=run_id) == status["epsilon_spent"] <= 6.0
    refused = metrics.value("vesper_grpc_server_handled_total", service=ACCOUNTANT, method="Charge", code="RESOURCE_EXHAUSTED")
    assert refused == 1
    assert metrics.value("vesper_grpc_server_handled_total", service=ACCOUNTANT, method="GetRun", code="NOT_FOUND") == 1


@TRAINED_RUN
def test_json_log_lines_name_the_run_they_were_logged_for(cluster: LocalCluster, trained: dict) -> None:
    run_id = trained["summary"]["run_id"]
    for service in ("party-a", "party-b"):
        lines = (cluster.workdir / "logs" / f"{service}.log").read_text().splitlines()
        records = [json.loads(line) for line in lines]  # every line is one JSON object
        assert records and all({"ts", "level", "logger", "message", "run_id"} <= set(r) for r in records)
        about_run = [r for r in records if run_id in r["message"]]
        assert about_run, f"{service} logged nothing about run {run_id}"
        # a line names the run, or one of its stages' sessions at B ("<run>.encoder": GAP's edge-free
        # encoder stage), and carries that id
        named = [re.search(rf"{run_id}(\.[a-z-]+)?", r["message"]).group(0) for r in about_run]
        assert all(r["run_id"] == name for r, name in zip(about_run, named, strict=True)), about_run
        assert run_id in named
        assert any(r["run_id"] is None for r in records)  # the start-up lines belong to no run


@pytest.mark.parametrize("model", [PartyAConfig, PartyBConfig, AccountantConfig])
@pytest.mark.parametrize("listen", ["9464", "localhost", "127.0.0.1:99999", ":9464", "127.0.0.1:94a"])
def test_a_bad_metrics_address_is_refused_with_the_fix(model: type, listen: str) -> None:
    with pytest.raises(ValueError, match=r"metrics_listen[\s\S]*must be host:port, e\.g\. 127\.0\.0\.1:9464"):
        model(metrics_listen=listen)


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "0.0.0.0:9464", "[::1]:9464", "metrics.example.org:9100"])
def test_a_metrics_address_is_host_and_port(listen: str) -> None:
    assert PartyAConfig(metrics_listen=listen).metrics_listen == listen
    assert AccountantConfig().metrics_listen is None  # no metrics unless asked for


def test_a_service_whose_metrics_port_is_taken_stops_naming_the_setting(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = tmp_path / "b.toml"
        config.write_text(
            f'[party_b]\nlisten = "127.0.0.1:0"\nworkdir = "{tmp_path / "b"}"\nmetrics_listen = "127.0.0.1:{port}"\n'
        )
        code, output = vesper("serve", "party-b", "--config", str(config))
    assert code == 2 and "party_b.metrics_listen" in output and "cannot serve metrics there" in output, output
