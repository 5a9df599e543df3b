"""Triton datatype names <-> numpy dtypes.

Wire names are Triton's (``FP32``, ``BYTES``, ...); config names add ``TYPE_`` and call BYTES
``STRING``. BYTES tensors are numpy ``object`` arrays of ``bytes``; BF16 uses ``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from flowserve.core.errors import InvalidArgument

_BY_NAME: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "BYTES": np.dtype(np.object_),
}
_BY_DTYPE: dict[np.dtype[np.generic], str] = {v: k for k, v in _BY_NAME.items()}
_BY_DTYPE[np.dtype("S")] = "BYTES"
_BY_DTYPE[np.dtype("U")] = "BYTES"

DATATYPES: frozenset[str] = frozenset(_BY_NAME)


def to_numpy(datatype: str) -> np.dtype[np.generic]:
    """numpy dtype for a wire datatype name; InvalidArgument for an unknown one."""
    try:
        return _BY_NAME[datatype]
    except KeyError:
        raise InvalidArgument(f"unknown datatype '{datatype}'") from None


def from_numpy(dtype: np.dtype[np.generic]) -> str:
    """Wire datatype name of a numpy dtype (bytes/str arrays are BYTES)."""
    name = _BY_DTYPE.get(dtype)
    if name is None:
        if dtype.kind in "SUO":
            return "BYTES"
        raise InvalidArgument(f"numpy dtype '{dtype}' has no Triton datatype")
    return name


def from_config(data_type: str) -> str:
    """Wire name from a config name: ``TYPE_FP32`` -> ``FP32``, ``TYPE_STRING`` -> ``BYTES``."""
    name = data_type.removeprefix("TYPE_")
    if name == "STRING":
        return "BYTES"
    if name not in _BY_NAME:
        raise InvalidArgument(f"unknown data_type '{data_type}'")
    return name


def to_config(datatype: str) -> str:
    """Config name from a wire name: ``FP32`` -> ``TYPE_FP32``, ``BYTES`` -> ``TYPE_STRING``."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def element_size(datatype: str) -> int:
    """Bytes per element for fixed-size types; 0 for BYTES."""
    return 0 if datatype == "BYTES" else _BY_NAME[datatype].itemsize
