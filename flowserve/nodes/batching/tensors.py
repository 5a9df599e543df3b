"""Merge the rows of several requests along the batch axis (axis 0) and split them back.

A request's *rows* are the first dimension of its inputs (they must agree). Its *key* is what
must be equal for two requests to share a batch: input names, datatypes and non-batch shapes.
An input that allows ragged batching keys on its name and datatype only; it is merged the way
Triton hands ragged inputs to a model, as the flat concatenation of every request's elements.

Inputs may be DLPack tensors left where a node made them (flowserve/core/device.py): their
rows and keys are read the same way (the key names the device too, so a batch never mixes
devices), a merge concatenates where they are when their framework can (``torch.cat`` on their
device; a copy that any merge of several requests is) and on the host otherwise (``meter``
counts the bytes either way as bytes copied), and a split takes views of the framework's tensor.

:func:`split_rows` gives each request exactly the rows it brought; an output with any other row
count is an :class:`InternalError` naming the node, never a silent mis-split.

Example::

    >>> import numpy as np
    >>> batch = [{"x": np.zeros((2, 3))}, {"x": np.ones((1, 3))}]
    >>> merged = merge_rows(batch)
    >>> merged["x"].shape
    (3, 3)
    >>> [p["x"].shape for p in split_rows(merged, [2, 1], "net")]
    [(2, 3), (1, 3)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from flowserve.core.device import DeviceTensor, concat_on_device, to_host
from flowserve.core.errors import InternalError, InvalidArgument
from flowserve.core.node import TensorMap


class CopyMeter(Protocol):
    """Where a merge counts the bytes it copied (a node's or a model's statistics)."""

    def add_copied(self, nbytes: int) -> None: ...


# per input, sorted by name: (name, datatype, non-batch shape or None when ragged)
Key = tuple[tuple[str, str, tuple[int, ...] | None], ...]

_NO_RAGGED: frozenset[str] = frozenset()

# a request's tensors as a batcher sees them: numpy, or DLPack tensors as they came (read only
# here, so a node's TensorMap is one without a cast on the request path)
Tensors = Mapping[str, np.ndarray | DeviceTensor]


def request_rows(inputs: Tensors, node: str) -> int:
    """The batch size of one request: the first dimension every input shares."""
    if not inputs:
        raise InvalidArgument(f"node '{node}' batches requests by rows, but this one has no inputs")
    rows = -1
    for name, array in inputs.items():
        if not isinstance(array, np.ndarray | DeviceTensor) or array.ndim == 0:
            raise InvalidArgument(
                f"node '{node}' batches along the first dimension, but input '{name}' has none"
            )
        if rows not in (-1, array.shape[0]):
            raise InvalidArgument(
                f"inputs of node '{node}' disagree on the batch size: input '{name}' has "
                f"{array.shape[0]} rows, another input has {rows}"
            )
        rows = array.shape[0]
    return rows


def _datatype(array: np.ndarray | DeviceTensor) -> str:
    # BYTES arrive as object, bytes_ or str_ arrays of any width: one datatype, they concatenate
    if array.dtype.kind in "OSU":
        return "BYTES"
    if isinstance(array, DeviceTensor) and not array.device.is_cpu:
        return f"{array.dtype.str}@{array.device}"  # tensors on a GPU batch only with their device's
    return array.dtype.str


def request_key(inputs: Tensors, ragged: frozenset[str] = _NO_RAGGED) -> Key:
    """What two requests must share to be merged into one batch."""
    return tuple(
        sorted(
            (name, _datatype(a), None if name in ragged else tuple(a.shape[1:])) for name, a in inputs.items()
        )
    )


def merge_rows(
    batch: Sequence[TensorMap], ragged: frozenset[str] = _NO_RAGGED, meter: CopyMeter | None = None
) -> TensorMap:
    """One request's worth of tensors holding every request's rows, in order.

    The requests must have equal keys (the policy guarantees it). Ragged inputs become the flat
    concatenation of their elements. A merge of several requests copies every row once:
    numpy on the host; DLPack tensors of one framework on one device where they are
    (``torch.cat`` on their GPU, ordered after each part's event), else on the host after a
    host copy of each. ``meter.add_copied`` counts every byte those copies moved."""
    if len(batch) == 1 and not ragged:
        return batch[0]
    merged: TensorMap = {}
    copied = 0
    for name in batch[0]:
        values = [request[name] for request in batch]
        if name in ragged:
            values = [v.reshape(-1) for v in values]
        if len(values) == 1:
            merged[name] = values[0]
            continue
        for value in values:
            if type(value) is not np.ndarray:
                joined, moved = _merge_tensors(values)
                break
        else:
            joined = np.concatenate(values)
            moved = int(joined.nbytes)
        merged[name] = joined
        copied += moved
    if meter is not None and copied:
        meter.add_copied(copied)
    return merged


def _merge_tensors(values: list[Any]) -> tuple[Any, int]:
    """Rows of DLPack tensors (maybe with numpy among them) in one tensor, and the bytes copied."""
    if all(isinstance(v, DeviceTensor) for v in values):
        parts: list[DeviceTensor] = values
        joined = concat_on_device(parts)
        if joined is None and _register_concat(parts[0].value):
            joined = concat_on_device(parts)
        if joined is not None:
            return joined, joined.nbytes
    moved = 0
    arrays = []
    for value in values:
        array, n = to_host(value)
        arrays.append(array)
        moved += n
    host = np.concatenate(arrays)
    return host, moved + int(host.nbytes)


def _register_concat(value: object) -> bool:
    """Register a framework's device merge the first time its tensors are merged (torch)."""
    if type(value).__module__.partition(".")[0] != "torch":
        return False
    from flowserve.nodes.backends.cuda import register_torch_concat

    return register_torch_concat()


def split_rows(outputs: TensorMap, rows: Sequence[int], node: str) -> list[TensorMap]:
    """Cut a merged batch's outputs back into one TensorMap per request (views, in order)."""
    if not isinstance(outputs, dict):
        raise InternalError(f"node '{node}' returned {type(outputs).__name__}, expected a dict of tensors")
    total = sum(rows)
    for name, array in outputs.items():
        if _rows_of(array) != total:
            raise InternalError(
                f"node '{node}': output '{name}' has {_rows_text(array)} but the batch merged {total} rows "
                f"from {len(rows)} requests (a batched node must return one output row per input row)"
            )
    if len(rows) == 1:
        return [outputs]
    parts: list[TensorMap] = []
    start = 0
    for count in rows:
        stop = start + count
        parts.append({name: array[start:stop] for name, array in outputs.items()})  # views
        start = stop
    return parts


def check_split(
    results: Sequence[TensorMap | Exception], rows: Sequence[int], node: str
) -> list[TensorMap | Exception]:
    """Verify per-request results (a backend's ``execute_batch``): one per request, its rows each
    (or that request's own error, which fails it alone)."""
    if not isinstance(results, list | tuple) or len(results) != len(rows):
        got = len(results) if isinstance(results, list | tuple) else type(results).__name__
        raise InternalError(f"node '{node}' returned {got} results for a batch of {len(rows)} requests")
    for index, (result, want) in enumerate(zip(results, rows, strict=True)):
        if isinstance(result, Exception):
            continue
        if not isinstance(result, dict):
            raise InternalError(
                f"node '{node}' returned {type(result).__name__} for request {index} of a batch, "
                "expected a dict of tensors"
            )
        for name, array in result.items():
            if _rows_of(array) != want:
                raise InternalError(
                    f"node '{node}': output '{name}' of request {index} in a batch has {_rows_text(array)}, "
                    f"the request has {want}"
                )
    return list(results)


def _rows_of(array: object) -> int | None:
    if isinstance(array, np.ndarray | DeviceTensor) and array.ndim > 0:
        return int(array.shape[0])
    return None


def _rows_text(array: object) -> str:
    rows = _rows_of(array)
    if rows is not None:
        return f"{rows} rows"
    if isinstance(array, np.ndarray):
        return "no batch dimension (a scalar)"
    return f"no rows (a {type(array).__name__}, not an array)"
