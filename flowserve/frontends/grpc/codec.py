"""ModelInferRequest <-> InferRequest and InferResponse -> ModelInferResponse.

The hot path: raw input contents become numpy arrays with ``np.frombuffer`` (no copy) and
outputs become ``raw_output_contents`` with one ``tobytes``; typed ``contents``, shared memory
and parameters are handled off to the side, only when a request carries them.

Raw contents are matched to inputs in order, skipping inputs that carry typed contents or
name a shared memory region (what tritonclient sends). A request may not mix raw and typed
contents, as in Triton.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from flowserve.core.datatypes import DATATYPES, from_numpy
from flowserve.core.device import tensor_map
from flowserve.core.errors import InvalidArgument
from flowserve.core.limits import DEFAULT_LIMITS, MAX_RANK, Limits, check_bytes_elements, check_shape
from flowserve.core.node import TensorMap
from flowserve.core.types import InferRequest, InferResponse, RequestedOutput
from flowserve.core.wire import from_list, from_raw, raw_view, to_raw
from flowserve.dataplane.shm import SharedMemoryRegistry
from flowserve.frontends.grpc.h2.calls import Piece, Scattered
from flowserve.frontends.grpc.h2.limits import PARSE_INLINE

# Which typed-contents field carries each datatype (FP16 and BF16 travel only as raw bytes).
TYPED_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

SHM_REGION = "shared_memory_region"
SHM_OFFSET = "shared_memory_offset"
SHM_BYTE_SIZE = "shared_memory_byte_size"
CLASSIFICATION = "classification"

_INT64_MAX = 2**63 - 1

# (region, offset, byte_size) of an output the client wants written to shared memory
ShmTarget = tuple[str, int, int]


# ------------------------------------------------------------------ parameters


def param_value(param: Any) -> Any:
    """The Python value of an InferParameter / ModelRepositoryParameter / log setting (its
    oneof ``parameter_choice``); None when nothing is set."""
    which = param.WhichOneof("parameter_choice")
    return None if which is None else getattr(param, which)


def params_to_dict(params: Any) -> dict[str, Any]:
    return {key: param_value(value) for key, value in params.items()}


def set_param(param: Any, value: Any) -> None:
    """Fill an InferParameter from a Python value."""
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        if value > _INT64_MAX:
            param.uint64_param = value
        else:
            param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = value if isinstance(value, str) else str(value)


# ------------------------------------------------------------------ request

# raw_input_contents on the wire: field number and wire type 2 (length-delimited)
_RAW_IN_TAG = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number << 3 | 2
SPLIT_FROM = 64 * 1024  # request messages of at least this many bytes: raw contents not copied
_SPLIT_FIELDS = 4096  # top-level fields walked at most (past it: protobuf parses it all)
_FIXED_WIRE = {1: 8, 5: 4}  # wire type -> bytes (64-bit, 32-bit)


class ViewRequest:
    """A ModelInferRequest whose ``raw_input_contents`` are read-only views of the message it
    was parsed from (the rest is a real message: every other attribute is its). Why: upb copies
    each bytes field into its arena, then again into a ``bytes`` when it is read, two copies of
    a 16 MiB tensor that ``np.frombuffer`` can do without."""

    __slots__ = ("head", "raw_input_contents")

    def __init__(self, head: Any, raws: list[memoryview]) -> None:
        self.head = head
        self.raw_input_contents = raws

    def __getattr__(self, name: str) -> Any:
        return getattr(self.head, name)


def _byte_view(data: bytes | memoryview) -> memoryview:
    """``data`` as a view of bytes (a memoryview of another format cast to one of bytes)."""
    return memoryview(data).cast("B") if isinstance(data, memoryview) else memoryview(data)


def parse_request(data: bytes | memoryview) -> Any:
    """A ModelInferRequest from its serialized bytes: a :class:`ViewRequest` when it is large
    and its top-level fields are few (what is not raw contents, joined, is parsed by protobuf),
    else protobuf's own message."""
    if len(data) >= SPLIT_FROM:
        split = _split_raw(_byte_view(data))
        if split is not None:
            head, raws = split
            return ViewRequest(pb.ModelInferRequest.FromString(head), raws)
    return pb.ModelInferRequest.FromString(data)


def parses_quickly(data: bytes | memoryview, most: int = PARSE_INLINE) -> bool:
    """Whether :func:`parse_request` parses ``data`` about as fast as ``most`` bytes, whatever
    its size: it is small, or its raw contents are taken as views and what protobuf parses (the
    rest) is at most ``most`` bytes. The native transport then parses it on the loop instead
    of in a thread (a hop measured at 0.2 ms of server CPU for a 1 MiB request, 1 ms at 16 MiB)."""
    if len(data) <= most:
        return True
    split = _split_raw(_byte_view(data))
    return split is not None and len(split[0]) <= most


def _split_raw(view: memoryview) -> tuple[bytes, list[memoryview]] | None:
    """The message without its raw_input_contents entries, and those entries as read-only views
    of ``view``, in order; None when it has too many top-level fields or is malformed (protobuf
    then parses it, and says what is wrong)."""
    end = len(view)
    pos = start = 0
    heads: list[memoryview] = []
    raws: list[memoryview] = []
    fields = 0
    try:
        while pos < end:
            fields += 1
            if fields > _SPLIT_FIELDS:
                return None
            tag, after = read_varint(view, pos)
            wire = tag & 7
            if wire == 2:
                length, body = read_varint(view, after)
                stop = body + length
            elif wire == 0:
                stop = read_varint(view, after)[1]
            elif wire in _FIXED_WIRE:
                stop = after + _FIXED_WIRE[wire]
            else:
                return None
            if stop > end:
                return None
            if tag == _RAW_IN_TAG:
                heads.append(view[start:pos])
                raws.append(view[body:stop].toreadonly())
                start = stop
            pos = stop
    except IndexError:
        return None
    if not raws:
        return None
    heads.append(view[start:end])
    return b"".join(heads), raws


def read_varint(view: bytes | memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it (IndexError past the end)."""
    value = shift = 0
    while True:
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def decode_request(msg: Any, shm: SharedMemoryRegistry, limits: Limits = DEFAULT_LIMITS) -> InferRequest:
    """A transport-neutral request from a ModelInferRequest; InvalidArgument (naming the
    tensor) for anything malformed, ResourceExhausted for anything over ``limits``. The caller
    adds the model's name to decode errors."""
    raw = msg.raw_input_contents
    n_raw = len(raw)
    used = 0
    inputs: TensorMap = {}
    bytes_elements = 0
    for tensor in msg.inputs:
        name = tensor.name
        if name in inputs:
            raise InvalidArgument(f"input '{name}' is given more than once")
        datatype = tensor.datatype
        if datatype not in DATATYPES:
            raise InvalidArgument(f"input '{name}': unknown datatype '{datatype}'")
        if datatype == "BYTES":
            bytes_elements += check_shape(name, tensor.shape, limits)
            check_bytes_elements(msg.model_name, name, bytes_elements, limits)
        if tensor.parameters and SHM_REGION in tensor.parameters:
            inputs[name] = _from_shm(tensor, shm, limits)
        elif tensor.HasField("contents"):
            if n_raw:
                raise InvalidArgument(
                    f"input '{name}': typed 'contents' must not be given when the request "
                    "carries raw_input_contents (use one or the other for all inputs)"
                )
            inputs[name] = _from_typed(name, datatype, tensor.shape, tensor.contents, limits)
        elif used < n_raw:
            inputs[name] = from_raw(name, datatype, tensor.shape, raw[used], limits)
            used += 1
        else:
            raise InvalidArgument(
                f"input '{name}' has no data: give it raw_input_contents, typed contents or a "
                "shared memory region"
            )
    if used != n_raw:
        raise InvalidArgument(
            f"request carries {n_raw} raw_input_contents but only {used} inputs take raw data"
        )
    request = InferRequest(msg.model_name, inputs, msg.model_version, msg.id)
    if msg.parameters:
        request.parameters = params_to_dict(msg.parameters)
    if msg.outputs:
        request.outputs = [_requested(o) for o in msg.outputs]
    return request


def one_by_one(msg: Any) -> int:
    """The elements of a ModelInferRequest decoded one by one (BYTES inputs, typed contents),
    by their declared shapes (absurd ones count nothing: decoding refuses them)."""
    total = 0
    for tensor in msg.inputs:
        if tensor.datatype == "BYTES" or tensor.HasField("contents"):
            shape = tensor.shape
            if len(shape) <= MAX_RANK:
                total += math.prod(shape)
    return total


def encoded_one_by_one(response: InferResponse) -> int:
    """The elements of a response encoded one by one (BYTES outputs)."""
    return sum(math.prod(a.shape) for a in response.outputs.values() if a.dtype.kind in "OSU")


def _requested(out: Any) -> RequestedOutput:
    if not out.parameters or CLASSIFICATION not in out.parameters:
        return RequestedOutput(out.name)
    count = param_value(out.parameters[CLASSIFICATION])
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise InvalidArgument(
            f"output '{out.name}': 'classification' must be a non-negative integer, got {count!r}"
        )
    return RequestedOutput(out.name, count)


def _from_typed(name: str, datatype: str, shape: Any, contents: Any, limits: Limits) -> np.ndarray:
    wanted = TYPED_FIELD.get(datatype)
    if wanted is None:
        raise InvalidArgument(
            f"input '{name}': {datatype} has no typed contents field; send it as raw_input_contents"
        )
    for field, _ in contents.ListFields():
        if field.name != wanted:
            raise InvalidArgument(
                f"input '{name}': a {datatype} tensor takes its data in '{wanted}', got '{field.name}'"
            )
    count = check_shape(name, shape, limits)
    values = getattr(contents, wanted)
    if len(values) != count:
        raise InvalidArgument(
            f"input '{name}': shape {list(shape)} needs {count} elements, '{wanted}' holds {len(values)}"
        )
    return from_list(name, datatype, list(shape), list(values), limits)


def _shm_param(tensor: Any, key: str, default: int | None = None) -> int:
    param = tensor.parameters.get(key)
    value = param_value(param) if param is not None else default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        what = "missing" if value is None else f"got {value!r}"
        raise InvalidArgument(f"tensor '{tensor.name}': '{key}' must be a non-negative integer ({what})")
    return value


def _from_shm(tensor: Any, shm: SharedMemoryRegistry, limits: Limits) -> np.ndarray:
    name = tensor.name
    region = param_value(tensor.parameters[SHM_REGION])
    if not isinstance(region, str) or not region:
        raise InvalidArgument(f"input '{name}': '{SHM_REGION}' must be a region name")
    if tensor.HasField("contents"):
        raise InvalidArgument(f"input '{name}': give either a shared memory region or contents, not both")
    size = _shm_param(tensor, SHM_BYTE_SIZE)
    offset = _shm_param(tensor, SHM_OFFSET, 0)
    # a CUDA region's input stays on its device (a DeviceTensor; flowserve/core/device.py)
    value = shm.read_tensor(region, offset, size, name, tensor.datatype, tensor.shape, limits)
    return tensor_map({name: value})[name]


def shm_targets(msg: Any) -> dict[str, ShmTarget] | None:
    """Requested outputs that go to shared memory, by name (None when there are none)."""
    targets: dict[str, ShmTarget] | None = None
    for out in msg.outputs:
        if out.parameters and SHM_REGION in out.parameters:
            region = param_value(out.parameters[SHM_REGION])
            if not isinstance(region, str) or not region:
                raise InvalidArgument(f"output '{out.name}': '{SHM_REGION}' must be a region name")
            target = (region, _shm_param(out, SHM_OFFSET, 0), _shm_param(out, SHM_BYTE_SIZE))
            if targets is None:
                targets = {}
            targets[out.name] = target
    return targets


# ------------------------------------------------------------------ response

_OutputTensor = pb.ModelInferResponse.InferOutputTensor


# raw_output_contents on the wire: field number and wire type 2 (length-delimited)
_RAW_TAG = bytes([pb.ModelInferResponse.DESCRIPTOR.fields_by_name["raw_output_contents"].number << 3 | 2])
WIRE_TAIL_FROM = 64 * 1024  # raw outputs of at least this many bytes in all: serialized by hand
SMALL_PART = 4096  # a raw output smaller than this is copied into the piece before it


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class WireResponse(Scattered):
    """A ModelInferResponse whose ``raw_output_contents`` are written after the rest of it by
    hand: the head (names, shapes, parameters) serialized by protobuf, then each raw entry as
    its tag, length and the output's own buffer. Protobuf allows a message's fields in any
    order and keeps a repeated field's entries in theirs, so every parser reads the same
    message. Why: upb's ``SerializeToString`` copies a 16 MiB bytes field at about 0.5 GB/s
    (31 ms measured here, against 2 ms for a join), after ``tobytes`` made the field's copy.
    The native transport takes the message as pieces (:meth:`wire_parts`: the outputs' buffers
    themselves, framed and written with vectored writes, never copied); ``SerializeToString``
    joins them once. Only the native transport takes it (``InferenceServicer(wire_tail=True)``):
    grpcio's generated serializer and a stream's ModelStreamInferResponse need a real message."""

    __slots__ = ("head", "raws")

    def __init__(self, head: Any, raws: list[Any]) -> None:
        self.head = head
        self.raws = raws

    def wire_parts(self) -> tuple[list[Piece], int]:
        """The message as pieces: the head with the first entry's tag and length, each output's
        buffer, the next entry's tag and length..., and their total size."""
        parts: list[Piece] = []
        prefix = self.head.SerializeToString()
        size = 0
        for raw in self.raws:
            n = raw.nbytes if isinstance(raw, memoryview) else len(raw)
            prefix += _RAW_TAG + _varint(n)
            if n < SMALL_PART:
                prefix += raw
                continue
            parts += (prefix, raw)
            size += len(prefix) + n
            prefix = b""
        if prefix:
            parts.append(prefix)
            size += len(prefix)
        return parts, size

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        return b"".join(self.wire_parts()[0])


_STREAM_INFER_TAG = bytes(
    [pb.ModelStreamInferResponse.DESCRIPTOR.fields_by_name["infer_response"].number << 3 | 2]
)


class StreamWireResponse(Scattered):
    """A ModelStreamInferResponse whose ``infer_response`` is a :class:`WireResponse` (its
    ``error_message`` empty): the field's tag and length, then the inner message's pieces, so
    a streaming call's large outputs are written from their own buffers as a unary call's are.
    Only the native transport takes it (``InferenceServicer(wire_tail=True)``)."""

    __slots__ = ("inner",)

    def __init__(self, inner: WireResponse) -> None:
        self.inner = inner

    @property
    def infer_response(self) -> Any:
        """The inner message's head (what is not raw output), e.g. to read its parameters."""
        return self.inner.head

    def wire_parts(self) -> tuple[list[Piece], int]:
        parts, size = self.inner.wire_parts()
        head = _STREAM_INFER_TAG + _varint(size)
        return [head, *parts], len(head) + size

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        return b"".join(self.wire_parts()[0])


def encode_response_wire(
    response: InferResponse,
    shm: SharedMemoryRegistry,
    targets: dict[str, ShmTarget] | None = None,
    tail_from: int = WIRE_TAIL_FROM,
) -> Any:
    """:func:`encode_response` for the native transport: a :class:`WireResponse` when the raw
    outputs are large (``tail_from`` bytes in all), the message itself otherwise."""
    arrays = response.outputs.values()
    if sum(int(getattr(a, "nbytes", 0)) for a in arrays) < tail_from:
        return encode_response(response, shm, targets)
    head = encode_response(response, shm, targets, raw=False)
    raws = [
        b"" if targets and name in targets else raw_view(array) for name, array in response.outputs.items()
    ]
    return WireResponse(head, raws)


def encode_response(
    response: InferResponse,
    shm: SharedMemoryRegistry,
    targets: dict[str, ShmTarget] | None = None,
    raw: bool = True,
) -> Any:
    """A ModelInferResponse whose raw_output_contents follow its outputs in order.

    Outputs written to shared memory carry the region in their parameters and an empty raw
    entry, as Triton's do: every output has its raw entry, at its own position (Triton's C++
    client, perf_analyzer's, indexes ``raw_output_contents`` by output position unchecked and
    crashed on a response whose outputs were all in shared memory and had no entries).
    """
    outputs = []
    raws = []
    for name, array in response.outputs.items():
        datatype = from_numpy(array.dtype)
        target = targets.get(name) if targets else None
        if target is None:
            outputs.append(_OutputTensor(name=name, datatype=datatype, shape=array.shape))
            if raw:
                raws.append(to_raw(array))
            continue
        region, offset, byte_size = target
        written = shm.write_tensor(region, offset, byte_size, array, name)
        out = _OutputTensor(name=name, datatype=datatype, shape=array.shape)
        out.parameters[SHM_REGION].string_param = region
        out.parameters[SHM_BYTE_SIZE].int64_param = written
        if offset:
            out.parameters[SHM_OFFSET].int64_param = offset
        outputs.append(out)
        if raw:
            raws.append(b"")
    msg = pb.ModelInferResponse(
        model_name=response.model,
        model_version=response.version,
        id=response.id,
        outputs=outputs,
        raw_output_contents=raws,
    )
    if response.parameters:
        for key, value in response.parameters.items():
            set_param(msg.parameters[key], value)
    return msg
