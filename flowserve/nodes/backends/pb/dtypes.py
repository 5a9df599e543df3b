"""Datatypes as Triton's python backend names them: TRITONSERVER_DataType numbers, config
strings (``TYPE_FP32``), numpy types, and the wire form of BYTES tensors."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from flowserve.core.datatypes import from_config, from_numpy, to_numpy
from flowserve.core.errors import FlowserveError

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType numbers (what Tensor.triton_dtype() returns, as in Triton)
_DTYPE_NUMBERS: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}
_NUMBER_DTYPES: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """A bytes tensor as Triton's wire form: each element's 4-byte little-endian length, then
    its bytes, in C order (``()`` for an empty tensor, None for a non-bytes one)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype == np.object_ or input_tensor.dtype.type == np.bytes_:
        parts: list[bytes] = []
        for item in input_tensor.ravel(order="C").tolist():
            s = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts.append(struct.pack("<I", len(s)))
            parts.append(s)
        return b"".join(parts)
    return None


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of :func:`serialize_byte_tensor`: a 1-D object array of bytes."""
    strs: list[bytes] = []
    offset = 0
    buf = bytes(encoded_tensor)
    while offset < len(buf):
        (length,) = struct.unpack_from("<I", buf, offset)
        offset += 4
        strs.append(buf[offset : offset + length])
        offset += length
    return np.array(strs, dtype=np.object_)


def triton_to_numpy_type(data_type: int) -> Any:
    """numpy type of a TRITONSERVER_DataType number (None for an unknown one)."""
    return _NUMBER_DTYPES.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """TRITONSERVER_DataType number of a numpy type (None for one Triton lacks), as Triton's."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in "OS":
        return 13
    try:
        return _DTYPE_NUMBERS[from_numpy(dtype)]
    except FlowserveError:
        return None


def triton_string_to_numpy(triton_type_string: str) -> Any:
    if triton_type_string in TRITON_STRING_TO_NUMPY:
        return TRITON_STRING_TO_NUMPY[triton_type_string]
    dtype = to_numpy(from_config(triton_type_string))  # TYPE_BF16: ml_dtypes.bfloat16
    return dtype.type
