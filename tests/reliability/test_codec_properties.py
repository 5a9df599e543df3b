"""Property tests (hypothesis) of the codecs: raw tensor bytes, BYTES, JSON data, the HTTP
binary extension and gRPC contents. Whatever a request holds, decoding either gives back
exactly what was encoded or raises a FlowserveError (a 4xx) naming the tensor: never another
exception (a 500), never an allocation larger than the limits allow."""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.grpc import service_pb2

from flowserve.core.datatypes import DATATYPES, to_numpy
from flowserve.core.errors import FlowserveError
from flowserve.core.limits import Limits
from flowserve.core.types import InferResponse
from flowserve.core.wire import from_list, from_raw, to_raw
from flowserve.dataplane.shm import SharedMemoryRegistry
from flowserve.frontends.grpc import codec as grpc_codec
from flowserve.frontends.http import infer as http_infer

LIMITS = Limits(max_request_bytes=1 << 20, max_tensor_elements=4096, max_bytes_element=256)
ALL_TYPES = sorted(DATATYPES)
FIXED = [d for d in ALL_TYPES if d != "BYTES"]
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)

small_shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5)
any_dim = st.one_of(
    st.integers(-3, 40), st.integers(-(2**64), 2**64), st.sampled_from([0, 1, 2**31, 2**63 - 1])
)
any_shape = st.one_of(st.lists(any_dim, max_size=5), st.lists(st.just(1), min_size=30, max_size=70))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal shape, dtype and bytes (NaN == NaN)."""
    return bool(a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes())


@st.composite
def fixed_arrays(draw: st.DrawFn, datatype: str | None = None) -> tuple[str, np.ndarray]:
    datatype = datatype or draw(st.sampled_from(FIXED))
    dtype = to_numpy(datatype)
    shape = draw(small_shapes)
    if datatype == "BF16":  # hypothesis has no bfloat16: draw the bits
        bits = draw(hnp.arrays(np.uint16, shape))
        return datatype, bits.view(dtype)
    return datatype, draw(hnp.arrays(dtype, shape))


bytes_arrays = small_shapes.flatmap(
    lambda shape: st.lists(
        st.binary(max_size=40), min_size=int(np.prod(shape)), max_size=int(np.prod(shape))
    ).map(lambda items: _object_array(items, shape))
)


def _object_array(items: list[bytes], shape: tuple[int, ...]) -> np.ndarray:
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array.reshape(shape)


# ------------------------------------------------------------------ raw bytes (HTTP binary, gRPC raw, shm)


@given(fixed_arrays())
@SETTINGS
def test_raw_round_trip(case: tuple[str, np.ndarray]) -> None:
    datatype, array = case
    back = from_raw("t", datatype, list(array.shape), to_raw(array), LIMITS)
    assert same_bits(back, array.copy(order="C"))


@given(bytes_arrays)
@SETTINGS
def test_bytes_round_trip(array: np.ndarray) -> None:
    back = from_raw("t", "BYTES", list(array.shape), to_raw(array), LIMITS)
    assert back.shape == array.shape and back.reshape(-1).tolist() == array.reshape(-1).tolist()


@given(st.sampled_from(ALL_TYPES), any_shape, st.binary(max_size=300))
@SETTINGS
def test_raw_decode_is_total(datatype: str, shape: list[int], data: bytes) -> None:
    """Any shape with any bytes: a tensor whose size matches the bytes, or a FlowserveError."""
    try:
        array = from_raw("t", datatype, shape, data, LIMITS)
    except FlowserveError as exc:
        assert "'t'" in exc.message
        return
    assert array.size <= LIMITS.max_tensor_elements and list(array.shape) == shape
    if datatype != "BYTES":
        assert array.nbytes == len(data)


@given(st.lists(st.integers(0, 2**32 - 1), max_size=6), st.binary(max_size=64), st.integers(0, 6))
@SETTINGS
def test_bytes_length_prefixes_never_over_allocate(lengths: list[int], tail: bytes, count: int) -> None:
    data = b"".join(struct.pack("<I", n) for n in lengths) + tail
    try:
        array = from_raw("t", "BYTES", [count], data, LIMITS)
    except FlowserveError:
        return
    assert all(len(x) <= LIMITS.max_bytes_element for x in array.reshape(-1))


# ------------------------------------------------------------------ JSON data

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
json_values = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=30,
)


@given(st.sampled_from(ALL_TYPES), any_shape, json_values)
@SETTINGS
def test_json_data_decode_is_total(datatype: str, shape: list[int], data: Any) -> None:
    with np.errstate(all="raise"):  # a numpy warning would be an exception here: none may escape
        try:
            array = from_list("t", datatype, shape, data, LIMITS)
        except FlowserveError:
            return
    assert list(array.shape) == shape


@given(fixed_arrays())
@SETTINGS
def test_json_round_trip(case: tuple[str, np.ndarray]) -> None:
    datatype, array = case
    if datatype in ("FP16", "BF16", "FP32", "FP64"):
        array = np.where(np.isfinite(array.astype(np.float64)), array, 0).astype(array.dtype)
    data = http_infer.json_data(array, datatype)
    assert data is not None
    text = json.dumps(data)
    back = from_list("t", datatype, list(array.shape), json.loads(text), LIMITS)
    assert same_bits(back, array.copy(order="C")) or datatype == "BF16"


# ------------------------------------------------------------------ HTTP request decoding


class FakePlane:
    """What decode_request uses of a DataPlane."""

    limits = LIMITS
    shm = SharedMemoryRegistry(enabled=False)


tensor_entries = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.sampled_from(["a", "b"]), st.integers(), st.none()),
        "datatype": st.one_of(st.sampled_from(ALL_TYPES), st.text(max_size=5)),
        "shape": st.one_of(any_shape, json_values),
        "data": json_values,
        "parameters": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "binary_data_size": st.one_of(st.integers(-5, 300), json_leaf),
                    "shared_memory_region": st.one_of(st.text(max_size=4), json_leaf),
                    "shared_memory_byte_size": st.integers(-5, 300),
                },
            ),
            json_values,
        ),
    },
)
headers = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=5), json_leaf),
        "inputs": st.one_of(st.lists(tensor_entries, max_size=3), json_values),
        "outputs": st.one_of(
            st.lists(
                st.fixed_dictionaries({"name": st.text(max_size=3)}, optional={"parameters": json_values}),
                max_size=2,
            ),
            json_values,
        ),
        "parameters": st.one_of(
            st.dictionaries(
                st.sampled_from(["binary_data_output", "timeout", "priority", "sequence_id", "x"]),
                json_leaf,
                max_size=3,
            ),
            json_values,
        ),
    },
)


@given(st.one_of(headers, json_values), st.binary(max_size=200))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
def test_http_request_decode_is_total(header: Any, binary: bytes) -> None:
    try:
        request, _ = http_infer.decode_request(FakePlane(), "m", "", header, memoryview(binary))  # type: ignore[arg-type]
    except FlowserveError:
        return
    for name, array in request.inputs.items():
        assert isinstance(array, np.ndarray) and array.size <= LIMITS.max_tensor_elements, name


@given(st.lists(fixed_arrays(), min_size=1, max_size=3), st.booleans())
@SETTINGS
def test_http_binary_request_round_trip(cases: list[tuple[str, np.ndarray]], binary_output: bool) -> None:
    """Tensors sent with the binary extension come back as the same tensors, and encoding
    them as a response gives the same bytes."""
    entries, blobs = [], []
    for i, (datatype, array) in enumerate(cases):
        raw = to_raw(array)
        entries.append(
            {
                "name": f"in{i}",
                "shape": list(array.shape),
                "datatype": datatype,
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        blobs.append(raw)
    header = {"inputs": entries, "parameters": {"binary_data_output": binary_output}}
    request, plan = http_infer.decode_request(FakePlane(), "m", "", header, memoryview(b"".join(blobs)))  # type: ignore[arg-type]
    for i, (_, array) in enumerate(cases):
        assert same_bits(request.inputs[f"in{i}"], array.copy(order="C"))
    encoded = http_infer.encode_response(FakePlane(), InferResponse("m", "1", dict(request.inputs)), plan)  # type: ignore[arg-type]
    head = json.loads(encoded.header)
    assert [o["name"] for o in head["outputs"]] == [f"in{i}" for i in range(len(cases))]


# ------------------------------------------------------------------ gRPC contents


@st.composite
def infer_messages(draw: st.DrawFn) -> Any:
    msg = service_pb2.ModelInferRequest(model_name="m")
    for _ in range(draw(st.integers(0, 3))):
        t = msg.inputs.add(
            name=draw(st.sampled_from(["a", "b", ""])),
            datatype=draw(st.one_of(st.sampled_from(ALL_TYPES), st.text(max_size=4))),
            shape=draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4)),
        )
        which = draw(st.sampled_from(["none", "int", "bytes", "fp32", "bool", "uint64", "shm"]))
        if which == "int":
            t.contents.int_contents.extend(draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20)))
        elif which == "bytes":
            t.contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=300), max_size=5)))
        elif which == "fp32":
            t.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=20)))
        elif which == "bool":
            t.contents.bool_contents.extend(draw(st.lists(st.booleans(), max_size=20)))
        elif which == "uint64":
            t.contents.uint64_contents.extend(draw(st.lists(st.integers(0, 2**64 - 1), max_size=20)))
        elif which == "shm":
            t.parameters["shared_memory_region"].string_param = "r"
            t.parameters["shared_memory_byte_size"].int64_param = draw(st.integers(-5, 100))
    for _ in range(draw(st.integers(0, 3))):
        msg.raw_input_contents.append(draw(st.binary(max_size=200)))
    return msg


@given(infer_messages())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
def test_grpc_request_decode_is_total(msg: Any) -> None:
    try:
        request = grpc_codec.decode_request(msg, SharedMemoryRegistry(enabled=False), LIMITS)
    except FlowserveError:
        return
    for array in request.inputs.values():
        assert array.size <= LIMITS.max_tensor_elements


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None, database=None)
def test_grpc_wire_bytes_decode_is_total(data: bytes) -> None:
    """Bytes off the wire that parse as a ModelInferRequest decode or fail cleanly."""
    from google.protobuf.message import DecodeError

    try:
        msg = service_pb2.ModelInferRequest.FromString(data)
    except DecodeError:
        return  # grpc itself refuses these
    with contextlib.suppress(FlowserveError):
        grpc_codec.decode_request(msg, SharedMemoryRegistry(enabled=False), LIMITS)


@given(st.lists(st.one_of(fixed_arrays(), bytes_arrays.map(lambda a: ("BYTES", a))), min_size=1, max_size=3))
@SETTINGS
def test_grpc_raw_round_trip(cases: list[tuple[str, np.ndarray]]) -> None:
    """A response's raw outputs, sent back as a request's raw inputs, are the same tensors."""
    outputs = {f"t{i}": array for i, (_, array) in enumerate(cases)}
    response = grpc_codec.encode_response(
        InferResponse("m", "1", outputs), SharedMemoryRegistry(enabled=False)
    )
    msg = service_pb2.ModelInferRequest(model_name="m")
    for out in response.outputs:
        msg.inputs.add(name=out.name, datatype=out.datatype, shape=out.shape)
    msg.raw_input_contents.extend(response.raw_output_contents)
    request = grpc_codec.decode_request(msg, SharedMemoryRegistry(enabled=False), LIMITS)
    for name, array in outputs.items():
        back = request.inputs[name]
        if array.dtype == np.object_:
            assert back.reshape(-1).tolist() == array.reshape(-1).tolist()
        else:
            assert same_bits(back, array.copy(order="C"))


@given(st.lists(st.one_of(fixed_arrays(), bytes_arrays.map(lambda a: ("BYTES", a))), min_size=1, max_size=3))
@SETTINGS
def test_grpc_wire_response_is_the_same_message(cases: list[tuple[str, np.ndarray]]) -> None:
    """The native transport's hand-serialized raw outputs (codec.WireResponse) parse to exactly
    the message protobuf serializes, whatever the dtypes, byte orders and layouts."""
    outputs = {f"t{i}": array for i, (_, array) in enumerate(cases)}
    response = InferResponse("m", "1", outputs, id="x", parameters={"p": 1})
    shm = SharedMemoryRegistry(enabled=False)
    wire = grpc_codec.encode_response_wire(response, shm, tail_from=0)
    assert isinstance(wire, grpc_codec.WireResponse)
    expected = grpc_codec.encode_response(response, shm)
    assert service_pb2.ModelInferResponse.FromString(wire.SerializeToString()) == expected


@pytest.mark.parametrize("datatype", sorted(grpc_codec.TYPED_FIELD))
def test_grpc_typed_contents_round_trip(datatype: str) -> None:
    @given(fixed_arrays(datatype) if datatype != "BYTES" else bytes_arrays.map(lambda a: ("BYTES", a)))
    @settings(max_examples=40, deadline=None, database=None)
    def check(case: tuple[str, np.ndarray]) -> None:
        _, array = case
        msg = service_pb2.ModelInferRequest(model_name="m")
        t = msg.inputs.add(name="t", datatype=datatype, shape=list(array.shape))
        getattr(t.contents, grpc_codec.TYPED_FIELD[datatype]).extend(array.reshape(-1).tolist())
        back = grpc_codec.decode_request(msg, SharedMemoryRegistry(enabled=False), LIMITS).inputs["t"]
        if datatype == "BYTES":
            assert back.reshape(-1).tolist() == array.reshape(-1).tolist()
        else:
            assert same_bits(back, array.copy(order="C"))

    check()
