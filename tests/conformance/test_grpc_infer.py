"""gRPC inference through tritonclient: the same tests for a single model ("simple"), a Triton
ensemble ("simple_ensemble") and a YAML graph ("fanout"); every datatype; typed contents;
classification; shared memory; streaming; exact statistics."""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

pytestmark = pytest.mark.slow

Expect = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Case:
    model: str
    inputs: tuple[str, str]
    outputs: tuple[str, str]
    expect: Expect


CASES = [
    Case("simple", ("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1"), lambda a, b: (a + b, a - b)),
    Case("simple_ensemble", ("INPUT0", "INPUT1"), ("OUTPUT0", "OUTPUT1"), lambda a, b: (2 * a, 2 * b)),
    Case("fanout", ("a", "b"), ("total", "sum"), lambda a, b: (5 * a - b, a + b)),
]


@pytest.fixture(params=CASES, ids=[c.model for c in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    result: Case = request.param
    return result


def data(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, size=(rows, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(rows, 16), dtype=np.int32)
    return a, b


def inputs_for(case: Case, a: np.ndarray, b: np.ndarray, module: Any = grpcclient) -> list[Any]:
    out = []
    for name, array in zip(case.inputs, (a, b), strict=True):
        i = module.InferInput(name, list(array.shape), "INT32")
        i.set_data_from_numpy(array)
        out.append(i)
    return out


def check(case: Case, result: Any, a: np.ndarray, b: np.ndarray) -> None:
    want0, want1 = case.expect(a, b)
    np.testing.assert_array_equal(result.as_numpy(case.outputs[0]), want0)
    np.testing.assert_array_equal(result.as_numpy(case.outputs[1]), want1)


def stats_of(client: grpcclient.InferenceServerClient, model: str) -> Any:
    return client.get_inference_statistics(model).model_stats[0]


# ------------------------------------------------------------------ the same tests for each case


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_infer_raw(case: Case, client: grpcclient.InferenceServerClient, rows: int) -> None:
    a, b = data(rows, rows)
    result = client.infer(case.model, inputs_for(case, a, b))
    check(case, result, a, b)
    response = result.get_response()
    assert response.model_name == case.model
    assert response.model_version == "1"
    assert [o.name for o in response.outputs] == list(case.outputs)
    assert all(o.datatype == "INT32" and list(o.shape) == [rows, 16] for o in response.outputs)


def test_infer_explicit_version(case: Case, client: grpcclient.InferenceServerClient) -> None:
    a, b = data(1)
    check(case, client.infer(case.model, inputs_for(case, a, b), model_version="1"), a, b)


def test_requested_output_subset(case: Case, client: grpcclient.InferenceServerClient) -> None:
    a, b = data(2)
    wanted = [grpcclient.InferRequestedOutput(case.outputs[1])]
    result = client.infer(case.model, inputs_for(case, a, b), outputs=wanted)
    assert [o.name for o in result.get_response().outputs] == [case.outputs[1]]
    np.testing.assert_array_equal(result.as_numpy(case.outputs[1]), case.expect(a, b)[1])
    assert result.as_numpy(case.outputs[0]) is None


def test_request_id_and_parameters(case: Case, client: grpcclient.InferenceServerClient) -> None:
    a, b = data(1)
    result = client.infer(
        case.model,
        inputs_for(case, a, b),
        request_id="req-42",
        priority=1,
        timeout=10_000_000,
        parameters={"custom": "x", "flag": True, "count": 3, "ratio": 0.5},
    )
    assert result.get_response().id == "req-42"
    check(case, result, a, b)


def test_typed_contents(case: Case, stub: Any) -> None:
    a, b = data(2)
    request = service_pb2.ModelInferRequest(model_name=case.model, id="typed")
    for name, array in zip(case.inputs, (a, b), strict=True):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=list(array.shape))
        tensor.contents.int_contents.extend(array.reshape(-1).tolist())
    response = stub.ModelInfer(request)
    assert response.id == "typed"
    want = case.expect(a, b)
    for i, out in enumerate(response.outputs):
        got = np.frombuffer(response.raw_output_contents[i], dtype=np.int32).reshape(list(out.shape))
        np.testing.assert_array_equal(got, want[case.outputs.index(out.name)])


def test_async_infer_callback(case: Case, client: grpcclient.InferenceServerClient) -> None:
    done: queue.Queue[tuple[Any, Any]] = queue.Queue()
    sent = [data(1, seed) for seed in range(4)]
    for a, b in sent:
        client.async_infer(
            case.model, inputs_for(case, a, b), lambda result, error: done.put((result, error))
        )
    results = [done.get(timeout=30) for _ in sent]
    assert all(error is None for _, error in results)
    got = sorted(tuple(r.as_numpy(case.outputs[1]).reshape(-1).tolist()) for r, _ in results)
    want = sorted(tuple(case.expect(a, b)[1].reshape(-1).tolist()) for a, b in sent)
    assert got == want


async def test_aio_infer_concurrent(case: Case, server: Any) -> None:
    async with aioclient.InferenceServerClient(server.grpc_url) as c:
        sent = [data(2, seed) for seed in range(8)]
        results = await asyncio.gather(
            *(
                c.infer(case.model, inputs_for(case, a, b, aioclient), request_id=str(i))
                for i, (a, b) in enumerate(sent)
            )
        )
        for (a, b), result in zip(sent, results, strict=True):
            check(case, result, a, b)
        assert await c.is_model_ready(case.model)


def test_stream_in_order_and_error_does_not_end_it(
    case: Case, client: grpcclient.InferenceServerClient
) -> None:
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        sent = [data(1 + i % 3, i) for i in range(6)]
        for i, (a, b) in enumerate(sent):
            if i == 2:  # one bad request: the second input is missing
                bad = inputs_for(case, a, b)[:1]
                client.async_stream_infer(case.model, bad, request_id="bad")
                continue
            client.async_stream_infer(case.model, inputs_for(case, a, b), request_id=f"r{i}")
        got = [responses.get(timeout=30) for _ in sent]
        for i, (result, error) in enumerate(got):
            if i == 2:
                assert result is None
                assert isinstance(error, InferenceServerException)
                assert case.model in error.message() and case.inputs[1] in error.message()
                continue
            assert error is None, error
            assert result.get_response().id == f"r{i}"
            check(case, result, *sent[i])
        # the stream is still usable after the error
        a, b = data(2, 99)
        client.async_stream_infer(case.model, inputs_for(case, a, b), request_id="after")
        result, error = responses.get(timeout=30)
        assert error is None and result.get_response().id == "after"
        check(case, result, a, b)
    finally:
        client.stop_stream()


async def test_aio_stream(case: Case, server: Any) -> None:
    sent = [data(1, i) for i in range(5)]

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i, (a, b) in enumerate(sent):
            yield {
                "model_name": case.model,
                "inputs": inputs_for(case, a, b, aioclient),
                "request_id": str(i),
            }

    async with aioclient.InferenceServerClient(server.grpc_url) as c:
        got = []
        async for result, error in c.stream_infer(requests()):
            assert error is None, error
            got.append(result)
            if len(got) == len(sent):
                break
    assert [r.get_response().id for r in got] == [str(i) for i in range(len(sent))]
    for (a, b), result in zip(sent, got, strict=True):
        check(case, result, a, b)


def test_shared_memory(case: Case, client: grpcclient.InferenceServerClient) -> None:
    a, b = data(2, 5)
    nbytes = a.nbytes
    tag = uuid.uuid4().hex[:8]
    names = {k: f"grpc_{case.model}_{k}_{tag}" for k in ("in", "out")}
    handles = {
        "in": shm.create_shared_memory_region(names["in"], f"/{names['in']}", 2 * nbytes),
        "out": shm.create_shared_memory_region(names["out"], f"/{names['out']}", 2 * nbytes),
    }
    try:
        shm.set_shared_memory_region(handles["in"], [a, b])
        for k in ("in", "out"):
            client.register_system_shared_memory(names[k], f"/{names[k]}", 2 * nbytes)
        status = client.get_system_shared_memory_status(names["in"])
        assert status.regions[names["in"]].byte_size == 2 * nbytes
        ins = []
        for i, name in enumerate(case.inputs):
            tensor = grpcclient.InferInput(name, [2, 16], "INT32")
            tensor.set_shared_memory(names["in"], nbytes, offset=i * nbytes)
            ins.append(tensor)
        outs = []
        for i, name in enumerate(case.outputs):
            out = grpcclient.InferRequestedOutput(name)
            out.set_shared_memory(names["out"], nbytes, offset=i * nbytes)
            outs.append(out)
        result = client.infer(case.model, ins, outputs=outs)
        want = case.expect(a, b)
        for i, name in enumerate(case.outputs):
            meta = result.get_output(name)
            assert meta.parameters["shared_memory_region"].string_param == names["out"]
            got = shm.get_contents_as_numpy(handles["out"], np.int32, list(meta.shape), offset=i * nbytes)
            np.testing.assert_array_equal(got, want[i])
        # mixed: the first output to shared memory, the second inline
        result = client.infer(
            case.model, ins, outputs=[outs[0], grpcclient.InferRequestedOutput(case.outputs[1])]
        )
        np.testing.assert_array_equal(result.as_numpy(case.outputs[1]), want[1])
    finally:
        for k in ("in", "out"):
            client.unregister_system_shared_memory(names[k])
            shm.destroy_shared_memory_region(handles[k])
    assert names["in"] not in client.get_system_shared_memory_status().regions


def test_statistics_exact(case: Case, client: grpcclient.InferenceServerClient) -> None:
    before = stats_of(client, case.model)
    for rows in (1, 2, 3):
        a, b = data(rows)
        client.infer(case.model, inputs_for(case, a, b))
    a, b = data(1)
    with pytest.raises(InferenceServerException):
        client.infer(case.model, inputs_for(case, a[:, :15], b[:, :15]))
    after = stats_of(client, case.model)
    assert after.name == case.model and after.version == "1"
    assert after.inference_stats.success.count - before.inference_stats.success.count == 3
    assert after.inference_stats.fail.count - before.inference_stats.fail.count == 1
    assert after.inference_count - before.inference_count == 6
    assert after.execution_count - before.execution_count == 3
    assert after.inference_stats.success.ns > before.inference_stats.success.ns
    assert after.last_inference > 0


def test_metadata_config_ready(case: Case, client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready(case.model)
    assert client.is_model_ready(case.model, "1")
    meta = client.get_model_metadata(case.model)
    assert meta.name == case.model and list(meta.versions) == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [
        (n, "INT32", [-1, 16]) for n in case.inputs
    ]
    assert {t.name for t in meta.outputs} == set(case.outputs)
    config = client.get_model_config(case.model).config
    assert config.name == case.model and config.max_batch_size == 8
    assert {i.name for i in config.input} == set(case.inputs)
    if case.model != "simple":
        assert meta.platform == config.platform == "ensemble"
        assert any(s.model_name == "simple" for s in config.ensemble_scheduling.step)


# ------------------------------------------------------------------ every datatype

DTYPES: dict[str, Any] = {
    "bool": np.bool_,
    "uint8": np.uint8,
    "uint16": np.uint16,
    "uint32": np.uint32,
    "uint64": np.uint64,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "fp16": np.float16,
    "fp32": np.float32,
    "fp64": np.float64,
    "bf16": ml_dtypes.bfloat16,
    "string": np.object_,
}
TRITON = {
    "bool": "BOOL",
    "fp16": "FP16",
    "fp32": "FP32",
    "fp64": "FP64",
    "bf16": "BF16",
    "string": "BYTES",
}


def sample(kind: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(7)
    dtype = DTYPES[kind]
    if kind == "bool":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if kind == "string":
        items = [b"", b"a", "\u00e9t\u00e9".encode(), b"\x00\x01\xff", b"x" * 300]
        flat = [items[i % len(items)] for i in range(int(np.prod(shape)))]
        return np.array(flat, dtype=np.object_).reshape(shape)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        edges = np.array([info.min, info.max, 0, 1], dtype=dtype)
        values = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        values.reshape(-1)[: edges.size] = edges[: values.size]
        return values
    return (rng.standard_normal(size=shape) * 100).astype(dtype)


def triton_name(kind: str) -> str:
    return TRITON.get(kind, kind.upper())


@pytest.mark.parametrize("kind", list(DTYPES))
def test_datatype_round_trip(kind: str, client: grpcclient.InferenceServerClient) -> None:
    array = sample(kind, (2, 5))
    tensor = grpcclient.InferInput("INPUT0", [2, 5], triton_name(kind))
    tensor.set_data_from_numpy(array)
    result = client.infer(f"identity_{kind}", [tensor])
    out = result.get_output("OUTPUT0")
    assert out.datatype == triton_name(kind) and list(out.shape) == [2, 5]
    got = result.as_numpy("OUTPUT0")
    if kind == "string":
        assert got.tolist() == array.tolist()
    else:
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)


@pytest.mark.parametrize("kind", ["int32", "string"])
def test_datatype_empty_and_single(kind: str, client: grpcclient.InferenceServerClient) -> None:
    for shape in [(1, 0), (1, 1)]:
        array = sample(kind, shape)
        tensor = grpcclient.InferInput("INPUT0", list(shape), triton_name(kind))
        tensor.set_data_from_numpy(array)
        result = client.infer(f"identity_{kind}", [tensor])
        assert list(result.get_output("OUTPUT0").shape) == list(shape)


TYPED = {
    "bool": "bool_contents",
    "uint8": "uint_contents",
    "uint16": "uint_contents",
    "uint32": "uint_contents",
    "uint64": "uint64_contents",
    "int8": "int_contents",
    "int16": "int_contents",
    "int32": "int_contents",
    "int64": "int64_contents",
    "fp32": "fp32_contents",
    "fp64": "fp64_contents",
    "string": "bytes_contents",
}


@pytest.mark.parametrize("kind", list(TYPED))
def test_typed_contents_round_trip(kind: str, stub: Any) -> None:
    array = sample(kind, (2, 3))
    request = service_pb2.ModelInferRequest(model_name=f"identity_{kind}")
    tensor = request.inputs.add(name="INPUT0", datatype=triton_name(kind), shape=[2, 3])
    getattr(tensor.contents, TYPED[kind]).extend(array.reshape(-1).tolist())
    response = stub.ModelInfer(request)
    raw = response.raw_output_contents[0]
    if kind == "string":
        assert raw == serialize_byte_tensor(array).item()
    else:
        np.testing.assert_array_equal(np.frombuffer(raw, dtype=array.dtype).reshape(2, 3), array)


def test_bytes_from_str_array(client: grpcclient.InferenceServerClient) -> None:
    array = np.array([["hello", "w\u00f6rld"]], dtype=np.object_)
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
    tensor.set_data_from_numpy(array)
    got = client.infer("identity_string", [tensor]).as_numpy("OUTPUT0")
    assert got.tolist() == [[b"hello", "w\u00f6rld".encode()]]


def test_bytes_shared_memory(client: grpcclient.InferenceServerClient) -> None:
    array = np.array([[b"abc", b"", b"\x00zz"]], dtype=np.object_)
    serialized = serialize_byte_tensor(array)
    payload = serialized.item()
    name = f"grpc_str_{uuid.uuid4().hex[:8]}"
    handle = shm.create_shared_memory_region(name, f"/{name}", 2 * len(payload))
    try:
        shm.set_shared_memory_region(handle, [serialized])
        client.register_system_shared_memory(name, f"/{name}", 2 * len(payload))
        tensor = grpcclient.InferInput("INPUT0", [1, 3], "BYTES")
        tensor.set_shared_memory(name, len(payload))
        out = grpcclient.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(name, len(payload), offset=len(payload))
        result = client.infer("identity_string", [tensor], outputs=[out])
        meta = result.get_output("OUTPUT0")
        assert meta.parameters["shared_memory_byte_size"].int64_param == len(payload)
        got = shm.get_contents_as_numpy(handle, np.object_, [1, 3], offset=len(payload))
        assert got.tolist() == array.tolist()
    finally:
        client.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(handle)


# ------------------------------------------------------------------ classification


def test_classification(client: grpcclient.InferenceServerClient) -> None:
    array = np.array([[0.1, 0.9, 0.5, -1.0], [3.0, 1.0, 2.0, 0.0]], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(array)
    out = grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)
    result = client.infer("identity_fp32", [tensor], outputs=[out])
    got = result.as_numpy("OUTPUT0")
    assert result.get_output("OUTPUT0").datatype == "BYTES"
    assert got.shape == (2, 2)
    assert [x.decode().split(":")[1] for x in got[0]] == ["1", "2"]
    assert [x.decode().split(":")[1] for x in got[1]] == ["0", "2"]
    assert float(got[0][0].decode().split(":")[0]) == pytest.approx(0.9)
