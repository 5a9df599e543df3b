"""Raw tensor bytes <-> numpy, shared by every transport (HTTP binary extension, gRPC raw
contents, shared memory). Sizes are checked against the declared shape before anything is
allocated from it, so a request cannot claim more memory than it sent.

BYTES tensors travel as each element's 4-byte little-endian length followed by its bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from flowserve.core.datatypes import to_numpy
from flowserve.core.errors import InvalidArgument
from flowserve.core.limits import (
    DEFAULT_LIMITS,
    Limits,
    check_bytes_element,
    check_shape,
    max_bytes_size,
)

_LEN = struct.Struct("<I")


def element_count(name: str, shape: Sequence[int], limits: Limits = DEFAULT_LIMITS) -> int:
    """The element count of a checked shape (see :func:`flowserve.core.limits.check_shape`)."""
    return check_shape(name, shape, limits)


def from_raw(
    name: str,
    datatype: str,
    shape: Sequence[int],
    data: bytes | bytearray | memoryview,
    limits: Limits = DEFAULT_LIMITS,
) -> np.ndarray:
    """Decode ``data`` as a tensor of ``datatype`` and ``shape`` (zero-copy for fixed types)."""
    count = check_shape(name, shape, limits)
    if datatype == "BYTES":
        return _bytes_from_raw(name, count, shape, data, limits)
    dtype = to_numpy(datatype)
    expected = count * dtype.itemsize
    if len(data) != expected:
        raise InvalidArgument(
            f"input '{name}': got {len(data)} bytes of data, but shape {list(shape)} of "
            f"{datatype} needs {expected}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(tuple(shape))


def check_shm_size(
    name: str, datatype: str, shape: Sequence[int], byte_size: int, limits: Limits = DEFAULT_LIMITS
) -> None:
    """Before a tensor is copied out of shared memory: its shape is sane and within ``limits``,
    and ``byte_size`` is what the shape needs (BYTES: no more than its elements can take)."""
    count = check_shape(name, shape, limits)
    if datatype == "BYTES":
        most = max_bytes_size(count, limits)
        if byte_size > most:
            raise InvalidArgument(
                f"input '{name}': shared_memory_byte_size {byte_size} is more than {count} BYTES "
                f"elements can take ({most})"
            )
        return
    expected = count * to_numpy(datatype).itemsize
    if byte_size != expected:
        raise InvalidArgument(
            f"input '{name}': got {byte_size} bytes of shared memory (shared_memory_byte_size), but "
            f"shape {list(shape)} of {datatype} needs {expected}"
        )


def _bytes_from_raw(
    name: str, count: int, shape: Sequence[int], data: bytes | bytearray | memoryview, limits: Limits
) -> np.ndarray:
    view = memoryview(data)
    size = len(view)
    items: list[bytes] = []
    offset = 0
    max_element = limits.max_bytes_element
    while offset < size:
        if offset + 4 > size:
            raise InvalidArgument(f"input '{name}': BYTES data ends inside a 4-byte length prefix")
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        if length > max_element:
            check_bytes_element(name, len(items), length, limits)
        if offset + length > size:
            raise InvalidArgument(
                f"input '{name}': BYTES element {len(items)} claims {length} bytes but only "
                f"{size - offset} remain"
            )
        items.append(bytes(view[offset : offset + length]))
        offset += length
        if len(items) > count:
            break
    if len(items) != count:
        raise InvalidArgument(
            f"input '{name}': shape {list(shape)} needs {count} BYTES elements, data holds "
            f"{len(items)}{' or more' if len(items) > count else ''}"
        )
    array = np.empty(count, dtype=np.object_)
    array[:] = items
    return array.reshape(tuple(shape))


def to_raw(array: np.ndarray) -> bytes:
    """Encode a tensor as raw little-endian row-major bytes (BYTES: length-prefixed)."""
    if array.dtype.kind in "OSU":
        parts = []
        for item in array.reshape(-1):
            b = as_bytes(item)
            parts.append(_LEN.pack(len(b)))
            parts.append(b)
        return b"".join(parts)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).tobytes()


def raw_size(array: np.ndarray) -> int:
    if array.dtype.kind in "OSU":
        return sum(4 + len(as_bytes(x)) for x in array.reshape(-1))
    return int(array.nbytes)


def as_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    if isinstance(item, bytearray | memoryview):
        return bytes(item)
    if isinstance(item, np.bytes_):
        return bytes(item)
    return str(item).encode()


def from_list(
    name: str, datatype: str, shape: Sequence[int], data: Any, limits: Limits = DEFAULT_LIMITS
) -> np.ndarray:
    """A tensor from JSON-style data (flat or nested lists) or typed protobuf contents."""
    count = check_shape(name, shape, limits)
    if datatype == "BYTES":
        flat = _flatten(data)
        if len(flat) != count:
            raise InvalidArgument(
                f"input '{name}': shape {list(shape)} needs {count} elements, got {len(flat)}"
            )
        items = [as_bytes(x) for x in flat]
        max_element = limits.max_bytes_element
        for index, item in enumerate(items):
            if len(item) > max_element:
                check_bytes_element(name, index, len(item), limits)
        array = np.empty(count, dtype=np.object_)
        array[:] = items
        return array.reshape(tuple(shape))
    dtype = to_numpy(datatype)
    try:
        # a value out of the type's range (1e300 as FP16) is refused, not turned into inf
        with np.errstate(over="raise", invalid="raise"):
            array = np.asarray(data, dtype=dtype)
    except (ValueError, TypeError, OverflowError, FloatingPointError) as exc:
        raise InvalidArgument(f"input '{name}': data does not fit {datatype}: {exc}") from None
    if array.size != count:
        raise InvalidArgument(f"input '{name}': shape {list(shape)} needs {count} elements, got {array.size}")
    return array.reshape(tuple(shape))


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list | tuple):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list | tuple):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out
