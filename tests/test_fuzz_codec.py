"""Fuzzing the tensor codec and the node-id check (no services).

Whatever a peer sends, :func:`decode_tensor` either returns a float32 tensor of exactly
the promised shape or raises :class:`WireError` naming the tensor and the problem; every
check on the message's structure happens before its data is read, so a message that
claims a huge tensor costs nothing to refuse. tests/test_wire.py holds the hand-picked
cases; this module draws them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from vesper.common import wire
from vesper.common.wire import WireError, decode_tensor, encode_tensor, node_mask, validate_node_ids
from vesper.proto.v1 import tensor_pb2

WIRE_DTYPES = ("float32", "bfloat16")
CODES = {"float32": tensor_pb2.DTYPE_FLOAT32, "bfloat16": tensor_pb2.DTYPE_BFLOAT16}
INT64 = st.integers(-(2**63), 2**63 - 1)
MAX_ELEMENTS = 4096  # small, so that "too large" is cheap to reach
FUZZ = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
# the two broadest properties run this many examples in the default suite, and DEEP under `make test-slow`
FAST, DEEP = 150, 5000
DEPTHS = [pytest.param(FAST, id="fast"), pytest.param(DEEP, id="deep", marks=pytest.mark.slow)]


# -- round trips ---------------------------------------------------------------------------
def _finite(dtype: str) -> st.SearchStrategy[float]:
    # bfloat16 keeps float32's exponent but rounds the mantissa: float32's largest values
    # round up to Inf, which the receiver then refuses (test_encoding_past_bfloat16_range_is_refused)
    bound = float(np.finfo(np.float32).max if dtype == "float32" else np.float32(3.3e38))
    return st.floats(-bound, bound, allow_nan=False, width=32)


@st.composite
def tensors(draw: st.DrawFn, dtype: str) -> torch.Tensor:
    shape = draw(st.lists(st.integers(0, 5), min_size=1, max_size=4))
    values = draw(st.lists(_finite(dtype), min_size=math.prod(shape), max_size=math.prod(shape)))
    return torch.tensor(values, dtype=torch.float32).reshape(shape)


@pytest.mark.parametrize("dtype", WIRE_DTYPES)
@given(data=st.data())
@FUZZ
def test_round_trip_keeps_shape_and_values_including_empty_dimensions(dtype: str, data: st.DataObject) -> None:
    tensor = data.draw(tensors(dtype))
    message = encode_tensor(tensor, dtype)
    assert list(message.shape) == list(tensor.shape)
    assert len(message.data) == tensor.numel() * wire.ITEM_SIZE[dtype]
    decoded = decode_tensor(message, name="x", expected_shape=tuple(tensor.shape), expected_dtype=dtype, max_abs=None)
    expected = tensor if dtype == "float32" else tensor.to(torch.bfloat16).float()
    assert decoded.dtype == torch.float32 and decoded.shape == tensor.shape
    assert torch.equal(decoded, expected)


@pytest.mark.parametrize("dtype", WIRE_DTYPES)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    special=st.lists(st.sampled_from([math.nan, math.inf, -math.inf]), min_size=1, max_size=3),
    seed=st.integers(0, 2**32 - 1),
)
@FUZZ
def test_non_finite_values_round_trip_only_when_allowed(dtype: str, shape: list[int], special: list[float], seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.randn(shape, generator=generator)
    positions = torch.randperm(tensor.numel(), generator=generator)[: len(special)]
    tensor.view(-1)[positions] = torch.tensor(special[: positions.numel()])
    bad = int((~torch.isfinite(tensor)).sum())
    message = encode_tensor(tensor, dtype)
    with pytest.raises(WireError, match=rf"^gradient: {bad} non-finite values \(NaN or Inf\)$"):
        decode_tensor(message, name="gradient")
    decoded = decode_tensor(message, name="gradient", require_finite=False)
    expected = tensor if dtype == "float32" else tensor.to(torch.bfloat16).float()
    assert torch.allclose(decoded, expected, equal_nan=True, atol=0, rtol=0)


def test_encoding_past_bfloat16_range_is_refused() -> None:
    """float32's largest finite value rounds to Inf in bfloat16: the receiver says so."""
    message = encode_tensor(torch.tensor([[3.4e38, 1.0]]), "bfloat16")
    with pytest.raises(WireError, match="embeddings: 1 non-finite values"):
        decode_tensor(message, name="embeddings")


@pytest.mark.parametrize("dtype", WIRE_DTYPES)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    magnitudes=st.lists(st.floats(2 * wire.MAX_ABS_VALUE, 3e38), min_size=1, max_size=3),
    seed=st.integers(0, 2**32 - 1),
)
@FUZZ
def test_absurd_magnitudes_are_refused_and_ordinary_ones_pass(
    dtype: str, shape: list[int], magnitudes: list[float], seed: int
) -> None:
    """A gradient or embedding of norm 1e30 is finite but no release is that large, and the
    receiver's optimiser would overflow on it: refused by default, passed with max_abs=None."""
    generator = torch.Generator().manual_seed(seed)
    ordinary = torch.randn(shape, generator=generator) * 1000
    assert torch.equal(decode_tensor(encode_tensor(ordinary, "float32"), name="gradient"), ordinary)
    absurd = ordinary.clone()
    positions = torch.randperm(absurd.numel(), generator=generator)[: len(magnitudes)]
    signs = torch.where(torch.rand(positions.numel(), generator=generator) < 0.5, -1.0, 1.0)
    absurd.view(-1)[positions] = signs * torch.tensor(magnitudes[: positions.numel()])
    message = encode_tensor(absurd, dtype)
    with pytest.raises(WireError, match=rf"^gradient: {positions.numel()} values of magnitude above 1e\+09"):
        decode_tensor(message, name="gradient")
    assert decode_tensor(message, name="gradient", max_abs=None).shape == absurd.shape


# -- malformed messages ----------------------------------------------------------------------
DIMENSION = st.one_of(
    st.integers(0, 6),
    st.integers(-3, -1),
    st.integers(MAX_ELEMENTS - 2, MAX_ELEMENTS + 2),
    st.sampled_from([2**31, 2**32 + 1, 2**62, 2**63 - 1, -(2**63)]),
    INT64,
)
DTYPE_CODE = st.one_of(st.sampled_from(list(CODES.values())), st.integers(-(2**31), 2**31 - 1))


@st.composite
def messages(draw: st.DrawFn) -> tensor_pb2.Tensor:
    """Any Tensor message: often well formed, often one field off, sometimes nonsense throughout."""
    code = draw(DTYPE_CODE)
    shape = draw(st.lists(DIMENSION, min_size=0, max_size=10))
    item = 4 if code == tensor_pb2.DTYPE_FLOAT32 else 2
    declared = math.prod(shape) if shape and all(0 <= s <= MAX_ELEMENTS for s in shape) else 0
    matching = 0 <= declared <= MAX_ELEMENTS
    exact = declared * item if matching else 0
    length = draw(st.one_of(st.just(exact), st.integers(0, 64), st.just(max(exact - 1, 0))))
    data = draw(st.binary(min_size=length, max_size=length))
    return tensor_pb2.Tensor(dtype=code, shape=shape, data=data)


@contextmanager
def _data_reads() -> Iterator[mock.MagicMock]:
    """Counts the codec's reads of a message's data (numpy.frombuffer, its only way in)."""
    with mock.patch.object(wire.np, "frombuffer", wraps=np.frombuffer) as reads:
        yield reads


def _check_outcome(message: tensor_pb2.Tensor, *, name: str, **kwargs: object) -> torch.Tensor | WireError:
    with _data_reads() as reads:
        try:
            tensor = decode_tensor(message, name=name, max_elements=MAX_ELEMENTS, **kwargs)
        except WireError as exc:
            text = str(exc)
            assert text.startswith(f"{name}: ") and len(text) > len(name) + 10, text
            if "non-finite" not in text and "magnitude" not in text:  # only these two need the values
                assert reads.call_count == 0, f"data read before refusing: {text}"
            return exc
    # anything else (RuntimeError, OverflowError, MemoryError, ...) fails the test by propagating
    shape = tuple(message.shape)
    assert tensor.dtype == torch.float32 and tuple(tensor.shape) == shape
    assert tensor.numel() <= MAX_ELEMENTS
    assert message.dtype in CODES.values()
    assert len(message.data) == tensor.numel() * (4 if message.dtype == tensor_pb2.DTYPE_FLOAT32 else 2)
    if kwargs.get("expected_shape") is not None:
        assert shape == tuple(kwargs["expected_shape"])
    if kwargs.get("require_finite", True):
        assert bool(torch.isfinite(tensor).all())
    finite = tensor[torch.isfinite(tensor)]
    assert not finite.numel() or float(finite.abs().max()) <= wire.MAX_ABS_VALUE
    return tensor


@pytest.mark.parametrize("examples", DEPTHS)
def test_any_message_decodes_to_its_promise_or_is_refused_by_name(examples: int) -> None:
    @given(
        message=messages(),
        expected_shape=st.one_of(st.none(), st.lists(st.integers(0, 6), min_size=1, max_size=4)),
        expected_dtype=st.one_of(st.none(), st.sampled_from(WIRE_DTYPES)),
        require_finite=st.booleans(),
    )
    @settings(FUZZ, max_examples=examples)
    def check(
        message: tensor_pb2.Tensor, expected_shape: list[int] | None, expected_dtype: str | None, require_finite: bool
    ) -> None:
        _check_outcome(
            message, name="embeddings", expected_shape=expected_shape, expected_dtype=expected_dtype,
            require_finite=require_finite,
        )

    check()


def _message(dtype: str, shape: list[int], data: bytes | None = None) -> tensor_pb2.Tensor:
    if data is None:
        data = b"\x00" * (math.prod(shape) * wire.ITEM_SIZE[dtype])
    return tensor_pb2.Tensor(dtype=CODES[dtype], shape=shape, data=data)


@given(code=st.integers(-(2**31), 2**31 - 1).filter(lambda c: c not in CODES.values()))
@FUZZ
def test_unknown_dtype_codes_are_named(code: int) -> None:
    message = tensor_pb2.Tensor(dtype=code, shape=[1], data=b"\x00" * 4)
    error = _check_outcome(message, name="gradient")
    assert isinstance(error, WireError) and "unsupported tensor dtype" in str(error)
    assert ("DTYPE_UNSPECIFIED" if code == 0 else str(code)) in str(error)


@given(dtype=st.sampled_from(WIRE_DTYPES), shape=st.lists(st.integers(0, 5), min_size=1, max_size=4), delta=st.integers(-9, 9))
@FUZZ
def test_data_length_must_match_the_shape(dtype: str, shape: list[int], delta: int) -> None:
    expected = math.prod(shape) * wire.ITEM_SIZE[dtype]
    assume(delta != 0 and expected + delta >= 0)
    error = _check_outcome(_message(dtype, shape, b"\x01" * (expected + delta)), name="embeddings")
    assert isinstance(error, WireError)
    assert f"{expected + delta} bytes of data for shape {shape} {dtype}; expected {expected}" in str(error)


@given(
    dtype=st.sampled_from(WIRE_DTYPES),
    shape=st.lists(st.one_of(st.integers(0, 4), st.integers(-(2**63), -1)), min_size=1, max_size=5).filter(
        lambda s: any(d < 0 for d in s)
    ),
)
@FUZZ
def test_negative_dimensions_are_refused(dtype: str, shape: list[int]) -> None:
    error = _check_outcome(tensor_pb2.Tensor(dtype=CODES[dtype], shape=shape, data=b""), name="embeddings")
    assert isinstance(error, WireError) and "negative dimension" in str(error)


@given(
    dtype=st.sampled_from(WIRE_DTYPES),
    shape=st.lists(st.one_of(st.integers(0, 3), st.integers(MAX_ELEMENTS + 1, 2**63 - 1)), min_size=1, max_size=8).filter(
        lambda s: math.prod(max(d, 1) for d in s) > MAX_ELEMENTS
    ),
)
@FUZZ
def test_huge_dimensions_and_overflowing_products_are_refused_before_reading(dtype: str, shape: list[int]) -> None:
    """Including shapes whose product is 0 (an empty dimension) or past int64: torch cannot hold them."""
    error = _check_outcome(tensor_pb2.Tensor(dtype=CODES[dtype], shape=shape, data=b"\x00" * 8), name="embeddings")
    assert isinstance(error, WireError) and f"configured maximum of {MAX_ELEMENTS}" in str(error)


@given(dimensions=st.integers(wire.MAX_DIMS + 1, 200))
@settings(FUZZ, max_examples=10)
def test_too_many_dimensions_are_refused(dimensions: int) -> None:
    error = _check_outcome(_message("float32", [1] * dimensions), name="embeddings")
    assert isinstance(error, WireError) and f"{dimensions} dimensions; at most {wire.MAX_DIMS}" in str(error)


@given(dtype=st.sampled_from(WIRE_DTYPES), rows=st.integers(1, 64), extra=st.integers(1, 64))
@FUZZ
def test_more_elements_than_configured_are_refused_even_with_matching_data(dtype: str, rows: int, extra: int) -> None:
    columns = MAX_ELEMENTS // rows + extra
    error = _check_outcome(_message(dtype, [rows, columns]), name="embeddings")
    assert isinstance(error, WireError)
    assert f"{rows * columns} elements exceed the configured maximum of {MAX_ELEMENTS}" in str(error)


@given(
    dtype=st.sampled_from(WIRE_DTYPES),
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=4),
    expected=st.lists(st.integers(0, 4), min_size=1, max_size=4),
)
@FUZZ
def test_a_shape_other_than_the_runs_is_refused(dtype: str, shape: list[int], expected: list[int]) -> None:
    outcome = _check_outcome(_message(dtype, shape), name="embeddings", expected_shape=expected)
    if shape == expected:
        assert isinstance(outcome, torch.Tensor)
    else:
        assert isinstance(outcome, WireError) and f"shape {shape} but expected {expected}" in str(outcome)


@given(sent=st.sampled_from(WIRE_DTYPES), run=st.sampled_from(WIRE_DTYPES), shape=st.lists(st.integers(1, 4), min_size=1, max_size=3))
@FUZZ
def test_a_dtype_other_than_the_runs_is_refused(sent: str, run: str, shape: list[int]) -> None:
    outcome = _check_outcome(_message(sent, shape), name="gradient", expected_dtype=run)
    if sent == run:
        assert isinstance(outcome, torch.Tensor)
    else:
        assert isinstance(outcome, WireError) and f"dtype {sent} but this run sends {run}" in str(outcome)


# -- node ids --------------------------------------------------------------------------------
@st.composite
def id_cases(draw: st.DrawFn) -> tuple[list[int], int, torch.Tensor | None]:
    num_nodes = draw(st.integers(1, 50))
    valid = st.integers(0, num_nodes - 1)
    ids = draw(st.lists(st.one_of(valid, valid, valid, st.integers(-5, -1), st.integers(num_nodes, num_nodes + 5), INT64), max_size=12))
    allowed = None
    if draw(st.booleans()):
        allowed = torch.tensor(draw(st.lists(st.booleans(), min_size=num_nodes, max_size=num_nodes)), dtype=torch.bool)
    return ids, num_nodes, allowed


def _first_problem(ids: list[int], num_nodes: int, allowed: torch.Tensor | None) -> str | None:
    """The refusal an independent reading of the rules expects, in the order they are checked."""
    if not ids:
        return "batch: no node ids"
    if min(ids) < 0:
        return f"batch: negative node id {min(ids)}"
    if max(ids) >= num_nodes:
        return f"batch: unknown node id {max(ids)}; the graph has {num_nodes} nodes"
    if len(set(ids)) != len(ids):
        return "batch: duplicate node ids"
    if allowed is not None:
        outside = [i for i in ids if not bool(allowed[i])]
        if outside:
            return f"batch: node {outside[0]} is not in the allowed set ({len(outside)} such ids)"
    return None


@pytest.mark.parametrize("examples", DEPTHS)
def test_node_ids_are_accepted_exactly_when_every_rule_holds(examples: int) -> None:
    @given(case=id_cases())
    @settings(FUZZ, max_examples=examples)
    def check(case: tuple[list[int], int, torch.Tensor | None]) -> None:
        ids, num_nodes, allowed = case
        problem = _first_problem(ids, num_nodes, allowed)
        if problem is None:
            result = validate_node_ids(ids, name="batch", allowed=allowed, num_nodes=num_nodes)
            assert result.dtype == torch.int64 and result.tolist() == ids
        else:
            with pytest.raises(WireError) as error:
                validate_node_ids(ids, name="batch", allowed=allowed, num_nodes=num_nodes)
            assert str(error.value) == problem

    check()


@given(
    num_nodes=st.integers(1, 60),
    data=st.data(),
)
@FUZZ
def test_node_mask_allows_exactly_its_ids(num_nodes: int, data: st.DataObject) -> None:
    members = data.draw(st.sets(st.integers(0, num_nodes - 1), max_size=num_nodes))
    mask = node_mask(torch.tensor(sorted(members), dtype=torch.int64), num_nodes)
    assert {i for i in range(num_nodes) if bool(mask[i])} == members
    for node in range(num_nodes):
        if node in members:
            assert validate_node_ids([node], name="batch", allowed=mask, num_nodes=num_nodes).tolist() == [node]
        else:
            with pytest.raises(WireError, match=f"node {node} is not in the allowed set"):
                validate_node_ids([node], name="batch", allowed=mask, num_nodes=num_nodes)
