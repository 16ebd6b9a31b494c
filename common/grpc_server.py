"""How every vesper service runs a gRPC server: health, reflection, limits, clean stop."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from vesper.common.config import TlsConfig
from vesper.common.grpc_observer import CallObserver
from vesper.common.metrics import ServiceMetrics
from vesper.common.tls import SERVICE_CALLERS, RoleGate, server_credentials

log = logging.getLogger(__name__)

Registration = tuple[Callable[[object, grpc.Server], None], object, str]


def channel_options(max_message_mb: int) -> list[tuple[str, int]]:
    size = max_message_mb * 1024 * 1024
    return [
        ("grpc.max_send_message_length", size),
        ("grpc.max_receive_message_length", size),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # a restarted peer is found within 2 s, not gRPC's default of up to 2 minutes
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]


def start_server(
    listen: str, services: list[Registration], max_message_mb: int, tls: TlsConfig | None = None,
    tls_setting: str = "tls", metrics: ServiceMetrics | None = None,
) -> tuple[grpc.Server, int]:
    """Start a server with the given (add_to_server, servicer, full service name) triples.

    With ``tls`` (configured at ``tls_setting``, named in errors) it listens with mutual TLS
    and admits each service's callers by role (common/tls.py); without, plaintext. Every call is
    observed (common/grpc_observer.py): its status and bytes counted into ``metrics`` when given,
    and the run its request names put on the lines it logs.
    Returns the server and the bound port (useful with port 0).
    """
    # clients ping every 30 s even on a silent stream (a long one-shot release); the default
    # server policy calls that "too many pings" and drops the stream with GOAWAY
    options = channel_options(max_message_mb) + [
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 0),
    ]
    # the files are read before anything listens: a bad one stops the service at start
    credentials = server_credentials(tls, tls_setting) if tls is not None else None
    # the observer first: it is the outermost wrapper, so it also counts the role gate's refusals
    interceptors: list[grpc.ServerInterceptor] = [CallObserver(metrics)]
    if tls is not None:
        interceptors.append(RoleGate(SERVICE_CALLERS))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=options, interceptors=interceptors)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = []
    for add, servicer, name in services:
        add(servicer, server)
        names.append(name)
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection((*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = server.add_secure_port(listen, credentials) if credentials is not None else server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    server.start()
    return server, port


def write_ready_file(path: Path | None, **ports: int | str | None) -> None:
    """Tell whoever started us where we listen (written atomically once serving); None values are left out."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **{key: value for key, value in ports.items() if value is not None}}))
    tmp.replace(path)


def wait_for_signal(stop: Callable[[], None]) -> None:
    """Block until SIGINT or SIGTERM, then run ``stop``."""
    done = threading.Event()

    def handle(signum: int, _frame: object) -> None:
        log.info("received signal %s, stopping", signum)
        done.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    done.wait()
    stop()
