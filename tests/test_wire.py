"""The tensor codec: round trips in both wire dtypes, and a clear error for every malformed tensor."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vesper.common.wire import (
    WireError,
    decode_tensor,
    encode_tensor,
    validate_node_ids,
)
from vesper.proto.v1 import tensor_pb2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip(dtype: str) -> None:
    tensor = torch.randn(5, 8, 3)
    decoded = decode_tensor(encode_tensor(tensor, dtype), name="x", expected_shape=(5, 8, 3))
    assert decoded.dtype == torch.float32 and decoded.shape == (5, 8, 3)
    if dtype == "float32":
        assert torch.equal(decoded, tensor)
    else:
        assert torch.equal(decoded, tensor.to(torch.bfloat16).float())


def test_bfloat16_halves_the_bytes() -> None:
    tensor = torch.randn(256, 64, 2)
    assert len(encode_tensor(tensor, "bfloat16").data) * 2 == len(encode_tensor(tensor, "float32").data)


def test_data_is_little_endian_row_major() -> None:
    tensor = torch.tensor([[1.0, 2.0], [3.0, -4.5]])
    message = encode_tensor(tensor, "float32")
    assert np.frombuffer(message.data, dtype="<f4").tolist() == [1.0, 2.0, 3.0, -4.5]


@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    seed=st.integers(0, 2**31 - 1),
)
@settings(max_examples=60, deadline=None)
def test_round_trip_any_shape(shape: list[int], dtype: str, seed: int) -> None:
    tensor = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 100
    decoded = decode_tensor(encode_tensor(tensor, dtype), name="x")
    expected = tensor if dtype == "float32" else tensor.to(torch.bfloat16).float()
    assert torch.equal(decoded, expected)


def _message(dtype: int = tensor_pb2.DTYPE_FLOAT32, shape=(2, 3), data: bytes | None = None) -> tensor_pb2.Tensor:
    if data is None:
        data = np.zeros(math.prod(shape), dtype="<f4").tobytes()
    return tensor_pb2.Tensor(dtype=dtype, shape=list(shape), data=data)


@pytest.mark.parametrize(
    "message, kwargs, fragment",
    [
        (_message(dtype=tensor_pb2.DTYPE_UNSPECIFIED), {}, "unsupported tensor dtype DTYPE_UNSPECIFIED"),
        (_message(dtype=7), {}, "unsupported tensor dtype 7"),
        (_message(), {"expected_dtype": "bfloat16"}, "dtype float32 but this run sends bfloat16"),
        (_message(shape=(2, 3)), {"expected_shape": (3, 2)}, "shape [2, 3] but expected [3, 2]"),
        (_message(shape=(), data=b""), {}, "shape is empty"),
        (tensor_pb2.Tensor(dtype=1, shape=[-1, 3], data=b""), {}, "negative dimension"),
        (_message(shape=(2, 3), data=b"\x00" * 20), {}, "20 bytes of data for shape [2, 3] float32; expected 24"),
        (_message(shape=(1000, 1000)), {"max_elements": 10_000}, "exceed the configured maximum"),
        (_message(data=np.array([0, 1, np.nan, 0, 0, 0], dtype="<f4").tobytes()), {}, "1 non-finite values"),
        (_message(data=np.array([np.inf, 1, 1, -np.inf, 0, 0], dtype="<f4").tobytes()), {}, "2 non-finite values"),
    ],
)
def test_malformed_tensors_are_refused_clearly(message, kwargs, fragment: str) -> None:
    with pytest.raises(WireError) as error:
        decode_tensor(message, name="embeddings", **kwargs)
    assert fragment in str(error.value)


def test_node_ids_are_checked() -> None:
    allowed = torch.tensor([True, True, False, True])
    assert validate_node_ids([0, 3], name="batch", allowed=allowed, num_nodes=4).tolist() == [0, 3]
    cases = {
        "negative node id -1": [0, -1],
        "unknown node id 9; the graph has 4 nodes": [0, 9],
        "duplicate node ids": [1, 1],
        "node 2 is not in the allowed set": [2, 3],
        "no node ids": [],
    }
    for fragment, ids in cases.items():
        with pytest.raises(WireError, match=fragment):
            validate_node_ids(ids, name="batch", allowed=allowed, num_nodes=4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_value_checks_in_each_combination(dtype: str) -> None:
    """NaN and Inf are require_finite's; a finite value above max_abs is refused either way,
    and counted without the non-finite ones; an empty tensor passes."""
    values = torch.tensor([[0.5, float("nan")], [float("inf"), -(2.0**42)]])  # exact in bfloat16
    message = encode_tensor(values, dtype)
    with pytest.raises(WireError, match="^x: 2 non-finite values"):
        decode_tensor(message, name="x")
    with pytest.raises(WireError, match=r"^x: 1 values of magnitude above 1e\+09 \(the largest 4.4e\+12\)"):
        decode_tensor(message, name="x", require_finite=False)
    decoded = decode_tensor(message, name="x", require_finite=False, max_abs=None)
    assert torch.equal(decoded.isnan(), values.isnan()) and decoded[1, 0] == float("inf")
    only_non_finite = encode_tensor(torch.tensor([float("nan"), float("-inf")]), dtype)
    assert decode_tensor(only_non_finite, name="x", require_finite=False).shape == (2,)
    assert decode_tensor(encode_tensor(torch.empty(0, 4), dtype), name="x").shape == (0, 4)
    assert decode_tensor(encode_tensor(torch.full((3,), 1e9), dtype), name="x").shape == (3,)  # at the bound: kept
