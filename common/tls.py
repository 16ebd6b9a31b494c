"""Mutual TLS for every vesper connection, and the role each certificate carries.

A deployment's certificates come from ``vesper certs`` (coordinator/certs.py): one CA and,
per role, a certificate whose common name is the role. With ``tls`` set in a service's
config, its gRPC server accepts only clients with a certificate from that CA, and its
clients present their own and accept only servers whose certificate, from that CA,
names the address they dialled. On top of the charge tokens, the services check the
caller's role (:data:`SERVICE_CALLERS` here, the accountant per ledger in its service).

Without ``tls`` everything is plaintext and no role is checked: loopback only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from vesper.common.config import TlsConfig

# Which roles may call each gRPC service (full name) of a server running with TLS. Services
# not listed (health, reflection, the accountant's, whose spending calls are checked per
# ledger in accountant/service.py) accept any certificate of the deployment's CA.
SERVICE_CALLERS: dict[str, tuple[str, ...]] = {
    "vesper.v1.GraphParty": ("coordinator", "party-a"),
    "vesper.v1.LabelParty": ("party-a",),
    "vesper.v1.LabelOwner": ("coordinator",),
}


# the role each service's certificate carries as its common name (coordinator.certs issues them)
KNOWN_ROLES = ("accountant", "party-a", "party-b", "coordinator")


class TlsError(ValueError):
    """A configured TLS file is missing, unreadable or not PEM; the message names it and its setting."""


@dataclass(frozen=True)
class TlsMaterial:
    """The three PEM files of one service's TLS settings, read and checked."""

    ca: bytes
    cert: bytes
    key: bytes


def _read_pem(path: Path, setting: str, markers: Sequence[str], what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise TlsError(f"{setting} = {path}: no such file ({what} expected; `vesper certs` makes it)") from None
    except OSError as exc:
        raise TlsError(f"{setting} = {path}: cannot read it: {exc.strerror or exc}") from None
    text = data.decode("ascii", errors="replace")
    if not any(f"-----BEGIN {marker}-----" in text for marker in markers):
        raise TlsError(f"{setting} = {path}: not a PEM {what} (no '-----BEGIN {markers[0]}-----' block)")
    return data


def load_material(tls: TlsConfig, setting: str = "tls") -> TlsMaterial:
    """Read ``tls``'s files and check they fit together; ``setting`` is where they are
    configured (e.g. ``party_a.tls``), for errors.

    Mixed-up files (a key of another certificate, a certificate of another CA) are caught
    here, at start, rather than as a failed handshake at a peer.
    """
    material = TlsMaterial(
        ca=_read_pem(tls.ca_file, f"{setting}.ca_file", ("CERTIFICATE",), "CA certificate"),
        cert=_read_pem(tls.cert_file, f"{setting}.cert_file", ("CERTIFICATE",), "certificate"),
        key=_read_pem(
            tls.key_file, f"{setting}.key_file", ("PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"), "private key"
        ),
    )
    _check_consistent(material, tls, setting)
    return material


def _check_consistent(material: TlsMaterial, tls: TlsConfig, setting: str) -> None:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    certificates = {}
    for name, data, path in (("ca_file", material.ca, tls.ca_file), ("cert_file", material.cert, tls.cert_file)):
        try:
            certificates[name] = x509.load_pem_x509_certificate(data)
        except ValueError as exc:
            raise TlsError(f"{setting}.{name} = {path}: not a readable PEM certificate ({exc})") from None
    try:
        key = serialization.load_pem_private_key(material.key, password=None)
    except TypeError:
        raise TlsError(f"{setting}.key_file = {tls.key_file}: the key is encrypted; vesper needs it unencrypted (0600)") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise TlsError(f"{setting}.key_file = {tls.key_file}: not a readable PEM private key ({exc})") from None
    if key.public_key() != certificates["cert_file"].public_key():
        raise TlsError(f"{setting}.key_file = {tls.key_file} is not the key of {setting}.cert_file = {tls.cert_file}")
    _check_own_certificate(certificates["cert_file"], tls, setting)
    try:
        certificates["cert_file"].verify_directly_issued_by(certificates["ca_file"])
    except (ValueError, TypeError, InvalidSignature):
        raise TlsError(
            f"{setting}.cert_file = {tls.cert_file} was not signed by the CA of {setting}.ca_file = {tls.ca_file} "
            "(files from two runs of `vesper certs`?)"
        ) from None


def _check_own_certificate(certificate: object, tls: TlsConfig, setting: str) -> None:
    """``cert_file`` is a service's own certificate: not the CA's, and of the role its section says
    (``party_b.tls`` holds a ``party-b`` certificate), so a mix-up stops the service at start."""
    from cryptography import x509

    try:
        constraints = certificate.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is not None and constraints.ca:
        raise TlsError(
            f"{setting}.cert_file = {tls.cert_file} is a CA certificate, not a service's own: give this service's "
            "certificate (`vesper certs` makes one per role, e.g. party-a.pem), and the CA's as ca_file"
        )
    section = setting.split(".")[0]
    expected = section.replace("_", "-")
    names = certificate.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    role = str(names[0].value) if names else ""
    if expected in KNOWN_ROLES and role != expected:
        raise TlsError(
            f"{setting}.cert_file = {tls.cert_file} is a certificate of role {role or '(none)'!r}, but {section} needs "
            f"its own, of role {expected!r}: `vesper certs --role {expected}` makes it"
        )


def server_credentials(tls: TlsConfig, setting: str = "tls") -> grpc.ServerCredentials:
    """Server side of mutual TLS: a client without a certificate from the CA is refused in the handshake."""
    material = load_material(tls, setting)
    return grpc.ssl_server_credentials(
        [(material.key, material.cert)], root_certificates=material.ca, require_client_auth=True
    )


def channel_credentials(tls: TlsConfig, setting: str = "tls") -> grpc.ChannelCredentials:
    """Client side: trust only the deployment's CA, and present our own certificate."""
    material = load_material(tls, setting)
    return grpc.ssl_channel_credentials(
        root_certificates=material.ca, private_key=material.key, certificate_chain=material.cert
    )


def open_channel(
    address: str, tls: TlsConfig | None, options: Sequence[tuple[str, Any]] | None = None, setting: str = "tls"
) -> grpc.Channel:
    """The one way vesper dials a peer: mutual TLS when ``tls`` is set, plaintext otherwise.

    Under TLS the server's certificate must name ``address``'s host (a DNS name or IP
    address in its subjectAltNames, ``vesper certs --host``).
    """
    if tls is None:
        return grpc.insecure_channel(address, options=list(options or ()))
    return grpc.secure_channel(address, channel_credentials(tls, setting), options=list(options or ()))


def peer_role(context: object) -> str | None:
    """The caller's role: its certificate's common name under TLS, None on a plaintext call.

    A TLS peer whose certificate has no common name gets ``""``, which no check accepts.
    Contexts without an auth context (the in-process transport) count as plaintext.
    """
    auth_context = getattr(context, "auth_context", None)
    if auth_context is None:
        return None
    properties = auth_context()
    if b"ssl" not in properties.get("transport_security_type", []):
        return None
    names = properties.get("x509_common_name", [])
    return names[0].decode("utf-8", errors="replace") if names else ""


def role_refusal(role: str | None, allowed: Collection[str], what: str) -> str | None:
    """Why ``role`` may not do ``what`` (None when it may, or on a plaintext call)."""
    if role is None or role in allowed:
        return None
    seen = f"role {role!r}" if role else "a certificate without a common name (no role)"
    return f"{what} needs a certificate of role {' or '.join(repr(r) for r in allowed)}; the caller presented {seen}"


def require_role(context: grpc.ServicerContext, allowed: Collection[str], what: str) -> None:
    """Abort with PERMISSION_DENIED unless the TLS caller's role is one of ``allowed``."""
    refusal = role_refusal(peer_role(context), allowed, what)
    if refusal is not None:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)


def _gated(behaviour: Callable, allowed: tuple[str, ...], method: str) -> Callable:
    def gated(request_or_iterator: object, context: grpc.ServicerContext) -> object:
        require_role(context, allowed, f"calling {method}")
        return behaviour(request_or_iterator, context)

    return gated


class RoleGate(grpc.ServerInterceptor):
    """Refuses calls to a listed service from a certificate of another role (PERMISSION_DENIED)."""

    KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")

    def __init__(self, callers: Mapping[str, tuple[str, ...]]) -> None:
        self._callers = dict(callers)

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        method = handler_call_details.method  # "/vesper.v1.LabelParty/Train"
        allowed = self._callers.get(method.lstrip("/").split("/", 1)[0])
        if handler is None or allowed is None:
            return handler
        replaced = {
            kind: _gated(getattr(handler, kind), allowed, method)
            for kind in self.KINDS if getattr(handler, kind) is not None
        }
        return handler._replace(**replaced)
