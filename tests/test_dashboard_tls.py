"""The budget dashboard under TLS: served over https with the accountant's certificate, on the
REST status's port, to anyone (no client certificate), and not over plain http."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from vesper.common.config import TlsConfig
from vesper.coordinator.certs import make_certificates
from vesper.coordinator.processes import start_service, write_section

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def accountant(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """The accountant alone, as a process, with the deployment's certificates: (REST URL, CA file)."""
    workdir = tmp_path_factory.mktemp("dashboard-tls")
    make_certificates(workdir / "certs")
    tls = {name: str(workdir / "certs" / f"accountant.{ext}") for name, ext in (("cert_file", "pem"), ("key_file", "key"))}
    tls["ca_file"] = str(workdir / "certs" / "ca.pem")
    write_section(workdir / "accountant.toml", "accountant", {
        "listen": "127.0.0.1:0", "rest_listen": "127.0.0.1:0", "ledger": str(workdir / "ledger.sqlite"),
        "charge_token_file": str(workdir / "charge.token"), "label_charge_token_file": str(workdir / "label.token"),
        "tls": tls,
    })
    probe = TlsConfig(ca_file=workdir / "certs" / "ca.pem", cert_file=workdir / "certs" / "coordinator.pem",
                      key_file=workdir / "certs" / "coordinator.key")
    service = start_service("accountant", workdir / "accountant.toml", workdir, tls=probe)
    service.wait_ready()
    try:
        yield service.info["rest_url"], workdir / "certs" / "ca.pem"
    finally:
        service.stop()


def test_the_dashboard_is_public_over_https_only(accountant: tuple[str, Path]) -> None:
    url, ca = accountant
    assert url.startswith("https://")
    trust = ssl.create_default_context(cafile=str(ca))
    response = httpx.get(f"{url}/", verify=trust, timeout=10)  # no client certificate
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    assert "privacy budgets" in response.text
    missing = httpx.get(f"{url}/runs/no-such-run", verify=trust, timeout=10)
    assert missing.status_code == 404 and "No such run" in missing.text
    with pytest.raises(httpx.HTTPError):
        httpx.get(url.replace("https://", "http://") + "/", timeout=10)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{url}/", timeout=10)
