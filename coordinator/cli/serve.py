"""`vesper serve` and `vesper health`: run a service, ask a service whether it serves."""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import NoReturn, Optional

import typer

from vesper.common.config import (
    AccountantConfig,
    PartyAConfig,
    PartyBConfig,
)
from vesper.coordinator.cli.shared import (
    Service,
    console,
    errors,
    fail,
    load_settings,
)

# set once the service ``vesper serve`` ran has stopped and closed what it writes (ledger, receipt
# log, checkpoints): vesper's entry point (cli.main) then ends the process at once
service_stopped = threading.Event()


def end_without_teardown() -> NoReturn:
    """End a stopped service's process without the interpreter's teardown: with torch loaded
    that takes about a second, and every restart of a service waits for it. Only the logs and
    standard streams are left to flush; the service closed its files when it stopped."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def serve(
    service: Service = typer.Argument(..., help="Which service to run."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file with the service's section."),
    listen: Optional[str] = typer.Option(None, "--listen", help="Override the gRPC listen address host:port."),
    ready_file: Optional[Path] = typer.Option(None, "--ready-file", help="Write the bound ports (and torch threads) here as JSON once serving."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    log_format: str = typer.Option(
        "text", "--log-format",
        help="text, or json: one JSON object per line on stderr (ts, level, logger, message, run_id).",
    ),
    workers: Optional[int] = typer.Option(
        None, "--workers", min=1,
        help="party A only: W processes share each release's roots (party_a.workers; the same releases and ledger "
        "as 1). The per-step extractors (mlp, pmp-gin, pmp-gcn) and GAP's hops (gap, relational-gap).",
    ),
) -> None:
    """Run party A, party B or the accountant until SIGINT/SIGTERM."""
    from vesper.common.log_format import LogSettingError, configure_logging

    try:
        configure_logging(log_level, log_format)
    except LogSettingError as exc:
        fail(str(exc))
    cfg = load_settings(config)
    section = service.value.replace("-", "_")
    settings = getattr(cfg, section)
    if settings is None:
        if config is not None:
            fail(f"{config} has no [{section}] section")
        settings = {"party_a": PartyAConfig, "party_b": PartyBConfig, "accountant": AccountantConfig}[section]()
    if listen:
        settings = settings.model_copy(update={"listen": listen})
    if workers is not None:
        if service is not Service.party_a:
            fail(f"--workers is party A's setting (party_a.workers), not {service.value}'s")
        settings = settings.model_validate({**settings.model_dump(exclude_unset=True), "workers": workers})
    if settings.tls is not None:  # a missing or broken TLS file stops the service before it listens
        from vesper.common.tls import TlsError, load_material

        try:
            load_material(settings.tls, f"{section}.tls")
        except TlsError as exc:
            fail(str(exc))
    from vesper.accountant.ledger_store import LedgerFileError
    from vesper.common.writable import SettingError

    try:  # a setting the service cannot run with (an unwritable workdir, a ledger that is not one) stops it here
        if service is Service.party_a:
            from vesper.party_a.service import serve as serve_party_a

            serve_party_a(settings, ready_file)
        elif service is Service.party_b:
            from vesper.party_b.service import serve as serve_party_b

            serve_party_b(settings, ready_file)
        else:
            from vesper.accountant.server import serve as serve_accountant

            serve_accountant(settings, ready_file)
    except SystemExit as exc:  # the accountant's SIGTERM unwinds as SystemExit(0), its ledger closed
        if exc.code in (0, None):
            service_stopped.set()
        raise
    except (SettingError, LedgerFileError) as exc:
        fail(str(exc))
    service_stopped.set()


def health(
    service: Service = typer.Argument(..., help="Which service to ask."),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="TOML file with the service's section (its listen address and TLS)."),
    timeout: float = typer.Option(3.0, "--timeout", min=0.1, help="Seconds to wait for the answer."),
) -> None:
    """Ask a service's gRPC health check: exit 0 when it is serving, 1 otherwise (container health checks)."""
    from vesper.coordinator.health_check import check_service

    report = check_service(config, service.value, timeout)
    if report.serving:
        console.print(report.line(), highlight=False, markup=False)
        return
    errors.print(report.line(), highlight=False, markup=False, soft_wrap=True)
    raise typer.Exit(1)
