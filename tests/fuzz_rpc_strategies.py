"""What a fuzz case of the test_fuzz_rpc_*.py modules expects, and the strategies they share.

Hypothesis sends every RPC requests that are wrong in one or more drawn ways (wrong dtype or
shape, sizes past the limits, NaN/Inf, absurd norms, bad node ids, unknown runs, replayed or
skipped steps, garbage JSON, bad tokens). Each call must be refused with a clear status whose
details name one of the problems drawn (:func:`assert_refused`): never UNKNOWN or INTERNAL,
never accepted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import pytest
import torch
from fuzz_rpc_world import B_RUN_ID, MAX_MESSAGE_MB, NUM_NODES, D, L, _good_tensor
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from vesper.common.dataset_files import BUNDLED
from vesper.common.wire import encode_tensor
from vesper.proto.v1 import tensor_pb2

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
EXISTS = grpc.StatusCode.ALREADY_EXISTS
CLEAR = {INVALID, NOT_FOUND, PRECONDITION, EXHAUSTED, UNAUTHENTICATED, DENIED, EXISTS}

# examples per RPC: a quick pass, then a deep one (both in make test-slow, where the fuzzing modules
# share one cluster and a real run; the codec's fuzzer, test_fuzz_codec, keeps its quick pass in make test)
FAST, DEEP = 10, 200
DEPTHS = [pytest.param(FAST, id="fast"), pytest.param(DEEP, id="deep", marks=pytest.mark.slow)]


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples, deadline=None, derandomize=True, database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- expectations ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Expect:
    """A refusal the drawn problem justifies: its status and a regular expression its details contain."""

    code: grpc.StatusCode
    fragment: str

    def matches(self, code: grpc.StatusCode, details: str) -> bool:
        return code == self.code and re.search(self.fragment, details) is not None


def assert_refused(call: Callable[[], object], expected: Sequence[Expect]) -> grpc.RpcError:
    """The call fails with a clear status naming one of the problems drawn."""
    assert expected, "a fuzz case must name at least one problem"
    try:
        outcome = call()
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
        assert code in CLEAR, f"unclear status {code.name}: {details}"
        assert any(e.matches(code, details) for e in expected), f"{code.name}: {details!r}; expected one of {expected}"
        return error
    raise AssertionError(f"accepted ({str(outcome)[:200]!r}); expected one of {expected}")

# -- shared strategies ------------------------------------------------------------------------
NAN, INF = float("nan"), float("inf")
TOKEN_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x7E)  # what a header value may hold


@st.composite
def bad_tensors(draw: st.DrawFn, rows: int) -> tuple[tensor_pb2.Tensor, Expect]:
    """Embeddings for ``rows`` nodes, wrong in one drawn way."""
    seed = draw(st.integers(0, 2**16))
    values = torch.rand(rows, D, L, generator=torch.Generator().manual_seed(seed))
    fault = draw(st.sampled_from([
        "wrong dtype", "unknown dtype", "wrong shape", "byte count", "impossible shape", "past the transport limit",
        "non-finite", "absurd norm",
    ]))
    message = encode_tensor(values, "float32")
    if fault == "wrong dtype":
        return encode_tensor(values, "bfloat16"), Expect(INVALID, "dtype bfloat16 but this run sends float32")
    if fault == "unknown dtype":
        message.dtype = draw(st.integers(-(2**31), 2**31 - 1).filter(lambda c: c not in (1, 2)))
        return message, Expect(INVALID, "unsupported tensor dtype")
    if fault == "wrong shape":
        shape = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4).filter(lambda s: s != [rows, D, L]))
        return encode_tensor(torch.zeros(shape), "float32"), Expect(INVALID, rf"but expected \[{rows}, {D}, {L}\]")
    if fault == "byte count":
        cut = draw(st.integers(1, 16))
        shorter = draw(st.booleans()) and len(message.data) >= cut
        message.data = message.data[:-cut] if shorter else message.data + bytes(cut)
        return message, Expect(INVALID, "bytes of data for shape")
    if fault == "impossible shape":
        message.shape[:] = draw(st.one_of(
            st.lists(st.integers(2**31, 2**63 - 1), min_size=1, max_size=4),  # more elements than allowed
            st.lists(st.integers(-(2**63), -1), min_size=1, max_size=3),  # negative
            st.lists(st.integers(0, 3), min_size=9, max_size=70),  # more dimensions than any tensor here
            st.tuples(st.just(0), st.integers(2**31, 2**63 - 1), st.integers(2**31, 2**63 - 1)).map(list),
        ))
        return message, Expect(INVALID, "exceed the configured maximum|negative dimension|dimensions; at most|is empty but")
    if fault == "past the transport limit":
        message.data = bytes(MAX_MESSAGE_MB * 2**20 + draw(st.integers(1, 4096)))
        return message, Expect(EXHAUSTED, "larger than max")
    positions = draw(st.lists(st.integers(0, values.numel() - 1), min_size=1, max_size=4)) if rows else []
    if not positions:  # no element to spoil: send it one row too many instead
        return _good_tensor(rows + 1, seed), Expect(INVALID, rf"but expected \[{rows}, {D}, {L}\]")
    if fault == "non-finite":
        values.view(-1)[positions] = draw(st.sampled_from([NAN, INF, -INF]))
        return encode_tensor(values, "float32"), Expect(INVALID, "non-finite values")
    values.view(-1)[positions] = draw(st.sampled_from([1e30, -1e30, 3e38, 2e9, -1e15]))
    return encode_tensor(values, "float32"), Expect(INVALID, "values of magnitude above")


@st.composite
def good_ids(draw: st.DrawFn, allowed: Sequence[int], max_size: int = 4) -> list[int]:
    return draw(st.lists(st.sampled_from(list(allowed)), min_size=1, max_size=max_size, unique=True))


@st.composite
def bad_ids(draw: st.DrawFn, allowed: Sequence[int], forbidden: Sequence[int]) -> tuple[list[int], Expect]:
    """Node ids wrong in one drawn way: ``forbidden`` are ids of the graph the receiver does not take here."""
    ids = draw(good_ids(allowed))
    position = draw(st.integers(0, len(ids)))
    fault = draw(st.sampled_from(["negative", "duplicate", "outside the graph", "not allowed", "none"]))
    if fault == "none":
        return [], Expect(INVALID, "no node ids")
    if fault == "negative":
        ids.insert(position, draw(st.integers(-(2**63), -1)))
        return ids, Expect(INVALID, "negative node id")
    if fault == "duplicate":
        ids.insert(position, draw(st.sampled_from(ids)))
        return ids, Expect(INVALID, "duplicate node ids")
    if fault == "outside the graph":
        ids.insert(position, draw(st.integers(NUM_NODES, 2**63 - 1)))
        return ids, Expect(INVALID, rf"unknown node id \d+; the graph has {NUM_NODES} nodes")
    ids.insert(position, draw(st.sampled_from(list(forbidden))))
    return ids, Expect(INVALID, "is not in the allowed set")


UNKNOWN_DATASETS = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["/etc/passwd", "/nonexistent/graph.npz", "../cora.npz", ".", "/", "~nosuchuser/x.npz"]),
).filter(lambda t: t not in BUNDLED)


def unknown_run_ids(known: set[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(max_size=80),
        st.from_regex(B_RUN_ID, fullmatch=True),
        st.sampled_from(["../../etc/passwd", "fuzz-train ", "FUZZ-TRAIN", "fuzz-train.labels", "\x00", "runs/x"]),
    ).filter(lambda run_id: run_id not in known)


def _not_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False
