"""``vesper health``: is a service serving? For container health checks and operators.

It asks the standard gRPC health service (``grpc.health.v1.Health``, which every vesper
server offers) on the address the service's own config says it listens on, with the
service's own certificate when the config turns on mutual TLS. Docker reads the exit
code: 0 healthy, 1 unhealthy (2 is reserved by Docker, so every failure is 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import BaseModel

from vesper.common.config import TlsConfig, VesperConfig, load_config
from vesper.common.tls import TlsError, load_material, open_channel

ServiceName = Literal["party-a", "party-b", "accountant"]

# a wildcard listen address is not an address to connect to: ask the same port on loopback
_WILDCARD_TO_LOOPBACK = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]", "": "127.0.0.1"}


class HealthReport(BaseModel):
    """One answer of ``vesper health``: serving or not, and why not in one line."""

    service: str
    address: str
    serving: bool
    reason: str = ""

    def line(self) -> str:
        if self.serving:
            return f"{self.service} at {self.address}: SERVING"
        return f"{self.service} at {self.address}: not serving: {self.reason}"


class HealthCheckError(ValueError):
    """The config does not say where the service listens (no section, port 0, unreadable TLS files)."""


def connect_address(listen: str) -> str:
    """Where to reach a server that listens on ``listen`` from the same host."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise HealthCheckError(f"listen address {listen!r} is not host:port")
    if int(port) == 0:
        raise HealthCheckError(
            f"listen address {listen!r} has port 0 (any free port): there is no fixed port to check; set one"
        )
    return f"{_WILDCARD_TO_LOOPBACK.get(host, host)}:{port}"


def service_endpoint(config: VesperConfig, service: ServiceName) -> tuple[str, TlsConfig | None]:
    """The address to ask and the TLS settings of ``service``'s section of ``config``."""
    section = service.replace("-", "_")
    settings = getattr(config, section)
    if settings is None:
        raise HealthCheckError(f"the config has no [{section}] section")
    return connect_address(settings.listen), settings.tls


def _server_name(certificate_pem: bytes) -> str | None:
    """A name of the service's own certificate: the server presents that certificate, and we
    dial it over loopback, which its subjectAltNames need not include."""
    from cryptography import x509  # only with TLS: keeps plaintext checks light

    certificate = x509.load_pem_x509_certificate(certificate_pem)
    try:
        alt_names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [*alt_names.get_values_for_type(x509.DNSName), *map(str, alt_names.get_values_for_type(x509.IPAddress))]
    except x509.ExtensionNotFound:
        names = []
    if names:
        return names[0]
    common = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return str(common[0].value) if common else None


def open_health_channel(address: str, tls: TlsConfig | None, setting: str = "tls") -> grpc.Channel:
    """A channel to ``address``: plaintext, or mutual TLS with the service's own certificate."""
    if tls is None:
        return open_channel(address, None)
    material = load_material(tls, setting)  # TlsError names the setting and the file
    try:
        name = _server_name(material.cert)
    except ValueError as exc:
        raise HealthCheckError(f"{setting}.cert_file = {tls.cert_file}: not a PEM certificate: {exc}") from None
    options = [("grpc.ssl_target_name_override", name)] if name else []
    return open_channel(address, tls, options=options, setting=setting)


def check_address(
    service: str, address: str, tls: TlsConfig | None = None, timeout_s: float = 3.0, tls_setting: str = "tls"
) -> HealthReport:
    """Ask the gRPC health service at ``address`` whether the server as a whole is serving."""
    try:
        channel = open_health_channel(address, tls, tls_setting)
    except (HealthCheckError, TlsError) as exc:
        return HealthReport(service=service, address=address, serving=False, reason=str(exc))
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            return HealthReport(service=service, address=address, serving=False, reason=_rpc_reason(exc, timeout_s))
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    serving = reply.status == health_pb2.HealthCheckResponse.SERVING
    return HealthReport(service=service, address=address, serving=serving, reason="" if serving else f"status {status}")


def _rpc_reason(exc: grpc.RpcError, timeout_s: float) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout_s:g} s"
    first_line = details.strip().splitlines()[0] if details.strip() else ""
    name = code.name if code is not None else "error"
    return f"{name}: {first_line}" if first_line else name


def check_service(config_path: Path | None, service: ServiceName, timeout_s: float = 3.0) -> HealthReport:
    """Read ``service``'s section of ``config_path`` (defaults when None) and ask it."""
    try:
        # no file: the section's defaults, as ``vesper serve`` uses them
        config = load_config(config_path) if config_path is not None else VesperConfig.model_validate(
            {service.replace("-", "_"): {}}
        )
        address, tls = service_endpoint(config, service)
    except ValueError as exc:  # HealthCheckError and pydantic's ValidationError included
        where = f"{config_path}: " if config_path is not None else ""
        reason = f"{where}{exc}".replace("\n", "; ")
        return HealthReport(service=service, address="-", serving=False, reason=reason)
    return check_address(service, address, tls, timeout_s, f"{service.replace('-', '_')}.tls")
