"""Run the accountant: gRPC for charges, uvicorn for the REST status, one ledger file."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from pathlib import Path

import uvicorn

from vesper.accountant.budget import Accountant
from vesper.accountant.ledger_store import LedgerStore, check_ledger_file
from vesper.accountant.rest import create_app
from vesper.accountant.service import AccountantService
from vesper.common.charge_token import ensure_distinct_tokens
from vesper.common.config import AccountantConfig
from vesper.common.grpc_server import start_server, write_ready_file
from vesper.common.metrics import AccountantMetrics, start_metrics
from vesper.common.writable import check_writable_file_dir
from vesper.proto.v1 import accountant_pb2, accountant_pb2_grpc

log = logging.getLogger(__name__)


def _bind(listen: str) -> socket.socket:
    host, port = listen.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # as gRPC does on Linux: a port reserved by a socket of the same user that does not listen
    # (LocalCluster's, so the services start side by side) can be taken over
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host.strip("[]"), int(port)))
    sock.listen(128)
    return sock


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def serve(config: AccountantConfig, ready_file: Path | None = None) -> None:
    # before it serves: a ledger path that is not a ledger, or a directory it cannot write (the ledger's
    # write-ahead log lives beside it), stops it with LedgerFileError / SettingError
    check_ledger_file(config.ledger, "accountant.ledger")
    check_writable_file_dir(config.ledger, "accountant.ledger")
    # refuses to start when the two parties' tokens coincide: either could spend the other's ledger
    token, label_token = ensure_distinct_tokens(config.charge_token_file, config.label_charge_token_file)
    store = LedgerStore(config.ledger)
    accountant = Accountant(store)
    metrics = AccountantMetrics() if config.metrics_listen else None
    metrics_port = start_metrics(metrics, config.metrics_listen)  # a port it cannot have stops it here
    service = AccountantService(accountant, token, label_token, metrics)
    name = accountant_pb2.DESCRIPTOR.services_by_name["Accountant"].full_name
    grpc_server, grpc_port = start_server(
        config.listen, [(accountant_pb2_grpc.add_AccountantServicer_to_server, service, name)], max_message_mb=16,
        tls=config.tls, tls_setting="accountant.tls", metrics=metrics,
    )
    rest_socket = _bind(config.rest_listen)
    rest_host, rest_port = rest_socket.getsockname()[:2]
    # under TLS the status is https with the accountant's certificate, and still public:
    # no client certificate is asked for (reading a budget needs no credential)
    https = {"ssl_certfile": str(config.tls.cert_file), "ssl_keyfile": str(config.tls.key_file)} if config.tls else {}
    scheme = "https" if config.tls else "http"
    # log_config=None: uvicorn's lines go through the process's handler, in its format (--log-format)
    server = uvicorn.Server(uvicorn.Config(
        create_app(accountant), log_level="warning", access_log=False, log_config=None, **https,
    ))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.02)
        if server.started:
            log.info(
                "accountant: gRPC on port %d, REST on %s://%s:%d, ledger %s, party A's charge token %s, "
                "party B's label charge token %s",
                grpc_port, scheme, rest_host, rest_port, config.ledger, config.charge_token_file, config.label_charge_token_file,
            )
            write_ready_file(
                ready_file, grpc_port=grpc_port, rest_port=rest_port, rest_url=f"{scheme}://{rest_host}:{rest_port}",
                metrics_port=metrics_port,
            )

    threading.Thread(target=announce, daemon=True).start()
    # uvicorn re-raises the SIGTERM that stopped it once it has returned; under the default handler that
    # ends the process at once, before the ledger below is closed (and its write-ahead log moved into
    # the file). As SystemExit it unwinds through the finally instead.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        server.run(sockets=[rest_socket])  # returns on SIGINT/SIGTERM
    finally:
        grpc_server.stop(grace=2).wait()
        store.close()
        log.info("accountant stopped; ledger %s closed", config.ledger)
