"""Mutual TLS (common/tls.py, ``vesper certs``): a run across the three services over TLS,
refusal of peers without a certificate, with one from another CA or of the wrong role
(each beside the same call succeeding with the right one), the public REST status over
https, and the certificate files ``vesper certs`` writes."""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import dp_accounting as dpa
import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from e2e import vesper
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vesper.common.charge_token import read_token
from vesper.common.config import TlsConfig
from vesper.common.privacy.events import event_to_json
from vesper.common.privacy.ledger import LABEL_ACCOUNTING, LABEL_KIND, LABEL_UNIT
from vesper.common.tls import TlsError, load_material, open_channel, peer_role, role_refusal
from vesper.coordinator.certs import ROLES, make_certificates
from vesper.coordinator.processes import LocalCluster, write_section
from vesper.proto.v1 import accountant_pb2 as acc
from vesper.proto.v1 import accountant_pb2_grpc as acc_grpc
from vesper.proto.v1 import graph_party_pb2 as ga
from vesper.proto.v1 import graph_party_pb2_grpc as ga_grpc
from vesper.proto.v1 import label_party_pb2 as lp
from vesper.proto.v1 import label_party_pb2_grpc as lp_grpc
from vesper.proto.v1 import tensor_pb2

pytestmark = pytest.mark.e2e
EVENT = event_to_json(dpa.GaussianDpEvent(4.0))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(tmp_path_factory.mktemp("tls"), tls=True) as c:
        yield c


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> Path:
    """Certificates of every role from another CA: a stranger's, however well-formed."""
    directory = tmp_path_factory.mktemp("foreign-ca")
    make_certificates(directory)
    return directory


def _tls(directory: Path, role: str) -> TlsConfig:
    return TlsConfig(ca_file=directory / "ca.pem", cert_file=directory / f"{role}.pem", key_file=directory / f"{role}.key")


def _health(channel: grpc.Channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status


def _refused(method, *args, **kwargs) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        method(*args, **kwargs)
    return info.value


def _addresses(cluster: LocalCluster) -> dict[str, str]:
    return {"party-a": cluster.party_a_address, "party-b": cluster.party_b_address, "accountant": cluster.accountant_address}


@pytest.mark.slow  # a whole run over mTLS, ~100 s: make test-slow (the containers test runs one too)
def test_a_run_over_mutual_tls_completes_and_its_ledger_replays(cluster, tmp_path) -> None:
    assert cluster.status_url.startswith("https://")
    config = tmp_path / "coordinator.toml"
    tls = cluster.coordinator_tls
    write_section(config, "coordinator", {
        "party_a": cluster.party_a_address, "accountant_status_url": cluster.status_url,
        "tls": {key: str(path) for key, path in tls.model_dump().items()},
    })
    out = tmp_path / "run.json"
    code, output = vesper("train", "--config", str(config), "--dataset", "cora", "--epochs", "1", "--json-out", str(out))
    assert code == 0, output
    summary = json.loads(out.read_text())
    assert summary["status"] == "completed" and 0 < summary["epsilon_spent"] <= summary["epsilon_budget"]
    assert summary["status_url"].startswith("https://")
    # the ledger, read over https and verified against the deployment's CA, replays to the same ε
    code, output = vesper("ledger", "verify", summary["run_id"], "--config", str(config))
    assert code == 0 and "verified" in output, output
    # the same command without a certificate cannot even reach party A
    plain = tmp_path / "plain.toml"
    write_section(plain, "coordinator", {"party_a": cluster.party_a_address})
    code, output = vesper("train", "--config", str(plain), "--dataset", "cora", "--epochs", "1")
    assert code == 1 and "cannot reach party A" in output, output


def test_every_service_refuses_a_peer_without_a_certificate_of_the_deployment(cluster, foreign) -> None:
    material = load_material(cluster.coordinator_tls)
    for name, address in _addresses(cluster).items():
        # plaintext, TLS without a client certificate, and a certificate from another CA
        # (made by hand: open_channel itself refuses files that do not fit together)
        without_cert = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=material.ca))
        stranger = grpc.secure_channel(address, grpc.ssl_channel_credentials(
            root_certificates=material.ca, private_key=(foreign / "coordinator.key").read_bytes(),
            certificate_chain=(foreign / "coordinator.pem").read_bytes(),
        ))
        for channel in (grpc.insecure_channel(address), without_cert, stranger):
            with channel:
                assert _refused(_health, channel).code() == grpc.StatusCode.UNAVAILABLE, name
        # the same call with the deployment's certificate: any role may ask a service's health
        for role in ROLES:
            with open_channel(address, cluster.role_tls(role)) as channel:
                assert _health(channel) == health_pb2.HealthCheckResponse.SERVING, (name, role)
        # nor does a client trust a server that is not the deployment's
        with open_channel(address, _tls(foreign, "coordinator")) as channel:
            assert _refused(_health, channel).code() == grpc.StatusCode.UNAVAILABLE, name


def test_party_b_serves_only_party_a(cluster) -> None:
    request = lp.SetupRunRequest(
        run_id="tls-role", dataset="cora", decoder=lp.DecoderSpec(kind="concat", hidden_dim=8),
        optimizer=lp.OptimizerSpec(name="adam", lr=0.01), embedding_dim=4, num_layers=1,
        wire_dtype=tensor_pb2.DTYPE_FLOAT32,
    )
    for role in ("coordinator", "party-b", "accountant"):
        with open_channel(cluster.party_b_address, cluster.role_tls(role)) as channel:
            error = _refused(lp_grpc.LabelPartyStub(channel).SetupRun, request, timeout=30)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, role
        assert f"role {role!r}" in error.details() and "'party-a'" in error.details(), error.details()
    with open_channel(cluster.party_b_address, cluster.role_tls("party-a")) as channel:
        stub = lp_grpc.LabelPartyStub(channel)
        reply = stub.SetupRun(request, timeout=30)
        assert reply.num_classes == 7 and len(reply.train_ids) > 0
        stub.FinishRun(lp.FinishRunRequest(run_id="tls-role", status="cancelled", reason="role test"), timeout=30)


def test_party_b_gives_scores_only_to_its_own_operator(cluster) -> None:
    """LabelOwner (vesper predict's scores): the coordinator's certificate only; the prediction pass itself
    (LabelParty.Predict) and the alignment's rounds only party A's."""
    request = lp.ScoresRequest(run_id="abcdef012345", select="all")
    for role in ("party-a", "party-b", "accountant"):
        with open_channel(cluster.party_b_address, cluster.role_tls(role)) as channel:
            error = _refused(lp_grpc.LabelOwnerStub(channel).CheckKeys, request, timeout=30)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "'coordinator'" in error.details(), role
    with open_channel(cluster.party_b_address, cluster.role_tls("coordinator")) as channel:
        error = _refused(lp_grpc.LabelOwnerStub(channel).CheckKeys, request, timeout=30)
        assert error.code() == grpc.StatusCode.NOT_FOUND and "no finished run" in error.details(), error.details()
        chunk = lp.AlignPoints(alignment_id="x", dataset="cora", part="U")
        error = _refused(lambda: list(lp_grpc.LabelPartyStub(channel).AlignExchange(iter([chunk]), timeout=30)))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "'party-a'" in error.details(), error.details()


def test_party_a_takes_runs_only_from_the_coordinator_or_itself(cluster) -> None:
    request = ga.StartRunRequest(run_config_json=json.dumps({"dataset": "no-such-dataset"}))
    for role in ("party-b", "accountant"):
        with open_channel(cluster.party_a_address, cluster.role_tls(role)) as channel:
            error = _refused(lambda stub: list(stub.StartRun(request, timeout=30)), ga_grpc.GraphPartyStub(channel))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, role
        assert f"role {role!r}" in error.details() and "'coordinator' or 'party-a'" in error.details(), error.details()
    # past the role check, party A reads the request (the whole run is the first test)
    for role in ("coordinator", "party-a"):
        with open_channel(cluster.party_a_address, cluster.role_tls(role)) as channel:
            error = _refused(lambda stub: list(stub.StartRun(request, timeout=30)), ga_grpc.GraphPartyStub(channel))
        assert error.code() == grpc.StatusCode.NOT_FOUND and "no-such-dataset" in error.details(), error.details()


def test_the_accountant_lets_each_party_spend_only_its_own_ledgers(cluster) -> None:
    a_token = (("authorization", f"Bearer {read_token(cluster.charge_token_file)}"),)
    b_token = (("authorization", f"Bearer {read_token(cluster.label_token_file)}"),)
    rule = acc.ChargeRule(kind="train", release_event_json=EVENT, participation_bound=1)
    edge_run = acc.CreateRunRequest(
        run_id="tls-edge", privacy_unit="edge", accounting="visible-batch", accountant="pld",
        epsilon_budget=50.0, delta=1e-5, extractor="pmp-gin", rules=[rule],
    )
    label_run = acc.CreateRunRequest(
        run_id="tls-edge.labels", privacy_unit=LABEL_UNIT, accounting=LABEL_ACCOUNTING, accountant="pld",
        epsilon_budget=50.0, delta=1e-5, extractor="labels-rr",
        rules=[acc.ChargeRule(kind=LABEL_KIND, release_event_json=EVENT)],
    )
    charge = acc.ChargeRequest(
        run_id="tls-edge", release_key="train-0/0", pass_id="train-0", kind="train", num_nodes=3,
        nodes_digest="d", release_event_json=EVENT,
    )

    channels = {role: open_channel(cluster.accountant_address, cluster.role_tls(role)) for role in ROLES}
    stubs = {role: acc_grpc.AccountantStub(channel) for role, channel in channels.items()}
    try:
        # each spending call with the right token but another role's certificate, then the right one
        for call, request, token, right in (
            ("CreateRun", edge_run, a_token, "party-a"), ("Charge", charge, a_token, "party-a"),
            ("CreateRun", label_run, b_token, "party-b"),
        ):
            for role in (r for r in ROLES if r != right):
                error = _refused(getattr(stubs[role], call), request, metadata=token, timeout=30)
                assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (call, role)
                assert f"role {right!r}" in error.details() and f"role {role!r}" in error.details(), error.details()
            getattr(stubs[right], call)(request, metadata=token, timeout=30)
        # refused calls left nothing behind: one edge charge, and anyone of the deployment can read it
        assert stubs["coordinator"].GetRun(acc.GetRunRequest(run_id="tls-edge"), timeout=30).charges == 1
        assert stubs["party-b"].GetRun(acc.GetRunRequest(run_id="tls-edge.labels"), timeout=30).charges == 0
        for request, token, wrong, right in ((edge_run, a_token, "party-b", "party-a"), (label_run, b_token, "party-a", "party-b")):
            close = acc.CloseRunRequest(run_id=request.run_id, status="completed", reason="tls test")  # spending too
            error = _refused(stubs[wrong].CloseRun, close, metadata=token, timeout=30)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
            assert stubs[right].CloseRun(close, metadata=token, timeout=30).status == "completed"
    finally:
        for channel in channels.values():
            channel.close()


def test_the_rest_status_is_public_over_https_only(cluster, tmp_path) -> None:
    url = cluster.status_url
    trust = ssl.create_default_context(cafile=str(cluster.certs_dir / "ca.pem"))
    response = httpx.get(f"{url}/v1/runs", verify=trust, timeout=10)  # no client certificate
    assert response.status_code == 200 and isinstance(response.json(), list)
    with pytest.raises(httpx.HTTPError):
        httpx.get(url.replace("https://", "http://") + "/v1/runs", timeout=10)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):  # not the system's CAs' to vouch for
        httpx.get(f"{url}/v1/runs", timeout=10)
    # reading only: no path of the API takes anything but GET
    methods = {m for path in httpx.get(f"{url}/openapi.json", verify=trust, timeout=10).json()["paths"].values() for m in path}
    assert methods == {"get"}
    code, output = vesper("status", "--url", url, "--ca", str(cluster.certs_dir / "ca.pem"), "--json")
    assert code == 0 and json.loads(output) == response.json()
    code, output = vesper("status", "--url", url)
    assert code == 1 and "CERTIFICATE_VERIFY_FAILED" in output and "--ca" in output, output


def _load_cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _names(cert: x509.Certificate) -> list[str]:
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [*alt.get_values_for_type(x509.DNSName), *map(str, alt.get_values_for_type(x509.IPAddress))]


def test_vesper_certs_writes_a_ca_and_one_certificate_per_role(tmp_path) -> None:
    out = tmp_path / "certs"
    code, output = vesper("certs", "--out", str(out), "--host", "party-b=10.0.0.2", "--host", "party-b=bank.example.org",
                          "--days", "30")
    assert code == 0, output
    ca = _load_cert(out / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for role in ROLES:
        cert = _load_cert(out / f"{role}.pem")
        cert.verify_directly_issued_by(ca)
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == role
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usage)
        assert 29 <= (cert.not_valid_after_utc - cert.not_valid_before_utc).days <= 31
        assert _names(cert) == (["bank.example.org", "10.0.0.2"] if role == "party-b" else ["localhost", "127.0.0.1"])
        assert (out / f"{role}.key").stat().st_mode & 0o777 == 0o600
        assert (out / f"{role}.pem").stat().st_mode & 0o777 == 0o644
    assert (out / "ca.key").stat().st_mode & 0o777 == 0o600
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    # never overwrites without --force, and says which files it kept
    code, output = vesper("certs", "--out", str(out))
    assert code == 2 and "refusing to overwrite" in output and "ca.key" in output and "--force" in output
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before
    # rotating one party's certificate: same CA, the other files untouched
    code, output = vesper("certs", "--out", str(out), "--role", "party-b")
    assert code == 2 and "party-b.pem" in output and "ca.pem" not in output
    code, output = vesper("certs", "--out", str(out), "--role", "party-b", "--force")
    assert code == 0, output
    _load_cert(out / "party-b.pem").verify_directly_issued_by(ca)
    assert (out / "party-b.pem").read_bytes() != before["party-b.pem"]
    assert all((out / name).read_bytes() == data for name, data in before.items() if not name.startswith("party-b"))
    assert (out / "party-b.key").stat().st_mode & 0o777 == 0o600
    # --force replaces everything, with a new CA
    code, output = vesper("certs", "--out", str(out), "--force")
    assert code == 0 and (out / "ca.pem").read_bytes() != before["ca.pem"]
    # clear errors
    for args, fragment in (
        (["--host", "party-x=10.0.0.1"], "unknown role 'party-x'"),
        (["--host", "party-a"], "expected ROLE=NAME"),
        (["--host", "party-a=not a host"], "neither an IP address nor a DNS name"),
        (["--role", "party-a"], "no CA in"),
    ):
        code, output = vesper("certs", "--out", str(tmp_path / "other"), *args)
        assert code == 2 and fragment in output, (args, output)


def test_a_missing_or_non_pem_tls_file_is_named_with_its_setting(tmp_path) -> None:
    make_certificates(tmp_path)
    good = _tls(tmp_path, "party-b")
    load_material(good, "party_b.tls")
    missing = good.model_copy(update={"key_file": tmp_path / "nope.key"})
    with pytest.raises(TlsError, match=r"party_b\.tls\.key_file = .*nope\.key: no such file"):
        load_material(missing, "party_b.tls")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    junk = good.model_copy(update={"cert_file": tmp_path / "junk.pem"})
    with pytest.raises(TlsError, match=r"party_b\.tls\.cert_file = .*junk\.pem: not a PEM certificate"):
        open_channel("127.0.0.1:1", junk, setting="party_b.tls")
    # files that do not fit together: another certificate's key, a certificate of another CA
    other = tmp_path / "other"
    make_certificates(other)
    for mixed, fragment in (
        (good.model_copy(update={"key_file": tmp_path / "party-a.key"}), "party_b.tls.key_file = .* is not the key of"),
        (good.model_copy(update={"ca_file": other / "ca.pem"}), "party_b.tls.cert_file = .* was not signed by the CA"),
    ):
        with pytest.raises(TlsError, match=fragment):
            load_material(mixed, "party_b.tls")
    # a service refuses to start on such a file, before it listens
    config = tmp_path / "party_b.toml"
    write_section(config, "party_b", {"listen": "127.0.0.1:0", "tls": {k: str(v) for k, v in junk.model_dump().items()}})
    code, output = vesper("serve", "party-b", "--config", str(config))
    assert code == 2 and "party_b.tls.cert_file" in output and "junk.pem" in output, output


def test_plaintext_calls_carry_no_role() -> None:
    """Without TLS nothing is checked by role (loopback deployments and the in-process mode)."""
    assert peer_role(object()) is None
    assert role_refusal(None, ("party-a",), "charging") is None
    assert role_refusal("party-a", ("party-a",), "charging") is None
    assert "needs a certificate of role 'party-a'" in role_refusal("party-b", ("party-a",), "charging")
    assert "no role" in role_refusal("", ("party-a",), "charging")
