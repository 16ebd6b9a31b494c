"""JSON log lines and the run id on them (common/log_format.py), and the gRPC observer that
names a call's run and counts its status and bytes (common/grpc_observer.py). The services'
own JSON logs during a real run are checked in tests/test_metrics.py, on its cluster."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from e2e import vesper

from vesper.common.grpc_observer import CallObserver
from vesper.common.log_format import (
    RUN_ID,
    JsonLineFormatter,
    LogSettingError,
    RunIdFilter,
    configure_logging,
    name_run,
    running,
)
from vesper.common.metrics import ServiceMetrics
from vesper.proto.v1 import accountant_pb2 as pb


def _record(message: str, *args: object, exc_info: object = None) -> logging.LogRecord:
    record = logging.LogRecord("vesper.test", logging.WARNING, __file__, 1, message, args, exc_info)
    RunIdFilter().filter(record)
    return record


def test_a_json_line_has_the_fields_and_the_run_it_was_logged_for() -> None:
    with running("run-7"):
        line = JsonLineFormatter().format(_record("charged %d releases\nof run %s", 3, "run-7"))
    assert "\n" not in line  # a message with a newline is still one line
    entry = json.loads(line)
    assert entry["run_id"] == "run-7" and entry["message"] == "charged 3 releases\nof run run-7"
    assert entry["level"] == "warning" and entry["logger"] == "vesper.test"
    assert entry["ts"].endswith("+00:00") and "T" in entry["ts"]


def test_a_line_outside_any_run_carries_null_and_a_traceback_is_kept() -> None:
    assert RUN_ID.get() is None
    try:
        raise ValueError("boom")
    except ValueError:
        entry = json.loads(JsonLineFormatter().format(_record("failed", exc_info=sys.exc_info())))
    assert entry["run_id"] is None and "ValueError: boom" in entry["exc_info"]


def test_running_restores_the_run_before_and_threads_do_not_inherit_it() -> None:
    seen: list[str | None] = []
    with running("outer"):
        with running("inner"):
            assert RUN_ID.get() == "inner"
            thread = threading.Thread(target=lambda: seen.append(RUN_ID.get()))
            thread.start()
            thread.join()
        assert RUN_ID.get() == "outer"
    assert RUN_ID.get() is None and seen == [None]


def test_bad_log_settings_are_refused_by_name() -> None:
    with pytest.raises(LogSettingError, match="--log-format must be one of text, json, got 'yaml'"):
        configure_logging("info", "yaml")
    with pytest.raises(LogSettingError, match="--log-level must be one of"):
        configure_logging("verbose", "json")
    code, output = vesper("serve", "accountant", "--log-format", "yaml")
    assert code == 2 and "--log-format must be one of text, json" in output, output


def test_configure_logging_writes_json_lines_to_stderr() -> None:
    program = (
        "import logging, warnings\n"
        "from vesper.common.log_format import configure_logging, running\n"
        "configure_logging('info', 'json')\n"
        "logging.getLogger('a').info('before')\n"
        "with running('r1'):\n"
        "    logging.getLogger('b').warning('during %s', 'r1')\n"
        "    warnings.warn('careful')\n"
        "logging.getLogger('a').debug('not shown at info')\n"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(e["message"], e["run_id"]) for e in entries[:2]] == [("before", None), ("during r1", "r1")]
    assert len(entries) == 3 and "careful" in entries[2]["message"] and entries[2]["run_id"] == "r1"


# -- the gRPC observer -------------------------------------------------------------------------------
METHOD = "/vesper.v1.Test/Echo"
STREAM = "/vesper.v1.Test/Collect"


def _echo(request: pb.GetRunRequest, context: grpc.ServicerContext) -> pb.GetRunRequest:
    """Answers with the run its log lines would carry; fails as asked."""
    if request.run_id == "refuse":
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "refused")
    if request.run_id == "crash":
        raise RuntimeError("a bug")
    return pb.GetRunRequest(run_id=RUN_ID.get() or "none")


def _collect(requests: Iterator[pb.GetRunRequest], context: grpc.ServicerContext) -> pb.GetRunRequest:
    seen = [RUN_ID.get() or "none" for _ in requests]
    return pb.GetRunRequest(run_id=",".join(seen))


@pytest.fixture
def observed() -> Iterator[tuple[grpc.Channel, ServiceMetrics]]:
    """A one-thread server (so consecutive calls share a thread) behind the observer."""
    metrics = ServiceMetrics("test")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), interceptors=[CallObserver(metrics)])
    handlers = {
        "Echo": grpc.unary_unary_rpc_method_handler(
            _echo, pb.GetRunRequest.FromString, pb.GetRunRequest.SerializeToString
        ),
        "Collect": grpc.stream_unary_rpc_method_handler(
            _collect, pb.GetRunRequest.FromString, pb.GetRunRequest.SerializeToString
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("vesper.v1.Test", handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel, metrics
    server.stop(grace=None)


def _call(channel: grpc.Channel, run_id: str) -> str:
    echo = channel.unary_unary(METHOD, pb.GetRunRequest.SerializeToString, pb.GetRunRequest.FromString)
    return echo(pb.GetRunRequest(run_id=run_id), timeout=10).run_id


def _value(metrics: ServiceMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_call_names_its_requests_run_and_the_next_call_starts_with_none(observed) -> None:
    channel, _ = observed
    assert _call(channel, "run-1") == "run-1"
    assert _call(channel, "") == "none"  # same server thread: the previous call's run is not carried over
    collect = channel.stream_unary(STREAM, pb.GetRunRequest.SerializeToString, pb.GetRunRequest.FromString)
    reply = collect(iter([pb.GetRunRequest(run_id="s1"), pb.GetRunRequest(run_id="s1")]), timeout=10)
    assert reply.run_id == "s1,s1"


def test_every_call_is_counted_by_status_and_its_bytes_by_method(observed) -> None:
    channel, metrics = observed
    _call(channel, "run-1")
    for run_id, code in (("refuse", grpc.StatusCode.FAILED_PRECONDITION), ("crash", grpc.StatusCode.UNKNOWN)):
        with pytest.raises(grpc.RpcError) as info:
            _call(channel, run_id)
        assert info.value.code() == code
    handled = {
        code: _value(metrics, "vesper_grpc_server_handled_total", service="vesper.v1.Test", method="Echo", code=code)
        for code in ("OK", "FAILED_PRECONDITION", "UNKNOWN")
    }
    assert handled == {"OK": 1, "FAILED_PRECONDITION": 1, "UNKNOWN": 1}
    sent = sum(len(pb.GetRunRequest(run_id=r).SerializeToString()) for r in ("run-1", "refuse", "crash"))
    labels = {"service": "vesper.v1.Test", "method": "Echo"}
    assert _value(metrics, "vesper_grpc_server_received_bytes_total", **labels) == sent
    assert _value(metrics, "vesper_grpc_server_sent_bytes_total", **labels) == len(
        pb.GetRunRequest(run_id="run-1").SerializeToString()
    )


def test_name_run_ignores_an_empty_id() -> None:
    name_run("")
    assert RUN_ID.get() is None
