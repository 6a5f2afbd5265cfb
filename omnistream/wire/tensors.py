"""Tensors on the wire: raw little-endian bytes + dtype + shape, validated before use.

Stages exchange hidden states, codec frames and audio as `omni.v1.Tensor`. Decoding never unpickles
and never trusts the header: a peer that lies about dtype, shape or length gets `InvalidRequest`
(INVALID_ARGUMENT) instead of a crash or an out-of-bounds view.

torch is imported only where a torch tensor is made or read: the gateway handles numpy arrays
alone and never loads torch.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

from omnistream.request.errors import InvalidRequest
from omnistream.wire.protogen import ensure_generated

ensure_generated()

from omnistream.proto.omni.v1 import common_pb2  # noqa: E402  (generated just above)

if TYPE_CHECKING:
    import torch

    from omnistream.proto.omni.v1.common_pb2 import Tensor

# Wire dtype name -> little-endian numpy dtype of the raw bytes. bfloat16 has no numpy type, so its
# bytes travel as int16 and are reinterpreted by torch.
_DTYPES: dict[str, np.dtype[Any]] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "bfloat16": np.dtype("<i2"),
    "float16": np.dtype("<f2"),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("?"),
}


@functools.cache
def _torch_dtypes() -> dict[str, torch.dtype]:
    """Wire dtype name -> torch dtype (first asked for by a process that uses torch anyway)."""
    import torch

    return {name: getattr(torch, name) for name in _DTYPES}


@functools.cache
def _names_by_torch_dtype() -> dict[torch.dtype, str]:
    return {dtype: name for name, dtype in _torch_dtypes().items()}


def _is_torch_tensor(t: object) -> TypeGuard[torch.Tensor]:
    torch = sys.modules.get("torch")  # a torch tensor exists only where torch is already loaded
    return torch is not None and isinstance(t, torch.Tensor)


_NAME_BY_NUMPY_KIND = {
    ("f", 4): "float32",
    ("f", 8): "float64",
    ("f", 2): "float16",
    ("i", 8): "int64",
    ("i", 4): "int32",
    ("i", 2): "int16",
    ("u", 1): "uint8",
    ("b", 1): "bool",
}

SUPPORTED_DTYPES: frozenset[str] = frozenset(_DTYPES)
# numpy refuses more dimensions than this; checking first gives a clear error instead of its own.
MAX_NDIM = 32


def to_proto(t: torch.Tensor | np.ndarray) -> Tensor:
    """Encode a CPU/GPU torch tensor or numpy array; copies only when layout or byte order demand.

    Unsupported dtypes raise TypeError: producing one is a bug in this process, not bad input.
    """
    return fill_tensor(common_pb2.Tensor(), t)


def fill_tensor(target: Tensor, t: torch.Tensor | np.ndarray) -> Tensor:
    """`to_proto` written into `target` (a field of the message that will be sent): a message
    given to another's constructor or CopyFrom is copied whole, so a large part (a turn's audio,
    a video's frames) built apart costs one copy per level it is nested in."""
    if _is_torch_tensor(t):
        name = _names_by_torch_dtype().get(t.dtype)
        if name is None:
            raise TypeError(f"cannot send torch dtype {t.dtype}; supported: {sorted(SUPPORTED_DTYPES)}")
        cpu = t.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
        if name == "bfloat16":
            cpu = cpu.view(_torch_dtypes()["int16"])
        array = cpu.numpy()
        shape = tuple(t.shape)
    elif isinstance(t, np.ndarray):
        name = _NAME_BY_NUMPY_KIND.get((t.dtype.kind, t.dtype.itemsize))
        if name is None:
            raise TypeError(f"cannot send numpy dtype {t.dtype}; supported: {sorted(SUPPORTED_DTYPES)}")
        array, shape = t, t.shape
    else:
        raise TypeError(f"expected torch.Tensor or numpy.ndarray, got {type(t).__name__}")
    wire = _DTYPES[name]
    target.dtype = name
    del target.shape[:]
    target.shape.extend(shape)
    target.data = np.ascontiguousarray(array).astype(wire, copy=False).tobytes()
    return target


def numpy_from_proto(
    msg: Tensor,
    *,
    max_elements: int | None = None,
    field: str = "tensor",
    expect_dtype: str | Collection[str] | None = None,
    copy: bool = False,
) -> np.ndarray:
    """Decode to numpy. Zero-copy and read-only unless `copy=True` (the bytes belong to the message).

    bfloat16 has no numpy dtype and is widened to float32, which is exact.
    """
    name, shape = _validate(msg, max_elements=max_elements, field=field, expect_dtype=expect_dtype)
    raw = np.frombuffer(msg.data, dtype=_DTYPES[name]).reshape(shape)
    if name == "bfloat16":
        # bfloat16 is the top half of a float32: shift the bits into place.
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
    if not raw.dtype.isnative or copy:
        return raw.astype(raw.dtype.newbyteorder("="), copy=True)
    return raw


def from_proto(
    msg: Tensor,
    *,
    max_elements: int | None = None,
    field: str = "tensor",
    expect_dtype: str | Collection[str] | None = None,
) -> torch.Tensor:
    """Decode to a writable CPU torch tensor (one copy of the payload, then a zero-copy view)."""
    import torch

    name, shape = _validate(msg, max_elements=max_elements, field=field, expect_dtype=expect_dtype)
    torch_dtype, wire = _torch_dtypes()[name], _DTYPES[name]
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=torch_dtype)
    array = np.frombuffer(bytearray(msg.data), dtype=wire)
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    out = torch.from_numpy(array).reshape(shape)
    if name == "bfloat16":
        out = out.view(torch.bfloat16)
    return out


def _validate(
    msg: Tensor,
    *,
    max_elements: int | None,
    field: str,
    expect_dtype: str | Collection[str] | None,
) -> tuple[str, tuple[int, ...]]:
    name = msg.dtype
    if name not in _DTYPES:
        raise InvalidRequest(
            f"{field}: unknown dtype {name!r}; expected one of {sorted(SUPPORTED_DTYPES)}", field=field
        )
    if expect_dtype is not None:
        allowed = {expect_dtype} if isinstance(expect_dtype, str) else set(expect_dtype)
        if name not in allowed:
            raise InvalidRequest(
                f"{field}: dtype {name} not allowed here; expected {sorted(allowed)}", field=field
            )
    shape = tuple(msg.shape)
    if len(shape) > MAX_NDIM:
        raise InvalidRequest(
            f"{field}: {len(shape)} dimensions exceeds the maximum of {MAX_NDIM}", field=field
        )
    if any(d < 0 for d in shape):
        raise InvalidRequest(f"{field}: negative dimension in shape {list(shape)}", field=field)
    count = math.prod(shape)
    if max_elements is not None and count > max_elements:
        raise InvalidRequest(
            f"{field}: shape {list(shape)} has {count} elements, more than the limit of {max_elements}",
            field=field,
        )
    expected = count * _DTYPES[name].itemsize
    if len(msg.data) != expected:
        raise InvalidRequest(
            f"{field}: {len(msg.data)} data bytes but shape {list(shape)} of {name} needs {expected}",
            field=field,
        )
    if name == "bool" and expected and np.frombuffer(msg.data, dtype=np.uint8).max() > 1:
        # Any other byte would be an invalid bool in numpy and torch (undefined behaviour downstream).
        raise InvalidRequest(f"{field}: bool tensor contains bytes other than 0 and 1", field=field)
    return name, shape
