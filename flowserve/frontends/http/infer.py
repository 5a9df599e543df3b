"""Triton's HTTP inference request and response, decoded straight into numpy and back.

A request body is a JSON header, optionally followed by raw tensor bytes (the binary tensor
extension: ``Inference-Header-Content-Length`` says where the JSON ends). Each input carries
exactly one of ``data`` (JSON, flat or nested), ``binary_data_size`` (its slice of the raw
bytes, in input order) or ``shared_memory_region`` (a registered system shared memory region).

Each output is answered as JSON ``data``, as raw bytes after the JSON (``binary_data`` on the
output, else ``binary_data_output`` on the request) or written into shared memory. FP16 and BF16
are sent as raw bytes unless JSON is asked for explicitly; a BYTES output that is not valid
UTF-8 cannot be a JSON string and is sent as raw bytes instead.
"""

from __future__ import annotations

import asyncio
import math
import struct
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from flowserve.core.datatypes import DATATYPES, from_numpy, to_numpy
from flowserve.core.device import DeviceTensor, tensor_map
from flowserve.core.errors import InvalidArgument
from flowserve.core.limits import MAX_RANK, Limits, check_bytes_elements, check_shape
from flowserve.core.types import InferRequest, InferResponse, RequestedOutput
from flowserve.core.wire import as_bytes, from_list, from_raw, raw_view, to_raw
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends.http import jsonfmt

_NO_BINARY = memoryview(b"")
_LEN = struct.Struct("<I")  # a BYTES element's length prefix
_HALF_TYPES = frozenset(("FP16", "BF16"))
_FIXED_SIZE = {name: to_numpy(name) for name in DATATYPES if name != "BYTES"}
_SEQUENCE_FLAGS = ("sequence_start", "sequence_end")
_UINT_PARAMETERS = ("priority", "timeout")
TOO_DEEP = "JSON nested too deeply"
# a request with more elements than this to decode one by one (BYTES, JSON data), or a response
# with more to encode one by one, is decoded / encoded in a worker thread, off the event loop
ONE_BY_ONE_IN_THREAD = 1 << 16
RAW_IN_THREAD = 1 << 20  # a raw binary request body above this is decoded in a worker thread


@dataclass(slots=True)
class ShmTarget:
    region: str
    offset: int
    byte_size: int


@dataclass(slots=True)
class OutputSpec:
    """How one requested output is answered: ``binary`` None means the request's default."""

    binary: bool | None = None
    shm: ShmTarget | None = None


@dataclass(slots=True)
class ResponsePlan:
    default_binary: bool = False
    explicit_default: bool = False
    outputs: dict[str, OutputSpec] | None = None


@dataclass(slots=True)
class EncodedResponse:
    header: bytes
    blobs: list[bytes | memoryview]  # the outputs' own bytes where they are the wire's (raw_view)


# ------------------------------------------------------------------ request


def parse_json(data: bytes | bytearray | memoryview, what: str, chunked: bool = False) -> Any:
    """The JSON document ``data``; InvalidArgument when it is malformed or nested too deep.
    ``chunked``: parse it in chunks (a large body, in a worker thread)."""
    try:
        return jsonfmt.loads_chunked(data) if chunked else jsonfmt.loads(data)
    except UnicodeDecodeError as exc:
        raise InvalidArgument(f"malformed {what}: not UTF-8 ({exc.reason})") from None
    except ValueError as exc:
        raise InvalidArgument(f"malformed {what}: {exc}") from None
    except RecursionError:
        raise InvalidArgument(f"malformed {what}: {TOO_DEEP}") from None


def decode_request(
    plane: DataPlane,
    model: str,
    version: str,
    header: Any,
    binary: memoryview = _NO_BINARY,
) -> tuple[InferRequest, ResponsePlan]:
    """An :class:`InferRequest` and how to answer it, from a parsed JSON header and the raw
    bytes that followed it."""
    if not isinstance(header, dict):
        raise InvalidArgument(f"inference request for model '{model}': the JSON body must be an object")
    request_id = header.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgument(f"inference request for model '{model}': 'id' must be a string")
    plan = ResponsePlan()
    parameters = _request_parameters(header.get("parameters"), model, plan)
    inputs = header.get("inputs")
    if not isinstance(inputs, list):
        raise InvalidArgument(f"inference request for model '{model}': 'inputs' must be an array")
    tensors = _decode_inputs(plane, model, inputs, binary)
    requested = header.get("outputs")
    wanted = None if requested is None else _requested_outputs(requested, model, plan)
    request = InferRequest(model, tensors, version, request_id, parameters, wanted)
    if plan.outputs and plane.shm.cuda_in_use:  # outputs into CUDA regions stay on the device
        request.keep_device = plane.shm.on_device(
            (name, spec.shm.region) for name, spec in plan.outputs.items() if spec.shm is not None
        )
    return request, plan


async def decode_request_off_loop(
    plane: DataPlane,
    model: str,
    version: str,
    header: Any,
    binary: memoryview = _NO_BINARY,
) -> tuple[InferRequest, ResponsePlan]:
    """:func:`decode_request`, in a worker thread when the request has more than
    ONE_BY_ONE_IN_THREAD elements to decode one by one (the event loop serves others meanwhile)."""
    if one_by_one(header) > ONE_BY_ONE_IN_THREAD:
        return await asyncio.to_thread(decode_request, plane, model, version, header, binary)
    return decode_request(plane, model, version, header, binary)


def one_by_one(header: Any) -> int:
    """The elements a request header declares for BYTES inputs and inputs with JSON ``data``
    (decoded one by one), as far as its shapes are integers; malformed ones count nothing
    (decoding refuses them)."""
    inputs = header.get("inputs") if type(header) is dict else None
    if type(inputs) is not list:
        return 0
    total = 0
    for item in inputs:
        if type(item) is dict and (item.get("datatype") == "BYTES" or "data" in item):
            shape = item.get("shape")
            if type(shape) is list and len(shape) <= MAX_RANK and all(type(d) is int for d in shape):
                total += math.prod(shape)
    return total


def _request_parameters(raw: Any, model: str, plan: ResponsePlan) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidArgument(f"inference request for model '{model}': 'parameters' must be an object")
    for key, value in raw.items():
        if key.startswith("triton_"):
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should "
                f"not be specified. (got '{key}')"
            )
        if key == "binary_data_output":
            if not isinstance(value, bool):
                raise InvalidArgument("parameter 'binary_data_output' must be a boolean")
            plan.default_binary = value
            plan.explicit_default = True
        elif key == "sequence_id":
            if not (is_uint(value) or isinstance(value, str)):
                raise InvalidArgument(
                    f"parameter 'sequence_id' must be an unsigned integer or a string, got {value!r}"
                )
        elif key in _SEQUENCE_FLAGS:
            if not isinstance(value, bool):
                raise InvalidArgument(f"parameter '{key}' must be a boolean, got {value!r}")
        elif key in _UINT_PARAMETERS:
            if not is_uint(value):
                raise InvalidArgument(f"parameter '{key}' must be an unsigned integer, got {value!r}")
        elif not isinstance(value, str | int | float):  # bool is an int
            raise InvalidArgument(
                f"parameter '{key}' must be a string, number or boolean, got {type(value).__name__}"
            )
    return raw


def is_uint(value: Any) -> TypeGuard[int]:
    return type(value) is int and value >= 0


def _decode_inputs(
    plane: DataPlane, model: str, items: list[Any], binary: memoryview
) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    offset = 0
    size = len(binary)
    if not binary.readonly:  # a large body read into its own (writable) buffer: tensors stay read-only
        binary = binary.toreadonly()
    limits = plane.limits
    bytes_elements = 0
    for item in items:
        if type(item) is not dict:
            raise InvalidArgument(f"inference request for model '{model}': each input must be an object")
        name = item.get("name")
        if type(name) is not str:
            raise InvalidArgument(f"inference request for model '{model}': an input has no string 'name'")
        if name in tensors:
            raise InvalidArgument(f"input '{name}' appears more than once in the request")
        datatype = item.get("datatype")
        if datatype not in DATATYPES:
            raise InvalidArgument(f"input '{name}': unknown datatype {datatype!r}")
        shape = item.get("shape")
        if type(shape) is not list:
            raise InvalidArgument(f"input '{name}': 'shape' must be an array of non-negative integers")
        count = check_shape(name, shape, limits)
        if datatype == "BYTES":
            bytes_elements += count
            check_bytes_elements(model, name, bytes_elements, limits)
        params = item.get("parameters")
        if params is None:
            byte_size = region = None
        elif type(params) is dict:
            byte_size = params.get("binary_data_size")
            region = params.get("shared_memory_region")
        else:
            raise InvalidArgument(f"input '{name}': 'parameters' must be an object")
        if ("data" in item) + (byte_size is not None) + (region is not None) != 1:
            raise InvalidArgument(
                f"input '{name}' must set exactly one of 'data', 'binary_data_size' in 'parameters' "
                "or 'shared_memory_region' in 'parameters'"
            )
        if byte_size is not None:
            if type(byte_size) is not int or byte_size < 0:
                raise InvalidArgument(f"input '{name}': 'binary_data_size' must be a non-negative integer")
            end = offset + byte_size
            if end > size:
                raise InvalidArgument(
                    f"input '{name}': binary_data_size is {byte_size} but only {size - offset} bytes of "
                    "binary data remain in the request body (truncated body?)"
                )
            dtype = _FIXED_SIZE.get(datatype)
            if dtype is not None and byte_size == count * dtype.itemsize:
                tensors[name] = np.frombuffer(binary, dtype, count, offset).reshape(shape)
            else:  # BYTES, or a size that does not fit the shape (from_raw says how)
                tensors[name] = from_raw(name, datatype, shape, binary[offset:end], limits)
            offset = end
        elif region is not None:
            assert params is not None
            tensors[name] = _read_shm(plane, name, datatype, shape, region, params)
        else:
            tensors[name] = from_list(name, datatype, shape, item["data"], limits)
    if offset != size:
        raise InvalidArgument(
            f"inference request for model '{model}': {size - offset} bytes of binary data follow the "
            "inputs' binary_data_size"
        )
    return tensors


def _shm_params(name: str, region: Any, params: dict[str, Any]) -> ShmTarget:
    if not isinstance(region, str):
        raise InvalidArgument(f"tensor '{name}': 'shared_memory_region' must be a string")
    offset = params.get("shared_memory_offset", 0)
    byte_size = params.get("shared_memory_byte_size")
    if not is_uint(offset):
        raise InvalidArgument(f"tensor '{name}': 'shared_memory_offset' must be a non-negative integer")
    if not is_uint(byte_size):
        raise InvalidArgument(
            f"tensor '{name}': 'shared_memory_byte_size' (a non-negative integer) is required with "
            "'shared_memory_region'"
        )
    return ShmTarget(region, offset, byte_size)


def _read_shm(
    plane: DataPlane, name: str, datatype: str, shape: list[int], region: Any, params: dict[str, Any]
) -> np.ndarray:
    """An input from a system or CUDA shared-memory region (a CUDA one stays on its device:
    a DeviceTensor, which the executor hands on as it is; see flowserve/core/device.py)."""
    target = _shm_params(name, region, params)
    tensor = plane.shm.read_tensor(
        target.region, target.offset, target.byte_size, name, datatype, shape, plane.limits
    )
    return tensor_map({name: tensor})[name]


def _requested_outputs(raw: Any, model: str, plan: ResponsePlan) -> list[RequestedOutput]:
    if not isinstance(raw, list):
        raise InvalidArgument(f"inference request for model '{model}': 'outputs' must be an array")
    wanted: list[RequestedOutput] = []
    specs: dict[str, OutputSpec] = {}
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidArgument(
                f"inference request for model '{model}': each requested output needs a string 'name'"
            )
        name = item["name"]
        params = item.get("parameters")
        spec = OutputSpec()
        class_count = 0
        if params is not None:
            if not isinstance(params, dict):
                raise InvalidArgument(f"output '{name}': 'parameters' must be an object")
            binary = params.get("binary_data")
            if binary is not None:
                if not isinstance(binary, bool):
                    raise InvalidArgument(f"output '{name}': 'binary_data' must be a boolean")
                spec.binary = binary
            classification = params.get("classification")
            if classification is not None:
                if not is_uint(classification):
                    raise InvalidArgument(f"output '{name}': 'classification' must be a non-negative integer")
                class_count = classification
            region = params.get("shared_memory_region")
            if region is not None:
                if class_count:
                    raise InvalidArgument(
                        f"output '{name}' can't set both 'shared_memory_region' and 'classification'"
                    )
                if spec.binary:
                    raise InvalidArgument(
                        f"output '{name}' can't set both 'shared_memory_region' and 'binary_data'"
                    )
                spec.shm = _shm_params(name, region, params)
        specs[name] = spec
        wanted.append(RequestedOutput(name, class_count))
    plan.outputs = specs
    return wanted


def raw_request(
    plane: DataPlane, model: str, version: str, body: memoryview
) -> tuple[InferRequest, ResponsePlan]:
    """``Inference-Header-Content-Length: 0``: the body is the raw bytes of the model's only
    input, as a batch of one; every output comes back binary."""
    metadata = plane.model_metadata(model, version)
    inputs = metadata["inputs"]
    if len(inputs) != 1:
        raise InvalidArgument(
            f"a raw binary request needs a model with exactly one input; '{model}' has {len(inputs)}"
        )
    spec = inputs[0]
    name, datatype = spec["name"], spec["datatype"]
    dims = list(spec["shape"])
    batched = int(plane.model_config(model, version).get("max_batch_size", 0)) > 0
    if batched:
        dims[0] = 1
    variable = [i for i, d in enumerate(dims) if d < 0]
    if variable:
        if len(variable) > 1:
            raise InvalidArgument(
                f"a raw binary request cannot infer the shape of input '{name}' of '{model}': "
                f"{len(variable)} variable dimensions"
            )
        known = int(np.prod([d for d in dims if d >= 0]))
        if datatype == "BYTES":
            count = _count_bytes_elements(model, name, body, plane.limits)
        else:
            itemsize = to_numpy(datatype).itemsize
            if known == 0 or len(body) % (itemsize * known):
                raise InvalidArgument(
                    f"input '{name}': {len(body)} bytes of raw data do not fill whole {datatype} "
                    f"elements of shape {dims}"
                )
            count = len(body) // itemsize
        dims[variable[0]] = count // known if known else 0
    if datatype == "BYTES":
        check_bytes_elements(model, name, check_shape(name, dims, plane.limits), plane.limits)
    tensor = from_raw(name, datatype, dims, body if body.readonly else body.toreadonly(), plane.limits)
    return InferRequest(model, {name: tensor}, version), ResponsePlan(
        default_binary=True, explicit_default=True
    )


async def raw_request_off_loop(
    plane: DataPlane, model: str, version: str, body: memoryview
) -> tuple[InferRequest, ResponsePlan]:
    """:func:`raw_request`, in a worker thread when the body is over RAW_IN_THREAD bytes."""
    if len(body) > RAW_IN_THREAD:
        return await asyncio.to_thread(raw_request, plane, model, version, body)
    return raw_request(plane, model, version, body)


def _count_bytes_elements(model: str, name: str, body: memoryview, limits: Limits) -> int:
    """The BYTES elements in a raw body, counted no further than the per-request limit."""
    count, offset, size = 0, 0, len(body)
    most = limits.max_bytes_elements_per_request
    unpack = _LEN.unpack_from
    while offset + 4 <= size:
        offset += 4 + unpack(body, offset)[0]
        count += 1
        if count > most:
            check_bytes_elements(model, name, count, limits)
    if offset != size:
        raise InvalidArgument(f"input '{name}': BYTES data has a bad length prefix")
    return count


# ------------------------------------------------------------------ response


def encode_response(plane: DataPlane, response: InferResponse, plan: ResponsePlan) -> EncodedResponse:
    """The JSON header and the raw output bytes that follow it (none: a plain JSON body)."""
    outputs: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    specs = plan.outputs
    for name, value in response.outputs.items():
        array = value if isinstance(value, np.ndarray | DeviceTensor) else np.asarray(value)
        datatype = from_numpy(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        spec = specs.get(name) if specs is not None else None
        if spec is not None and spec.shm is not None:
            target = spec.shm
            plane.shm.write_tensor(target.region, target.offset, target.byte_size, array, name)
            outputs.append(entry)
            continue
        data = None if _binary(spec, plan, datatype) else json_data(array, datatype)
        if data is None:
            raw = raw_view(array) if isinstance(array, np.ndarray) else to_raw(array)
            blobs.append(raw)
            entry["parameters"] = {"binary_data_size": len(raw)}
        else:
            entry["data"] = data
        outputs.append(entry)
    body: dict[str, Any] = {"model_name": response.model, "model_version": response.version}
    if response.id:
        body["id"] = response.id
    if response.parameters:
        body["parameters"] = response.parameters
    body["outputs"] = outputs
    return EncodedResponse(jsonfmt.dumps(body), blobs)


def _binary(spec: OutputSpec | None, plan: ResponsePlan, datatype: str) -> bool:
    """Whether an output not bound for shared memory is answered as raw bytes (else JSON)."""
    if spec is not None and spec.binary is not None:
        return spec.binary
    if not plan.default_binary and datatype in _HALF_TYPES and not plan.explicit_default:
        return True
    return plan.default_binary


async def encode_response_off_loop(
    plane: DataPlane, response: InferResponse, plan: ResponsePlan
) -> EncodedResponse:
    """:func:`encode_response`, in a worker thread when the response has more than
    ONE_BY_ONE_IN_THREAD elements to encode one by one (BYTES outputs, outputs as JSON)."""
    if _encoded_one_by_one(response, plan) > ONE_BY_ONE_IN_THREAD:
        return await asyncio.to_thread(encode_response, plane, response, plan)
    return encode_response(plane, response, plan)


def _encoded_one_by_one(response: InferResponse, plan: ResponsePlan) -> int:
    total = 0
    specs = plan.outputs
    for name, value in response.outputs.items():
        array = value if isinstance(value, np.ndarray | DeviceTensor) else np.asarray(value)
        datatype = from_numpy(array.dtype)
        spec = specs.get(name) if specs is not None else None
        if datatype == "BYTES" or ((spec is None or spec.shm is None) and not _binary(spec, plan, datatype)):
            total += math.prod(array.shape)
    return total


def json_data(array: np.ndarray, datatype: str) -> list[Any] | None:
    """A tensor as a flat JSON list; None when it cannot be one (BYTES that are not UTF-8)."""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        out: list[Any] = []
        for item in flat:
            if isinstance(item, str):
                out.append(item)
                continue
            try:
                out.append(as_bytes(item).decode("utf-8"))
            except UnicodeDecodeError:
                return None
        return out
    if datatype == "BF16":
        flat = flat.astype(np.float32)
    result: list[Any] = flat.tolist()
    return result
