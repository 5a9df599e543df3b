"""Bad requests over gRPC: each gets the right status code and a message naming the model or
tensor, and the server keeps serving."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

StatusCode = grpc.StatusCode
MODELS = ["simple", "simple_ensemble", "fanout"]
INPUTS = {"simple": ("INPUT0", "INPUT1"), "simple_ensemble": ("INPUT0", "INPUT1"), "fanout": ("a", "b")}


def tensor(name: str, array: np.ndarray, datatype: str = "INT32") -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(array.shape), datatype)
    t.set_data_from_numpy(array)
    return t


def good_inputs(model: str, rows: int = 1) -> list[grpcclient.InferInput]:
    a = np.ones((rows, 16), np.int32)
    return [tensor(n, a) for n in INPUTS[model]]


def expect_error(
    client: grpcclient.InferenceServerClient,
    model: str,
    inputs: list[Any],
    code: grpc.StatusCode,
    *fragments: str,
    **kwargs: Any,
) -> str:
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, inputs, **kwargs)
    assert info.value.status() == str(code), info.value
    message: str = info.value.message()
    for fragment in fragments:
        assert fragment in message, message
    return message


def expect_rpc_error(call: Any, request: Any, code: grpc.StatusCode, *fragments: str) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(request)
    assert info.value.code() == code, info.value
    details = str(info.value.details())
    for fragment in fragments:
        assert fragment in details, details
    return details


def raw_request(model: str, tensors: list[tuple[str, str, list[int], bytes]]) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, datatype, shape, data in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(data)
    return request


@pytest.fixture(autouse=True)
def still_serving(client: grpcclient.InferenceServerClient) -> Iterator[None]:
    """After every bad request the server is live and answers a good one."""
    yield
    assert client.is_server_live()
    result = client.infer("simple", good_inputs("simple"))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2, np.int32))


# ------------------------------------------------------------------ model and version


def test_unknown_model(client: grpcclient.InferenceServerClient) -> None:
    expect_error(client, "no_such_model", good_inputs("simple"), StatusCode.NOT_FOUND, "'no_such_model'")


def test_unknown_model_with_bad_payload_is_not_found(stub: Any) -> None:
    request = raw_request("no_such_model", [("INPUT0", "INT32", [1, 16], b"\x00" * 3)])
    expect_rpc_error(stub.ModelInfer, request, StatusCode.NOT_FOUND, "'no_such_model'")


@pytest.mark.parametrize("model", MODELS)
def test_unknown_version(client: grpcclient.InferenceServerClient, model: str) -> None:
    expect_error(
        client,
        model,
        good_inputs(model),
        StatusCode.NOT_FOUND,
        f"Request for unknown model: '{model}' version 7 is not found",
        model_version="7",
    )


def test_model_that_failed_to_load(client: grpcclient.InferenceServerClient) -> None:
    inputs = [tensor("INPUT0", np.ones((1, 4), np.float32), "FP32")]
    expect_error(client, "broken", inputs, StatusCode.UNAVAILABLE, "'broken'", "broken on purpose")


# ------------------------------------------------------------------ inputs


@pytest.mark.parametrize("model", MODELS)
def test_missing_input(client: grpcclient.InferenceServerClient, model: str) -> None:
    expect_error(
        client, model, good_inputs(model)[:1], StatusCode.INVALID_ARGUMENT, f"'{model}'", INPUTS[model][1]
    )


@pytest.mark.parametrize("model", MODELS)
def test_extra_input(client: grpcclient.InferenceServerClient, model: str) -> None:
    inputs = [*good_inputs(model), tensor("EXTRA", np.ones((1, 16), np.int32))]
    expect_error(client, model, inputs, StatusCode.INVALID_ARGUMENT, f"'{model}'", "'EXTRA'")


@pytest.mark.parametrize("model", MODELS)
def test_wrong_datatype(client: grpcclient.InferenceServerClient, model: str) -> None:
    first, second = INPUTS[model]
    inputs = [tensor(first, np.ones((1, 16), np.float32), "FP32"), tensor(second, np.ones((1, 16), np.int32))]
    expect_error(
        client, model, inputs, StatusCode.INVALID_ARGUMENT, f"'{model}'", f"'{first}'", "FP32", "INT32"
    )


@pytest.mark.parametrize("model", MODELS)
def test_wrong_shape(client: grpcclient.InferenceServerClient, model: str) -> None:
    first, second = INPUTS[model]
    inputs = [tensor(first, np.ones((1, 15), np.int32)), tensor(second, np.ones((1, 15), np.int32))]
    expect_error(client, model, inputs, StatusCode.INVALID_ARGUMENT, f"'{model}'", "shape", "16")


@pytest.mark.parametrize("model", MODELS)
def test_batch_above_max_batch_size(client: grpcclient.InferenceServerClient, model: str) -> None:
    expect_error(client, model, good_inputs(model, rows=9), StatusCode.INVALID_ARGUMENT, f"'{model}'", "8")


def test_batches_disagree(client: grpcclient.InferenceServerClient) -> None:
    inputs = [tensor("INPUT0", np.ones((2, 16), np.int32)), tensor("INPUT1", np.ones((3, 16), np.int32))]
    expect_error(client, "simple", inputs, StatusCode.INVALID_ARGUMENT, "'simple'", "batch")


def test_input_given_twice(stub: Any) -> None:
    data = np.ones((1, 16), np.int32).tobytes()
    request = raw_request("simple", [("INPUT0", "INT32", [1, 16], data), ("INPUT0", "INT32", [1, 16], data)])
    expect_rpc_error(stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'INPUT0'", "more than once")


def test_unknown_datatype(stub: Any) -> None:
    request = raw_request(
        "simple", [("INPUT0", "FP8", [1, 16], b"\x00" * 16), ("INPUT1", "INT32", [1, 16], b"\x00" * 64)]
    )
    expect_rpc_error(stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'simple'", "'INPUT0'", "'FP8'")


def test_negative_dim(stub: Any) -> None:
    request = raw_request(
        "simple", [("INPUT0", "INT32", [-1, 16], b""), ("INPUT1", "INT32", [1, 16], b"\x00" * 64)]
    )
    expect_rpc_error(stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'INPUT0'", "shape")


# ------------------------------------------------------------------ raw and typed contents


@pytest.mark.parametrize("size", [60, 68, 0])
def test_raw_size_mismatch(stub: Any, size: int) -> None:
    request = raw_request(
        "simple", [("INPUT0", "INT32", [1, 16], b"\x00" * size), ("INPUT1", "INT32", [1, 16], b"\x00" * 64)]
    )
    expect_rpc_error(
        stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'simple'", "'INPUT0'", f"{size} bytes", "64"
    )


def test_more_raw_contents_than_inputs(stub: Any) -> None:
    request = raw_request(
        "simple", [("INPUT0", "INT32", [1, 16], b"\x00" * 64), ("INPUT1", "INT32", [1, 16], b"\x00" * 64)]
    )
    request.raw_input_contents.append(b"\x00" * 64)
    expect_rpc_error(
        stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'simple'", "3 raw_input_contents"
    )


def test_input_without_data(stub: Any) -> None:
    request = raw_request("simple", [("INPUT0", "INT32", [1, 16], b"\x00" * 64)])
    request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    expect_rpc_error(stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'simple'", "'INPUT1'", "no data")


def test_raw_and_typed_contents_both_given(stub: Any) -> None:
    request = raw_request("simple", [("INPUT0", "INT32", [1, 16], b"\x00" * 64)])
    typed = request.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    typed.contents.int_contents.extend([0] * 16)
    expect_rpc_error(
        stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'simple'", "'INPUT1'", "raw_input_contents"
    )


def test_typed_contents_wrong_field(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        t = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        t.contents.fp32_contents.extend([0.0] * 16)
    expect_rpc_error(
        stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'INPUT0'", "int_contents", "fp32_contents"
    )


def test_typed_contents_wrong_count(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        t = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        t.contents.int_contents.extend([0] * 15)
    expect_rpc_error(
        stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'simple'", "'INPUT0'", "16", "15"
    )


def test_typed_contents_out_of_range(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="identity_int8")
    t = request.inputs.add(name="INPUT0", datatype="INT8", shape=[1, 2])
    t.contents.int_contents.extend([1, 1000])
    expect_rpc_error(
        stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'identity_int8'", "'INPUT0'", "INT8"
    )


def test_typed_contents_for_fp16(stub: Any) -> None:
    request = service_pb2.ModelInferRequest(model_name="identity_fp16")
    t = request.inputs.add(name="INPUT0", datatype="FP16", shape=[1, 2])
    t.contents.fp32_contents.extend([1.0, 2.0])
    expect_rpc_error(
        stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'INPUT0'", "FP16", "raw_input_contents"
    )


# ------------------------------------------------------------------ BYTES


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\x10\x00\x00\x00ab", "claims 16 bytes"),
        (b"\x02\x00", "length prefix"),
        (b"\x01\x00\x00\x00a", "needs 2 BYTES elements"),
        (b"\x01\x00\x00\x00a" * 3, "needs 2 BYTES elements"),
    ],
)
def test_bytes_bad_length_prefix(stub: Any, data: bytes, fragment: str) -> None:
    request = raw_request("identity_string", [("INPUT0", "BYTES", [1, 2], data)])
    expect_rpc_error(
        stub.ModelInfer, request, StatusCode.INVALID_ARGUMENT, "'identity_string'", "'INPUT0'", fragment
    )


# ------------------------------------------------------------------ failing model, outputs


def test_model_failure_is_internal_and_names_the_model(client: grpcclient.InferenceServerClient) -> None:
    inputs = [tensor("INPUT0", np.array([1, -2, 3], np.int32))]
    expect_error(client, "failing", inputs, StatusCode.INTERNAL, "model 'failing_0_0'", "negative input")
    ok = client.infer("failing", [tensor("INPUT0", np.array([1, 2], np.int32))])
    np.testing.assert_array_equal(ok.as_numpy("OUTPUT0"), [1, 2])


def test_unknown_requested_output(client: grpcclient.InferenceServerClient) -> None:
    outputs = [grpcclient.InferRequestedOutput("NOPE")]
    expect_error(
        client,
        "simple",
        good_inputs("simple"),
        StatusCode.INVALID_ARGUMENT,
        "'NOPE'",
        "'simple'",
        outputs=outputs,
    )


def test_classification_of_bytes_output(client: grpcclient.InferenceServerClient) -> None:
    t = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
    t.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=np.object_))
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)]
    expect_error(
        client, "identity_string", [t], StatusCode.INVALID_ARGUMENT, "'OUTPUT0'", "numeric", outputs=outputs
    )


# ------------------------------------------------------------------ shared memory


@pytest.fixture
def region(client: grpcclient.InferenceServerClient) -> Iterator[tuple[str, Any]]:
    name = f"grpc_err_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, f"/{name}", 64)
    shm.set_shared_memory_region(handle, [np.ones(16, np.int32)])
    client.register_system_shared_memory(name, f"/{name}", 64)
    try:
        yield name, handle
    finally:
        client.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(handle)


def test_unregistered_region(client: grpcclient.InferenceServerClient) -> None:
    t = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    t.set_shared_memory("never_registered", 64)
    inputs = [t, tensor("INPUT1", np.ones((1, 16), np.int32))]
    expect_error(client, "simple", inputs, StatusCode.NOT_FOUND, "'never_registered'", "'INPUT0'")


def test_region_too_small_for_input(
    client: grpcclient.InferenceServerClient, region: tuple[str, Any]
) -> None:
    name, _ = region
    t = grpcclient.InferInput("INPUT0", [2, 16], "INT32")
    t.set_shared_memory(name, 128)
    inputs = [t, tensor("INPUT1", np.ones((2, 16), np.int32))]
    expect_error(client, "simple", inputs, StatusCode.INVALID_ARGUMENT, f"'{name}'", "'INPUT0'", "64 bytes")


def test_region_byte_size_not_matching_shape(
    client: grpcclient.InferenceServerClient, region: tuple[str, Any]
) -> None:
    name, _ = region
    t = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    t.set_shared_memory(name, 32)
    inputs = [t, tensor("INPUT1", np.ones((1, 16), np.int32))]
    expect_error(client, "simple", inputs, StatusCode.INVALID_ARGUMENT, "'INPUT0'", "32 bytes")


def test_region_too_small_for_output(
    client: grpcclient.InferenceServerClient, region: tuple[str, Any]
) -> None:
    name, _ = region
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(name, 32)
    expect_error(
        client,
        "simple",
        good_inputs("simple"),
        StatusCode.INVALID_ARGUMENT,
        "'OUTPUT0'",
        f"'{name}'",
        outputs=[out],
    )


def test_register_errors(client: grpcclient.InferenceServerClient, region: tuple[str, Any]) -> None:
    name, _ = region
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory(name, f"/{name}", 64)
    assert info.value.status() == str(StatusCode.ALREADY_EXISTS) and name in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("grpc_missing", "/grpc_no_such_key_xyz", 64)
    assert (
        info.value.status() == str(StatusCode.INVALID_ARGUMENT)
        and "grpc_no_such_key_xyz" in info.value.message()
    )
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("grpc_too_big", f"/{name}", 4096)
    assert info.value.status() == str(StatusCode.INVALID_ARGUMENT) and "4096" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.get_system_shared_memory_status("grpc_not_there")
    assert info.value.status() == str(StatusCode.NOT_FOUND) and "grpc_not_there" in info.value.message()


def test_cuda_shared_memory_unsupported(client: grpcclient.InferenceServerClient) -> None:
    # as over HTTP (test_http_shm.py): registering is UNIMPLEMENTED (HTTP 501), naming the
    # reason; there are never regions to list or unregister, so clients that clean up every kind
    # of region (perf_analyzer's UnregisterAllSharedMemory) succeed
    with pytest.raises(InferenceServerException) as info:
        client.register_cuda_shared_memory("gpu0", b"\x00" * 64, 0, 64)
    assert info.value.status() == str(StatusCode.UNIMPLEMENTED)
    assert "CUDA shared memory is not supported" in info.value.message()
    assert list(client.get_cuda_shared_memory_status().regions) == []
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    with pytest.raises(InferenceServerException) as info:
        client.get_cuda_shared_memory_status("gpu0")
    assert info.value.status() == str(StatusCode.NOT_FOUND) and "'gpu0'" in info.value.message()
    client.unregister_cuda_shared_memory()
    client.unregister_cuda_shared_memory("gpu0")


# ------------------------------------------------------------------ limits


def test_request_over_size_limit(server_factory: Any) -> None:
    small = server_factory.start("--max-request-bytes=4096", listeners="grpc")
    with grpcclient.InferenceServerClient(small.grpc_url) as c:
        big = [tensor("INPUT0", np.ones((1, 2048), np.int32))]
        with pytest.raises(InferenceServerException) as info:
            c.infer("identity_int32", big)
        assert info.value.status() == str(StatusCode.RESOURCE_EXHAUSTED)
        ok = c.infer("identity_int32", [tensor("INPUT0", np.ones((1, 16), np.int32))])
        assert ok.as_numpy("OUTPUT0").shape == (1, 16)
