from __future__ import annotations

import numpy as np
import pytest
import torch

from omnistream.proto.omni.v1 import common_pb2, stage_pb2
from omnistream.request.errors import InvalidRequest
from omnistream.wire.tensors import SUPPORTED_DTYPES, fill_tensor, from_proto, numpy_from_proto, to_proto

TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(0, 100, shape, dtype=dtype)


def test_dtype_table_matches_contract() -> None:
    assert set(TORCH_DTYPES) == SUPPORTED_DTYPES


@pytest.mark.parametrize("name", sorted(TORCH_DTYPES))
@pytest.mark.parametrize("shape", [(3, 5), (2, 0, 4), (), (7,)])
def test_torch_round_trip(name: str, shape: tuple[int, ...]) -> None:
    t = _sample(TORCH_DTYPES[name], shape)
    msg = to_proto(t)
    assert msg.dtype == name
    assert list(msg.shape) == list(shape)
    assert len(msg.data) == t.numel() * t.element_size()
    back = from_proto(msg)
    assert back.dtype == t.dtype and back.shape == t.shape
    assert torch.equal(back, t)


def test_wire_bytes_are_little_endian_row_major() -> None:
    msg = to_proto(torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
    assert msg.data == np.array([1, 2, 3, 4], dtype="<i4").tobytes()


def test_bfloat16_bytes_are_raw_bits() -> None:
    t = torch.tensor([1.0, -2.5], dtype=torch.bfloat16)
    msg = to_proto(t)
    assert msg.data == t.view(torch.int16).numpy().astype("<i2").tobytes()
    np.testing.assert_array_equal(numpy_from_proto(msg), np.array([1.0, -2.5], dtype=np.float32))


def test_non_contiguous_and_grad_tensors() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base.t()[1::2]
    assert not view.is_contiguous()
    assert torch.equal(from_proto(to_proto(view)), view)
    leaf = torch.ones(3, requires_grad=True)
    assert torch.equal(from_proto(to_proto(leaf * 2)), torch.full((3,), 2.0))


def test_numpy_round_trip_including_big_endian_and_strided() -> None:
    a = np.arange(12, dtype=">i8").reshape(3, 4)[:, ::2]
    msg = to_proto(a)
    assert msg.dtype == "int64"
    out = numpy_from_proto(msg)
    np.testing.assert_array_equal(out, a)
    assert out.dtype.isnative
    assert torch.equal(from_proto(msg), torch.from_numpy(np.ascontiguousarray(a.astype("<i8"))))


def test_numpy_view_is_zero_copy_read_only_unless_copied() -> None:
    msg = to_proto(np.arange(4, dtype=np.float32))
    view = numpy_from_proto(msg)
    assert not view.flags.writeable
    owned = numpy_from_proto(msg, copy=True)
    owned[0] = 42.0
    assert numpy_from_proto(msg)[0] == 0.0


def test_torch_result_is_writable_and_independent_of_message() -> None:
    msg = to_proto(torch.zeros(3))
    t = from_proto(msg)
    t += 1
    assert torch.equal(from_proto(msg), torch.zeros(3))


def test_codes_shape_like_the_talker_sends() -> None:
    codes = torch.randint(0, 2048, (16, 5), dtype=torch.int64)
    back = from_proto(to_proto(codes), expect_dtype="int64", max_elements=16 * 5)
    assert torch.equal(back, codes)


@pytest.mark.parametrize(
    ("msg", "needle"),
    [
        (common_pb2.Tensor(dtype="complex64", shape=[1], data=b"\0" * 8), "unknown dtype 'complex64'"),
        (common_pb2.Tensor(dtype="", shape=[], data=b""), "unknown dtype ''"),
        (common_pb2.Tensor(dtype="float32", shape=[2, 2], data=b"\0" * 12), "12 data bytes"),
        (common_pb2.Tensor(dtype="float32", shape=[2], data=b"\0" * 12), "needs 8"),
        (common_pb2.Tensor(dtype="int64", shape=[-1, 2], data=b""), "negative dimension"),
        (common_pb2.Tensor(dtype="uint8", shape=[1] * 40, data=b"\0"), "dimensions"),
        (common_pb2.Tensor(dtype="bool", shape=[2], data=b"\x01\x02"), "other than 0 and 1"),
    ],
)
def test_malformed_messages_are_invalid_requests(msg: common_pb2.Tensor, needle: str) -> None:
    with pytest.raises(InvalidRequest, match=needle):
        from_proto(msg)
    with pytest.raises(InvalidRequest, match=needle):
        numpy_from_proto(msg)


def test_max_elements_is_enforced_before_touching_data() -> None:
    # A huge claimed shape with no data must fail on the limit, not on allocation.
    msg = common_pb2.Tensor(dtype="float32", shape=[1 << 20, 1 << 20], data=b"")
    with pytest.raises(InvalidRequest, match="more than the limit of 1000"):
        from_proto(msg, max_elements=1000)
    ok = to_proto(torch.zeros(10, 100))
    assert from_proto(ok, max_elements=1000).shape == (10, 100)
    with pytest.raises(InvalidRequest, match="1000 elements"):
        from_proto(ok, max_elements=999)


def test_error_names_the_field_and_expected_dtype() -> None:
    with pytest.raises(InvalidRequest, match="codes: dtype float32 not allowed") as info:
        from_proto(to_proto(torch.zeros(2)), field="codes", expect_dtype={"int64"})
    assert info.value.field == "codes"


def test_unsupported_source_dtypes_are_type_errors() -> None:
    with pytest.raises(TypeError, match="complex64"):
        to_proto(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(TypeError, match="uint32"):
        to_proto(np.zeros(2, dtype=np.uint32))
    with pytest.raises(TypeError, match="list"):
        to_proto([1, 2, 3])  # type: ignore[arg-type]


def test_a_tensor_filled_into_a_message_field_is_to_protos_and_replaces_what_was_there() -> None:
    chunk = stage_pb2.ThinkerChunk()
    fill_tensor(chunk.prompt_hidden, torch.ones(9, 4))
    hidden = torch.randn(3, 5)
    assert fill_tensor(chunk.prompt_hidden, hidden) is chunk.prompt_hidden
    assert chunk.prompt_hidden == to_proto(hidden)
    assert torch.equal(from_proto(chunk.prompt_hidden), hidden)
