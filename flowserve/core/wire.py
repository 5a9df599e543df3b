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
# a binary body (a memoryview) whose BYTES elements are this small on average is copied to
# bytes once, so that each element is one slice of it rather than a view and then a copy
COPY_BELOW = 256


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
    buf: bytes | memoryview = data if isinstance(data, bytes) else memoryview(data)
    if isinstance(buf, memoryview) and len(buf) < count * COPY_BELOW:
        buf = bytes(buf)  # many small elements: one copy, then each is a slice of it
    items = _uniform_items(name, count, buf, limits)
    if items is None:
        items = _split_items(name, count, shape, buf, limits)
    return _object_array(items, shape)


def _uniform_items(name: str, count: int, buf: bytes | memoryview, limits: Limits) -> list[bytes] | None:
    """The elements when all have the length of the first (fixed-size strings, a million empty
    ones), checked and cut out by numpy without a Python step per element; None if not."""
    size = len(buf)
    if count < 2 or size < 4:
        return None
    (length,) = _LEN.unpack_from(buf, 0)
    if size != count * (4 + length):
        return None
    if length > limits.max_bytes_element:
        check_bytes_element(name, 0, length, limits)
    prefixes = np.ndarray((count,), "<u4", buf, 0, (4 + length,))
    if not (prefixes == length).all():
        return None
    if length == 0:
        return [b""] * count
    # "V<n>" elements come back from tolist() as bytes, NUL bytes and all
    items: list[bytes] = np.ndarray((count,), f"V{length}", buf, 4, (4 + length,)).tolist()
    return items


def _split_items(
    name: str, count: int, shape: Sequence[int], buf: bytes | memoryview, limits: Limits
) -> list[bytes]:
    """The elements of length-prefixed ``buf``, one tight step each (where an element starts
    depends on every length before it, so this part cannot be vectorised)."""
    size = len(buf)
    max_element = limits.max_bytes_element
    unpack = _LEN.unpack_from
    items: list[Any] = []
    append = items.append
    offset = 0
    try:
        for index in range(count):
            (length,) = unpack(buf, offset)
            start = offset + 4
            offset = start + length
            if offset > size or length > max_element:
                check_bytes_element(name, index, length, limits)
                raise InvalidArgument(
                    f"input '{name}': BYTES element {index} claims {length} bytes but only "
                    f"{size - start} remain"
                )
            append(buf[start:offset])
    except struct.error:  # fewer than 4 bytes left at ``offset``
        if offset < size:
            raise InvalidArgument(f"input '{name}': BYTES data ends inside a 4-byte length prefix") from None
        raise InvalidArgument(
            f"input '{name}': shape {list(shape)} needs {count} BYTES elements, data holds {len(items)}"
        ) from None
    if offset != size:
        _trailing(name, count, shape, buf, offset, limits)
    if isinstance(buf, memoryview):  # few large elements: each is copied out of its view
        return [bytes(item) for item in items]
    return items


def _trailing(
    name: str, count: int, shape: Sequence[int], buf: bytes | memoryview, offset: int, limits: Limits
) -> None:
    """Raise for the data past the ``count`` elements a shape needs (what is wrong with the
    next element, if anything, else that there is one)."""
    size = len(buf)
    if size - offset < 4:
        raise InvalidArgument(f"input '{name}': BYTES data ends inside a 4-byte length prefix")
    (length,) = _LEN.unpack_from(buf, offset)
    check_bytes_element(name, count, length, limits)
    if offset + 4 + length > size:
        raise InvalidArgument(
            f"input '{name}': BYTES element {count} claims {length} bytes but only {size - offset - 4} remain"
        )
    raise InvalidArgument(
        f"input '{name}': shape {list(shape)} needs {count} BYTES elements, data holds {count + 1} or more"
    )


def _object_array(items: list[bytes], shape: Sequence[int]) -> np.ndarray:
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array.reshape(tuple(shape))


def to_raw(array: np.ndarray) -> bytes:
    """Encode a tensor as raw little-endian row-major bytes (BYTES: length-prefixed)."""
    if array.dtype.kind in "OSU":
        return _bytes_to_raw(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).tobytes()


def raw_view(array: np.ndarray) -> bytes | memoryview:
    """What :func:`to_raw` gives, as a view of the array's own memory where its bytes already
    are the wire's (fixed-size, little-endian, C-contiguous), else of one little-endian
    C-ordered copy (``to_raw`` makes two there: the array, then its ``bytes``; BYTES tensors:
    ``to_raw``'s encoding)."""
    if array.dtype.kind in "OSU":
        return to_raw(array)
    if array.dtype.byteorder == ">" or not array.flags.c_contiguous:
        array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return array.reshape(-1).view(np.uint8).data if array.size else b""


def _bytes_to_raw(array: np.ndarray) -> bytes:
    """Length-prefixed elements, with no Python step per element for many small ones: the
    prefixes are made and placed by numpy around the joined elements."""
    items = _bytes_items(array.reshape(-1).tolist())
    count = len(items)
    if not count:
        return b""
    lengths = np.fromiter(map(len, items), np.int64, count)
    if int(lengths.sum()) > count * LARGE_ELEMENTS:  # few large elements: a step each is nothing
        return b"".join([part for item in items for part in (_LEN.pack(len(item)), item)])
    first = int(lengths[0])
    if (lengths == first).all():
        return _uniform_raw(items, first)
    chunks = range(0, count, ENCODE_CHUNK)
    return b"".join(_packed(items[i : i + ENCODE_CHUNK], lengths[i : i + ENCODE_CHUNK]) for i in chunks)


# BYTES outputs: elements this long on average are encoded one step each; shorter ones by numpy,
# this many at a time (its index arrays take 32 bytes per element)
LARGE_ELEMENTS = 64
ENCODE_CHUNK = 1 << 16


def _uniform_raw(items: list[bytes], length: int) -> bytes:
    """Elements of one ``length``: rows of prefix and element."""
    out = np.empty((len(items), 4 + length), np.uint8)
    out[:, :4] = np.array([length], "<u4").view(np.uint8)
    if length:  # "S<n>" keeps each element's n bytes as they are (NUL bytes too)
        out[:, 4:] = np.array(items, f"S{length}").view(np.uint8).reshape(len(items), length)
    return out.tobytes()


def _packed(items: list[bytes], lengths: np.ndarray) -> bytes:
    """Elements of any lengths: each prefix put at its place, the joined elements around them."""
    body = np.frombuffer(b"".join(items), np.uint8)
    starts = np.zeros(len(items), np.int64)
    np.cumsum(lengths[:-1] + 4, out=starts[1:])
    prefix = (starts[:, None] + np.arange(4)).reshape(-1)
    out = np.empty(body.size + 4 * len(items), np.uint8)
    out[prefix] = lengths.astype("<u4").view(np.uint8)
    data = np.ones(out.size, bool)
    data[prefix] = False
    out[data] = body
    return out.tobytes()


def _bytes_items(items: list[Any]) -> list[bytes]:
    """BYTES elements as bytes (str is UTF-8); the list itself when they are all bytes."""
    if set(map(type, items)) <= {bytes}:
        return items
    return [as_bytes(item) for item in items]


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
        # typed contents (gRPC bytes_contents) are a flat list of bytes: taken as they are
        flat = data if isinstance(data, list) and set(map(type, data)) <= {bytes} else _flatten(data)
        if len(flat) != count:
            raise InvalidArgument(
                f"input '{name}': shape {list(shape)} needs {count} elements, got {len(flat)}"
            )
        items = flat if flat is data else [as_bytes(x) for x in flat]
        max_element = limits.max_bytes_element
        if count and max(map(len, items)) > max_element:
            for index, item in enumerate(items):
                check_bytes_element(name, index, len(item), limits)
        return _object_array(items, shape)
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
