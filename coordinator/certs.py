"""``vesper certs``: a deployment's certificate authority and one certificate per role.

Every gRPC connection between the services is mutual TLS: each side shows a certificate
signed by the deployment's CA, and the certificate's common name is the caller's role
(``accountant``, ``party-a``, ``party-b``, ``coordinator``), which the services check
(docs/tls.md). Whoever runs this command holds the CA key; each institution gets its
own key and the CA certificate, never another party's key.

Keys are ECDSA P-256 (fast to make, supported by gRPC and uvicorn); private keys are
written 0600. Existing files are never overwritten without ``force``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

Role = Literal["accountant", "party-a", "party-b", "coordinator"]
ROLES: tuple[Role, ...] = ("accountant", "party-a", "party-b", "coordinator")
DEFAULT_HOSTS = ("localhost", "127.0.0.1")
CA_CERT, CA_KEY = "ca.pem", "ca.key"
# a little slack for clocks that differ between the institutions' hosts
BACKDATE = dt.timedelta(hours=1)
_DNS_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


class CertificateError(ValueError):
    """The certificates cannot be made as asked; the message says why."""


def _check_host(name: str) -> str:
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        pass
    labels = name.rstrip(".").split(".")
    if not name or len(name) > 253 or not all(_DNS_LABEL.match(label) for label in labels):
        raise CertificateError(f"{name!r} is neither an IP address nor a DNS name")
    return name


class CertificatePlan(BaseModel):
    """What to issue: which roles, the names each answers to, how long they stay valid."""

    model_config = ConfigDict(extra="forbid")

    roles: tuple[Role, ...] = ROLES
    hosts: dict[Role, list[str]] = Field(
        default_factory=dict, description="subjectAltNames per role; a role absent here gets localhost and 127.0.0.1"
    )
    days: int = Field(365, ge=1, le=3650, description="validity of every certificate issued, in days")

    @field_validator("hosts")
    @classmethod
    def _names(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for names in value.values():
            for name in names:
                _check_host(name)
        return value

    def names_of(self, role: Role) -> list[str]:
        return self.hosts.get(role) or list(DEFAULT_HOSTS)


def parse_host_options(options: list[str]) -> dict[str, list[str]]:
    """``["party-a=bank.example.org", "party-b=10.0.0.2"]`` -> names per role, in order given."""
    hosts: dict[str, list[str]] = {}
    for option in options:
        role, sep, name = option.partition("=")
        role, name = role.strip(), name.strip()
        if not sep or not name:
            raise CertificateError(f"--host {option!r}: expected ROLE=NAME, e.g. party-b=10.0.0.2")
        if role not in ROLES:
            raise CertificateError(f"--host {option!r}: unknown role {role!r}; roles are {', '.join(ROLES)}")
        hosts.setdefault(role, [])
        if name not in hosts[role]:
            hosts[role].append(_check_host(name))
    return hosts


class IssuedFiles(BaseModel):
    """What :func:`make_certificates` wrote."""

    directory: Path
    ca_created: bool
    roles: list[Role]
    names: dict[Role, list[str]]
    not_valid_after: dt.datetime

    def files_of(self, role: Role) -> tuple[Path, Path]:
        return self.directory / f"{role}.pem", self.directory / f"{role}.key"


def _new_key() -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vesper deployment"),
        x509.NameAttribute(NameOID.COMMON_NAME, common_name),
    ])


def _make_ca(days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    key = _new_key()
    now = dt.datetime.now(dt.timezone.utc)
    subject = _name("vesper deployment CA")
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE).not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_leaf(
    role: Role, names: list[str], days: int, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _new_key()
    now = dt.datetime.now(dt.timezone.utc)
    alt_names: list[x509.GeneralName] = []
    for name in names:
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    not_after = min(now + dt.timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(role)).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=True, key_cert_sign=False, crl_sign=False,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        # every service is a server to some peers and a client of others
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False  # type: ignore[arg-type]
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write atomically with ``mode`` from the first byte (a key is never world-readable)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)  # the umask may have narrowed it; never widened beyond mode
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    for path in (cert_path, key_path):
        if not path.is_file():
            raise CertificateError(
                f"no CA in {directory}: {path.name} is missing (run `vesper certs --out {directory}` without --role first)"
            )
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError as exc:
        raise CertificateError(f"{cert_path} is not a PEM certificate: {exc}") from None
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"{key_path} is not an unencrypted PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise CertificateError(f"{key_path} is not the key of {cert_path}")
    return cert, key


def make_certificates(directory: Path, plan: CertificatePlan | None = None, *, force: bool = False) -> IssuedFiles:
    """Issue ``plan.roles`` into ``directory``.

    With every role (the default) a new CA is made too; with fewer, they are signed by the CA
    already in ``directory`` (rotating one party's certificate leaves the others valid).
    Refuses to overwrite any existing file unless ``force``.
    """
    plan = plan or CertificatePlan()
    roles = list(dict.fromkeys(plan.roles))
    if not roles:
        raise CertificateError("no role to issue")
    for role in plan.hosts:
        if role not in roles:
            raise CertificateError(f"--host names role {role!r}, which is not being issued (issuing {', '.join(roles)})")
    new_ca = set(roles) == set(ROLES)
    targets = [directory / f"{role}.{ext}" for role in roles for ext in ("pem", "key")]
    if new_ca:
        targets = [directory / CA_CERT, directory / CA_KEY, *targets]
    existing = [str(path) for path in targets if path.exists()]
    if existing and not force:
        raise CertificateError(f"refusing to overwrite {', '.join(existing)} (use --force to replace them)")
    if directory.exists() and not directory.is_dir():
        raise CertificateError(f"{directory} exists and is not a directory")
    if new_ca:
        ca_cert, ca_key = _make_ca(plan.days)
    else:
        ca_cert, ca_key = _load_ca(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if new_ca:
        _write(directory / CA_KEY, _key_pem(ca_key), 0o600)
        _write(directory / CA_CERT, _cert_pem(ca_cert), 0o644)
    names: dict[Role, list[str]] = {}
    not_after = ca_cert.not_valid_after_utc
    for role in roles:
        names[role] = plan.names_of(role)
        cert, key = _make_leaf(role, names[role], plan.days, ca_cert, ca_key)
        _write(directory / f"{role}.key", _key_pem(key), 0o600)
        _write(directory / f"{role}.pem", _cert_pem(cert), 0o644)
        not_after = min(not_after, cert.not_valid_after_utc)
    return IssuedFiles(directory=directory, ca_created=new_ca, roles=roles, names=names, not_valid_after=not_after)


# who receives which files (docs/tls.md): the CA key never leaves whoever ran `vesper certs`
RECIPIENTS: dict[Role, str] = {
    "accountant": "the accountant's host",
    "party-a": "party A (the graph holder)",
    "party-b": "party B (the label holder)",
    "coordinator": "whoever drives runs (usually party A)",
}
