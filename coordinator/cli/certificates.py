"""`vesper certs`: the deployment's CA and a certificate per role."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError

from vesper.coordinator.cli.shared import (
    console,
    fail,
)


def certs(
    out: Path = typer.Option(..., "--out", metavar="DIR", help="Directory for ca.pem, ca.key and ROLE.pem / ROLE.key of every role."),
    host: Optional[list[str]] = typer.Option(
        None, "--host", metavar="ROLE=NAME",
        help="ROLE=NAME: a DNS name or IP address the ROLE's certificate answers to (repeat for several; a role "
        "named here gets exactly the names given, the others localhost and 127.0.0.1). Roles: accountant, "
        "party-a, party-b, coordinator.",
    ),
    role: Optional[list[str]] = typer.Option(
        None, "--role", metavar="ROLE",
        help="Issue only this role's certificate (repeat for several), signed by the CA already in --out: "
        "rotates one party's certificate without a new CA.",
    ),
    days: int = typer.Option(365, "--days", min=1, max=3650, help="Validity of every certificate issued, in days."),
    force: bool = typer.Option(False, "--force", help="Overwrite existing files."),
) -> None:
    """Make the deployment's CA and a mutual-TLS certificate per role (docs/tls.md)."""
    from vesper.coordinator.certs import (
        RECIPIENTS,
        ROLES,
        CertificateError,
        CertificatePlan,
        make_certificates,
        parse_host_options,
    )

    try:
        unknown = [name for name in role or [] if name not in ROLES]
        if unknown:
            raise CertificateError(f"unknown role {unknown[0]!r}; roles are {', '.join(ROLES)}")
        plan = CertificatePlan(roles=tuple(role or ROLES), hosts=parse_host_options(host or []), days=days)
        issued = make_certificates(out, plan, force=force)
    except (CertificateError, ValidationError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"cannot write certificates to {out}: {exc}")
    if issued.ca_created:
        console.print(f"{out / 'ca.pem'}, {out / 'ca.key'}: the CA; ca.key stays here, ca.pem goes to every party", highlight=False, soft_wrap=True)
    for name in issued.roles:
        cert, key = issued.files_of(name)
        console.print(
            f"{cert}, {key}: role {name}, names {', '.join(issued.names[name])} -> {RECIPIENTS[name]}", highlight=False, soft_wrap=True
        )
    console.print(f"valid until {issued.not_valid_after:%Y-%m-%d %H:%M} UTC; keys are 0600", highlight=False)
