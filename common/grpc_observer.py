"""What every gRPC server of vesper observes of its calls: status codes and message bytes for the
service's metrics (common/metrics.py), and the run a call is about for its log lines
(common/log_format.py).

The observer replaces each method handler's (de)serializers with ones that count the bytes
they turn into messages and back (the serialized protobuf messages: gRPC's 5-byte message
prefix, HTTP/2 framing and TLS are not counted), and wraps its behaviour to count the call's
final status. A request message with a ``run_id`` field names the run of the lines logged
while it is handled; every call starts and ends with no run named, so a worker thread never
carries one call's run into the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc

from vesper.common.log_format import name_run
from vesper.common.metrics import ServiceMetrics

KINDS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")


def _name_run(message: Any) -> None:
    run_id = getattr(message, "run_id", None)
    if isinstance(run_id, str) and run_id:
        name_run(run_id)


class _Call:
    """One method's counters, their labels bound once per method (not per call)."""

    def __init__(self, metrics: ServiceMetrics | None, method: str) -> None:
        service, _, name = method.lstrip("/").partition("/")
        self.metrics, self.service, self.name = metrics, service, name
        if metrics is not None:
            self.received = metrics.grpc_received_bytes.labels(service, name)
            self.sent = metrics.grpc_sent_bytes.labels(service, name)

    def deserializer(self, inner: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
        def deserialize(data: bytes) -> Any:
            if self.metrics is not None:
                self.received.inc(len(data))
            return inner(data) if inner is not None else data

        return deserialize

    def serializer(self, inner: Callable[[Any], bytes] | None) -> Callable[[Any], bytes]:
        def serialize(message: Any) -> bytes:
            data = inner(message) if inner is not None else message
            if self.metrics is not None:
                self.sent.inc(len(data))
            return data

        return serialize

    def finished(
        self, context: grpc.ServicerContext, failed: bool, otherwise: grpc.StatusCode = grpc.StatusCode.UNKNOWN,
    ) -> None:
        """Count the call under the status it ends with: the one the servicer set (an abort
        sets it), else OK, or ``otherwise`` (gRPC's UNKNOWN for an exception) when it failed."""
        if self.metrics is None:
            return
        code = context.code() if hasattr(context, "code") else None
        if code is None:
            code = otherwise if failed else grpc.StatusCode.OK
        name = code.name if isinstance(code, grpc.StatusCode) else str(code)
        self.metrics.grpc_handled.labels(self.service, self.name, name).inc()

    def started(self, request: Any, streaming_request: bool) -> Any:
        """A call begins: no run named yet; a unary request names its run now, a stream's each message."""
        name_run(None)
        if streaming_request:
            return self.requests(request)
        _name_run(request)
        return request

    def requests(self, iterator: Iterator[Any]) -> Iterator[Any]:
        for message in iterator:
            _name_run(message)
            yield message

    def unary_response(self, behavior: Callable, streaming_request: bool) -> Callable:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            request = self.started(request, streaming_request)
            try:
                response = behavior(request, context)
            except BaseException:
                self.finished(context, failed=True)
                raise
            finally:
                name_run(None)
            self.finished(context, failed=False)
            return response

        return handle

    def stream_response(self, behavior: Callable, streaming_request: bool) -> Callable:
        def handle(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            request = self.started(request, streaming_request)
            try:
                yield from behavior(request, context)
            except GeneratorExit:  # the client went away: gRPC closes the stream as CANCELLED
                self.finished(context, failed=True, otherwise=grpc.StatusCode.CANCELLED)
                raise
            except BaseException:
                self.finished(context, failed=True)
                raise
            else:
                self.finished(context, failed=False)
            finally:
                name_run(None)

        return handle


class CallObserver(grpc.ServerInterceptor):
    """Counts every call's status and bytes into ``metrics`` (None: no metrics) and names its run
    for the log lines it causes."""

    def __init__(self, metrics: ServiceMetrics | None) -> None:
        self.metrics = metrics
        self._calls: dict[str, _Call] = {}

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        call = self._calls.get(method)
        if call is None:
            call = self._calls.setdefault(method, _Call(self.metrics, method))
        replaced: dict[str, Any] = {
            "request_deserializer": call.deserializer(handler.request_deserializer),
            "response_serializer": call.serializer(handler.response_serializer),
        }
        for kind in KINDS:
            behavior = getattr(handler, kind)
            if behavior is not None:
                streaming_request = kind.startswith("stream_")
                wrap = call.stream_response if kind.endswith("_stream") else call.unary_response
                replaced[kind] = wrap(behavior, streaming_request)
        return handler._replace(**replaced)
