"""Run the accountant: gRPC for charges, uvicorn for the REST status, one ledger file."""

from __future__ import annotations

import logging
import socket
import threading
import time
from pathlib import Path

import uvicorn

from vesper.accountant.budget import Accountant
from vesper.accountant.ledger_store import LedgerStore
from vesper.accountant.rest import create_app
from vesper.accountant.service import AccountantService
from vesper.common.charge_token import ensure_distinct_tokens
from vesper.common.config import AccountantConfig
from vesper.common.grpc_server import start_server, write_ready_file
from vesper.proto.v1 import accountant_pb2, accountant_pb2_grpc

log = logging.getLogger(__name__)


def _bind(listen: str) -> socket.socket:
    host, port = listen.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), int(port)))
    sock.listen(128)
    return sock


def serve(config: AccountantConfig, ready_file: Path | None = None) -> None:
    # refuses to start when the two parties' tokens coincide: either could spend the other's ledger
    token, label_token = ensure_distinct_tokens(config.charge_token_file, config.label_charge_token_file)
    store = LedgerStore(config.ledger)
    accountant = Accountant(store)
    service = AccountantService(accountant, token, label_token)
    name = accountant_pb2.DESCRIPTOR.services_by_name["Accountant"].full_name
    grpc_server, grpc_port = start_server(
        config.listen, [(accountant_pb2_grpc.add_AccountantServicer_to_server, service, name)], max_message_mb=16,
        tls=config.tls, tls_setting="accountant.tls",
    )
    rest_socket = _bind(config.rest_listen)
    rest_host, rest_port = rest_socket.getsockname()[:2]
    # under TLS the status is https with the accountant's certificate, and still public:
    # no client certificate is asked for (reading a budget needs no credential)
    https = {"ssl_certfile": str(config.tls.cert_file), "ssl_keyfile": str(config.tls.key_file)} if config.tls else {}
    scheme = "https" if config.tls else "http"
    server = uvicorn.Server(uvicorn.Config(create_app(accountant), log_level="warning", access_log=False, **https))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.02)
        if server.started:
            log.info(
                "accountant: gRPC on port %d, REST on %s://%s:%d, ledger %s, party A's charge token %s, "
                "party B's label charge token %s",
                grpc_port, scheme, rest_host, rest_port, config.ledger, config.charge_token_file, config.label_charge_token_file,
            )
            write_ready_file(ready_file, grpc_port=grpc_port, rest_port=rest_port, rest_url=f"{scheme}://{rest_host}:{rest_port}")

    threading.Thread(target=announce, daemon=True).start()
    try:
        server.run(sockets=[rest_socket])  # returns on SIGINT/SIGTERM
    finally:
        grpc_server.stop(grace=2).wait()
        store.close()
