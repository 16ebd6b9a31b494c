"""gRPC's transport replaced within one process, for ``InProcessCluster`` (coordinator/in_process.py).

The channel's contract (what stays as on the wire):

* The generated stubs (``*_pb2_grpc.*Stub``) are used as they are. A stub asks its channel
  for each method by path; :class:`InProcessServer` is what the generated
  ``add_*Servicer_to_server`` registers the servicer's handlers on, and the channel routes
  each path to its handler.
* Every message crosses as bytes, through the stub's serializer and the handler's
  deserializer and back, so each side holds its own copy of exactly what the wire carries.
* Each call runs its handler on a thread of its own, as a gRPC server's worker pool does,
  so the caller's thread-local state (grad mode, ...) never leaks into it. A streaming
  handler pulls the caller's requests from that thread; responses, and at the end the
  call's status, come back in order through a queue.
* ``context.abort(code, details)`` unwinds the handler, and the caller sees a
  ``grpc.RpcError`` with that ``code()`` and ``details()``. An unexpected exception in a
  handler becomes ``UNKNOWN`` in gRPC's own words ("Exception calling application: ...",
  "Exception iterating responses: ..."); the caller's ``cancel()`` ``CANCELLED`` ("Locally
  cancelled by application!"), a passed deadline ``DEADLINE_EXCEEDED`` ("Deadline
  Exceeded"), an unregistered method ``UNIMPLEMENTED``; futures raise
  ``grpc.FutureTimeoutError`` and ``grpc.FutureCancelledError``.
* Metadata (the charge tokens) reaches ``context.invocation_metadata()`` as sent, so the
  accountant's authorisation runs unchanged.

Not emulated: message size limits, compression, keepalive, credentials and peer identity.
The servicer context offers what vesper's servicers use: ``abort``, ``abort_with_status``,
``set_code``, ``set_details``, ``invocation_metadata``, ``is_active``, ``time_remaining``,
``peer``. There is no REST status endpoint: read the ledger through
``InProcessCluster.accountant`` or the ledger file.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

log = logging.getLogger(__name__)

Metadata = tuple[tuple[str, str], ...]
Serializer = Callable[[Any], bytes]
Deserializer = Callable[[bytes], Any]


# -- the transport -----------------------------------------------------------------------------
class InProcessRpcError(grpc.RpcError):
    """What a caller sees when a call ends with a status other than OK."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def debug_error_string(self) -> str:
        return f"in-process call ended with {self._code.name}: {self._details}"


@dataclass(frozen=True)
class _Status:
    code: grpc.StatusCode
    details: str = ""

    @property
    def ok(self) -> bool:
        return self.code is grpc.StatusCode.OK

    def error(self) -> InProcessRpcError:
        return InProcessRpcError(self.code, self.details)


_OK = _Status(grpc.StatusCode.OK)
_CANCELLED = _Status(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")
_DEADLINE = _Status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
_REQUESTS_FAILED = _Status(grpc.StatusCode.UNKNOWN, "Exception iterating requests!")
_NOT_FOUND = _Status(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
_SERVER_STOPPED = _Status(grpc.StatusCode.UNAVAILABLE, "the in-process server stopped")
_WAKE = object()  # put in a call's queue so that a reader notices a local cancel or deadline


class _Aborted(Exception):
    """Raised by ``context.abort`` to unwind the handler (gRPC raises a bare Exception)."""


class _ServicerContext:
    """The part of ``grpc.ServicerContext`` vesper's servicers use."""

    def __init__(self, metadata: Metadata, deadline: float | None) -> None:
        self._metadata = metadata
        self._deadline = deadline
        self._ended = threading.Event()
        self.aborted: _Status | None = None
        self.code: grpc.StatusCode | None = None
        self.details = ""

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def peer(self) -> str:
        return "in-process"

    def is_active(self) -> bool:
        return not self._ended.is_set() and (self._deadline is None or time.monotonic() < self._deadline)

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def end(self) -> None:
        self._ended.set()

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        self.aborted = _Status(code, details)
        raise _Aborted(details)

    def abort_with_status(self, status: grpc.Status) -> NoReturn:
        self.abort(status.code, status.details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


class _Call:
    """One RPC: its handler runs on a thread of its own; the caller takes responses, then the
    call's status, from a queue in the order the handler produced them. A local cancel or a
    passed deadline ends the call for the caller at once, as in gRPC; the handler is not
    interrupted, but ``context.is_active()`` turns False and no further request reaches it."""

    def __init__(
        self, handler: grpc.RpcMethodHandler | None, request: bytes | Iterator[bytes], metadata: Metadata,
        timeout: float | None, name: str,
    ) -> None:
        self._handler = handler
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self.context = _ServicerContext(metadata, self._deadline)
        self._outcomes: queue.Queue = queue.Queue()
        self._settled = threading.Event()  # the handler finished, or the caller's end came first
        self._lock = threading.Lock()
        self.interrupted: _Status | None = None
        threading.Thread(target=self._serve, args=(request,), name=name, daemon=True).start()

    # -- the handler's side ------------------------------------------------------------------
    def _serve(self, request: bytes | Iterator[bytes]) -> None:
        status = _NOT_FOUND if self._handler is None else self._run_handler(request)
        self.context.end()
        self._outcomes.put(status)
        self._settled.set()

    def _run_handler(self, request: bytes | Iterator[bytes]) -> _Status:
        handler = self._handler
        assert handler is not None
        deserialize = handler.request_deserializer or (lambda data: data)
        serialize = handler.response_serializer or (lambda message: message)
        if handler.request_streaming:
            argument = self._requests(request, deserialize)  # type: ignore[arg-type]
        else:
            argument = deserialize(request)
        behaviour = {
            (False, False): handler.unary_unary, (False, True): handler.unary_stream,
            (True, False): handler.stream_unary, (True, True): handler.stream_stream,
        }[(handler.request_streaming, handler.response_streaming)]
        try:
            result = behaviour(argument, self.context)
            if not handler.response_streaming:
                self._outcomes.put(serialize(result))
        except Exception as exc:  # noqa: BLE001 — a handler's failure is the call's status
            return self._failure(exc, "Exception calling application")
        if handler.response_streaming:
            try:
                for response in result:
                    if not self.context.is_active():
                        getattr(result, "close", lambda: None)()  # the handler's clean-up runs, as on a cancel
                        break
                    self._outcomes.put(serialize(response))
            except Exception as exc:  # noqa: BLE001
                return self._failure(exc, "Exception iterating responses")
        if self.context.aborted is not None:
            return self.context.aborted
        if self.context.code not in (None, grpc.StatusCode.OK):
            return _Status(self.context.code, self.context.details)  # type: ignore[arg-type]
        return _OK

    def _failure(self, exc: Exception, what: str) -> _Status:
        if self.context.aborted is not None:
            return self.context.aborted
        log.exception("%s: %s", what, exc)  # gRPC logs a handler's unexpected exception too
        return _Status(grpc.StatusCode.UNKNOWN, f"{what}: {exc}")

    def _requests(self, requests: Iterator[bytes], deserialize: Deserializer) -> Iterator[Any]:
        """The caller's requests, as the handler reads them; they stop when the call ends."""
        while self.context.is_active():
            try:
                data = next(requests)
            except StopIteration:
                return
            except Exception:  # noqa: BLE001 — gRPC ends the call the same way
                log.exception(_REQUESTS_FAILED.details)
                self.interrupt(_REQUESTS_FAILED)
                return
            yield deserialize(data)

    # -- the caller's side -------------------------------------------------------------------
    def interrupt(self, status: _Status) -> bool:
        """End the call for the caller now (a cancel, a deadline, a stopped server)."""
        with self._lock:
            if self._settled.is_set():
                return False
            self.interrupted = status
            self._settled.set()
        self.context.end()
        self._outcomes.put(_WAKE)
        return True

    def cancel(self) -> bool:
        return self.interrupt(_CANCELLED)

    def wait(self, timeout: float | None) -> bool:
        """Whether the call has settled within ``timeout`` (a passed deadline settles it)."""
        limits = [t for t in (timeout, self._remaining()) if t is not None]
        if self._settled.wait(min(limits) if limits else None):
            return True
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self.interrupt(_DEADLINE)
            return True
        return False

    def _remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def take(self) -> bytes | None:
        """The next response; None after the last; the call's error if it failed."""
        while True:
            if self.interrupted is not None:
                raise self.interrupted.error()
            try:
                item = self._outcomes.get(timeout=self._remaining())
            except queue.Empty:
                self.interrupt(_DEADLINE)
                continue
            if item is _WAKE:
                continue
            if isinstance(item, _Status):
                self._outcomes.put(item)  # the end stays the end for any later read
                if item.ok:
                    return None
                raise item.error()
            return item


class _ResponseIterator:
    """The caller's view of a response stream (a ``grpc.Call`` that is also an iterator)."""

    def __init__(self, call: _Call, deserialize: Deserializer) -> None:
        self._call = call
        self._deserialize = deserialize

    def __iter__(self) -> _ResponseIterator:
        return self

    def __next__(self) -> Any:
        data = self._call.take()
        if data is None:
            raise StopIteration
        return self._deserialize(data)

    def cancel(self) -> bool:
        return self._call.cancel()

    def is_active(self) -> bool:
        return self._call.context.is_active()


class _ResponseFuture:
    """The caller's view of a single response (the part of ``grpc.Future`` vesper uses)."""

    def __init__(self, call: _Call, deserialize: Deserializer) -> None:
        self._call = call
        self._deserialize = deserialize
        self._response: Any = None
        self._taken = False

    def done(self) -> bool:
        return self._call.wait(0)

    def cancel(self) -> bool:
        return self._call.cancel()

    def cancelled(self) -> bool:
        return self._call.interrupted is _CANCELLED

    def result(self, timeout: float | None = None) -> Any:
        if not self._call.wait(timeout):
            raise grpc.FutureTimeoutError()
        if self.cancelled():
            raise grpc.FutureCancelledError()
        if not self._taken:
            data = self._call.take()
            if data is None:
                raise _Status(grpc.StatusCode.INTERNAL, "the handler sent no response").error()
            self._response, self._taken = self._deserialize(data), True
        return self._response


class _MultiCallable:
    """One method of a stub, as ``channel.unary_unary`` (and the other three) return it."""

    def __init__(
        self, channel: InProcessChannel, method: str, request_streaming: bool, response_streaming: bool,
        request_serializer: Serializer | None, response_deserializer: Deserializer | None,
    ) -> None:
        self._channel = channel
        self._method = method
        self._request_streaming = request_streaming
        self._response_streaming = response_streaming
        self._serialize = request_serializer or (lambda message: message)
        self._deserialize = response_deserializer or (lambda data: data)

    def _start(self, request: Any, timeout: float | None, metadata: Any) -> _Call:
        if self._channel.closed:
            raise ValueError("Cannot invoke RPC on closed channel!")  # gRPC's words
        payload = (self._serialize(m) for m in request) if self._request_streaming else self._serialize(request)
        return self._channel.server.start_call(self._method, payload, tuple(metadata or ()), timeout)

    def __call__(self, request: Any, timeout: float | None = None, metadata: Any = None, **_: Any) -> Any:
        call = self._start(request, timeout, metadata)
        if self._response_streaming:
            return _ResponseIterator(call, self._deserialize)
        return _ResponseFuture(call, self._deserialize).result()

    def future(self, request: Any, timeout: float | None = None, metadata: Any = None, **_: Any) -> _ResponseFuture:
        if self._response_streaming:
            raise TypeError(f"{self._method} streams its responses: call it, it has no future()")
        return _ResponseFuture(self._start(request, timeout, metadata), self._deserialize)


class InProcessChannel:
    """A ``grpc.Channel`` to an :class:`InProcessServer`: give it to a generated stub."""

    def __init__(self, server: InProcessServer, target: str) -> None:
        self.server = server
        self.target = target
        self.closed = False

    def _method(self, method: str, streams: tuple[bool, bool], request_serializer: Serializer | None,
                response_deserializer: Deserializer | None) -> _MultiCallable:
        return _MultiCallable(self, method, *streams, request_serializer, response_deserializer)

    def unary_unary(self, method: str, request_serializer: Serializer | None = None,
                    response_deserializer: Deserializer | None = None, **_: Any) -> _MultiCallable:
        return self._method(method, (False, False), request_serializer, response_deserializer)

    def unary_stream(self, method: str, request_serializer: Serializer | None = None,
                     response_deserializer: Deserializer | None = None, **_: Any) -> _MultiCallable:
        return self._method(method, (False, True), request_serializer, response_deserializer)

    def stream_unary(self, method: str, request_serializer: Serializer | None = None,
                     response_deserializer: Deserializer | None = None, **_: Any) -> _MultiCallable:
        return self._method(method, (True, False), request_serializer, response_deserializer)

    def stream_stream(self, method: str, request_serializer: Serializer | None = None,
                      response_deserializer: Deserializer | None = None, **_: Any) -> _MultiCallable:
        return self._method(method, (True, True), request_serializer, response_deserializer)

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> InProcessChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InProcessServer:
    """What ``add_*Servicer_to_server`` registers handlers on; calls arrive through its channels."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._calls: weakref.WeakSet[_Call] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._count = 0

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        """Ignored: the generated code registers every method again, by name, just after."""

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for method, handler in handlers.items():
            self._handlers[f"/{service}/{method}"] = handler

    def channel(self, target: str | None = None) -> InProcessChannel:
        return InProcessChannel(self, target or self.name)

    def start_call(
        self, method: str, request: bytes | Iterator[bytes], metadata: Metadata, timeout: float | None
    ) -> _Call:
        with self._lock:
            self._count += 1
            call = _Call(self._handlers.get(method), request, metadata, timeout, f"{self.name}-{self._count}")
            self._calls.add(call)
        return call

    def stop(self) -> None:
        """End the calls in flight for their callers (the handlers finish on their own)."""
        with self._lock:
            calls = list(self._calls)
        for call in calls:
            call.interrupt(_SERVER_STOPPED)
