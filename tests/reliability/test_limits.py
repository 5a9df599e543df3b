"""Limits over the wire: request body size, tensor elements, BYTES element size and declared
shapes that do not match the data, over HTTP (JSON and binary), gRPC (raw and typed contents)
and shared memory. Each is refused with 400/413 (INVALID_ARGUMENT/RESOURCE_EXHAUSTED) naming
the tensor, before anything is allocated from it, and the server's memory does not grow."""

from __future__ import annotations

import json
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.grpc import service_pb2, service_pb2_grpc

pytestmark = pytest.mark.slow

MAX_BODY = 1 << 20
MAX_ELEMENTS = 4096
MAX_ELEMENT_BYTES = 1024
SERVER_FLAGS = (
    f"--max-request-bytes={MAX_BODY}",
    f"--max-tensor-elements={MAX_ELEMENTS}",
    f"--max-bytes-element={MAX_ELEMENT_BYTES}",
    "--allow-shm",
)
ROW = np.arange(16, dtype=np.int32).reshape(1, 16)


@pytest.fixture(scope="module")
def limited(module_server: Any) -> Any:
    """One server with small limits (SERVER_FLAGS) for the whole module."""
    return module_server


def infer_json(rel: Any, port: int, inputs: list[dict[str, Any]], model: str = "add_sub") -> tuple[int, str]:
    status, body = rel.post(port, f"/v2/models/{model}/infer", json.dumps({"inputs": inputs}).encode())
    return status, str(body.get("error", body))


def infer_binary(
    rel: Any, port: int, inputs: list[dict[str, Any]], blob: bytes, model: str = "add_sub"
) -> tuple[int, str]:
    head = json.dumps({"inputs": inputs}).encode()
    headers = {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}
    status, body = rel.post(port, f"/v2/models/{model}/infer", head + blob, headers)
    return status, str(body.get("error", body))


def pair(shape: list[Any], datatype: str = "INT32", **params: Any) -> list[dict[str, Any]]:
    """INPUT0 with ``shape`` (and ``params``/data), INPUT1 a good [1, 16] row."""
    bad: dict[str, Any] = {"name": "INPUT0", "shape": shape, "datatype": datatype}
    if "data" in params:
        bad["data"] = params.pop("data")
    if params:
        bad["parameters"] = params
    good = {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": ROW.reshape(-1).tolist()}
    return [bad, good]


# ------------------------------------------------------------------ HTTP JSON


@pytest.mark.parametrize(
    "shape,status,fragment",
    [
        ([1, MAX_ELEMENTS + 1], 413, "over the server's limit of 4096 elements"),
        ([2**40, 2**40], 413, "over the server's limit"),
        ([0, 2**62], 413, "dimension 4611686018427387904"),
        ([10**30], 413, "over the server's limit"),
        ([-1, 16], 400, "dims must be >= 0"),
        ([1.5, 16], 400, "non-negative integers"),
        (["1", 16], 400, "non-negative integers"),
        ([True, 16], 400, "non-negative integers"),
        ([1] * 40, 400, "40 dimensions"),
    ],
)
def test_json_absurd_shapes(rel: Any, limited: Any, shape: list[Any], status: int, fragment: str) -> None:
    code, message = infer_json(rel, limited.http_port, pair(shape, data=[1] * 16))
    assert code == status, message
    assert "'INPUT0'" in message and fragment in message, message


@pytest.mark.parametrize("count", [15, 17, 0])
def test_json_data_not_matching_shape(rel: Any, limited: Any, count: int) -> None:
    code, message = infer_json(rel, limited.http_port, pair([1, 16], data=[1] * count))
    assert code == 400 and "'INPUT0'" in message and "16 elements" in message, message


def test_json_bytes_element_over_limit(rel: Any, limited: Any) -> None:
    big = "x" * (MAX_ELEMENT_BYTES + 1)
    inputs = [{"name": "INPUT0", "shape": [2], "datatype": "BYTES", "data": ["ok", big]}]
    code, message = infer_json(rel, limited.http_port, inputs, model="text")
    assert code == 413 and "'INPUT0'" in message and "BYTES element 1" in message, message
    inputs[0]["data"] = ["ok", "x" * MAX_ELEMENT_BYTES]
    assert infer_json(rel, limited.http_port, inputs, model="text")[0] == 200


# ------------------------------------------------------------------ HTTP binary


@pytest.mark.parametrize("size", [0, 63, 65, 4096])
def test_binary_size_not_matching_shape(rel: Any, limited: Any, size: int) -> None:
    inputs = pair([1, 16], binary_data_size=size)
    code, message = infer_binary(rel, limited.http_port, inputs, b"\0" * size)
    assert code == 400 and "'INPUT0'" in message, message


def test_binary_absurd_shape_with_little_data(rel: Any, limited: Any) -> None:
    inputs = pair([2**31, 2**31], binary_data_size=64)
    code, message = infer_binary(rel, limited.http_port, inputs, b"\0" * 64)
    assert code == 413 and "'INPUT0'" in message, message


@pytest.mark.parametrize(
    "blob,status,fragment",
    [
        (struct.pack("<I", 2**31) + b"abc", 413, "BYTES element 0 has 2147483648 bytes"),
        (struct.pack("<I", MAX_ELEMENT_BYTES) + b"abc", 400, "claims 1024 bytes but only 3 remain"),
        (b"\x01\x00", 400, "4-byte length prefix"),
        (struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b", 400, "needs 1 BYTES elements"),
    ],
)
def test_binary_bytes_length_prefixes(
    rel: Any, limited: Any, blob: bytes, status: int, fragment: str
) -> None:
    inputs = [
        {"name": "INPUT0", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(blob)}}
    ]
    code, message = infer_binary(rel, limited.http_port, inputs, blob, model="text")
    assert code == status and "'INPUT0'" in message and fragment in message, message


def read_reply(sock: socket.socket) -> bytes:
    """One HTTP response off a raw socket: the head and its Content-Length of body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_body_over_limit_by_content_length(rel: Any, limited: Any) -> None:
    """Refused from the header alone: the server does not wait for (or buffer) a gigabyte."""
    with socket.create_connection(("127.0.0.1", limited.http_port), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n"
            b"Content-Type: application/json\r\n\r\n" + b"{" * 65536
        )
        started = time.monotonic()
        reply = read_reply(sock)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b"exceeds the server's limit" in reply
    assert time.monotonic() - started < 5


def test_chunked_body_over_limit(rel: Any, limited: Any) -> None:
    chunk = b"x" * 65536
    with socket.create_connection(("127.0.0.1", limited.http_port), timeout=10) as sock:
        sock.sendall(
            b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        try:
            for _ in range(MAX_BODY // len(chunk) + 1):  # the last chunk crosses the limit
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        except OSError:
            pass  # the server answered and closed while we were still sending
        reply = read_reply(sock)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]


def test_gzip_bomb(rel: Any, limited: Any) -> None:
    import gzip

    bomb = gzip.compress(b"[" + b"0," * (4 * MAX_BODY) + b"0]")
    assert len(bomb) < MAX_BODY
    status, body = rel.post(limited.http_port, "/v2/models/add_sub/infer", bomb, {"Content-Encoding": "gzip"})
    assert status == 413 and "decompressed" in body["error"], body


# ------------------------------------------------------------------ gRPC


@pytest.fixture(scope="module")
def stub(limited: Any) -> Iterator[Any]:
    channel = grpc.insecure_channel(limited.grpc_url)
    try:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    finally:
        channel.close()


def grpc_request(shape: list[int], raw: bytes | None = None, datatype: str = "INT32") -> Any:
    msg = service_pb2.ModelInferRequest(model_name="add_sub")
    bad = msg.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    good = msg.inputs.add(name="INPUT1", datatype="INT32", shape=[1, 16])
    if raw is None:
        bad.contents.int_contents.extend([1] * 16)
        good.contents.int_contents.extend(ROW.reshape(-1).tolist())
    else:
        msg.raw_input_contents.extend([raw, ROW.tobytes()])
    return msg


def grpc_error(stub: Any, msg: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(msg, timeout=30)
    return info.value.code(), str(info.value.details())


@pytest.mark.parametrize(
    "shape,raw,code,fragment",
    [
        ([1, MAX_ELEMENTS + 1], b"\0" * 4 * (MAX_ELEMENTS + 1), "RESOURCE_EXHAUSTED", "4096 elements"),
        ([2**40, 2**40], b"\0" * 64, "RESOURCE_EXHAUSTED", "over the server's limit"),
        ([0, 2**62], b"", "RESOURCE_EXHAUSTED", "dimension"),
        ([-5, 16], b"\0" * 64, "INVALID_ARGUMENT", "dims must be >= 0"),
        ([1] * 40, b"\0" * 4, "INVALID_ARGUMENT", "40 dimensions"),
        ([1, 16], b"\0" * 60, "INVALID_ARGUMENT", "got 60 bytes"),
        ([1, 16], b"\0" * 68, "INVALID_ARGUMENT", "got 68 bytes"),
    ],
)
def test_grpc_raw(stub: Any, shape: list[int], raw: bytes, code: str, fragment: str) -> None:
    status, message = grpc_error(stub, grpc_request(shape, raw))
    assert status == getattr(grpc.StatusCode, code), message
    assert "'INPUT0'" in message and fragment in message, message


@pytest.mark.parametrize(
    "shape,code,fragment",
    [
        ([1, 15], "INVALID_ARGUMENT", "holds 16"),
        ([1, 17], "INVALID_ARGUMENT", "holds 16"),
        ([2**40, 2**40], "RESOURCE_EXHAUSTED", "over the server's limit"),
    ],
)
def test_grpc_typed_contents(stub: Any, shape: list[int], code: str, fragment: str) -> None:
    status, message = grpc_error(stub, grpc_request(shape))
    assert status == getattr(grpc.StatusCode, code), message
    assert "'INPUT0'" in message and fragment in message, message


def test_grpc_bytes_element_over_limit(stub: Any) -> None:
    msg = service_pb2.ModelInferRequest(model_name="text")
    t = msg.inputs.add(name="INPUT0", datatype="BYTES", shape=[2])
    t.contents.bytes_contents.extend([b"ok", b"x" * (MAX_ELEMENT_BYTES + 1)])
    status, message = grpc_error(stub, msg)
    assert status == grpc.StatusCode.RESOURCE_EXHAUSTED and "BYTES element 1" in message, message
    raw = service_pb2.ModelInferRequest(model_name="text")
    raw.inputs.add(name="INPUT0", datatype="BYTES", shape=[1])
    raw.raw_input_contents.append(struct.pack("<I", 2**31 - 1) + b"abc")
    status, message = grpc_error(stub, raw)
    assert status == grpc.StatusCode.RESOURCE_EXHAUSTED and "'INPUT0'" in message, message


def test_grpc_message_over_limit(stub: Any) -> None:
    status, _ = grpc_error(stub, grpc_request([1, 16], b"\0" * (MAX_BODY + 16)))
    assert status == grpc.StatusCode.RESOURCE_EXHAUSTED


# ------------------------------------------------------------------ shared memory


@pytest.fixture
def region(rel: Any, limited: Any) -> Iterator[str]:
    name = f"rel-{uuid.uuid4().hex[:12]}"
    size = 1 << 20
    handle = shm.create_shared_memory_region(name, f"/{name}", size)
    try:
        body = json.dumps({"key": f"/{name}", "offset": 0, "byte_size": size}).encode()
        assert rel.post(limited.http_port, f"/v2/systemsharedmemory/region/{name}/register", body)[0] == 200
        yield name
    finally:
        rel.post(limited.http_port, f"/v2/systemsharedmemory/region/{name}/unregister")
        shm.destroy_shared_memory_region(handle)


@pytest.mark.parametrize(
    "shape,byte_size,status,fragment",
    [
        ([1, 16], 1 << 20, 400, "got 1048576 bytes of shared memory"),
        ([2**40, 2**40], 64, 413, "over the server's limit"),
        ([-1, 16], 64, 400, "dims must be >= 0"),
    ],
)
def test_shm_declared_size_checked_before_copy(
    rel: Any, limited: Any, region: str, shape: list[int], byte_size: int, status: int, fragment: str
) -> None:
    inputs = pair(shape, shared_memory_region=region, shared_memory_byte_size=byte_size)
    code, message = infer_json(rel, limited.http_port, inputs)
    assert code == status and "'INPUT0'" in message and fragment in message, message
    msg = grpc_request(shape, raw=None)
    del msg.inputs[0].contents.int_contents[:]
    msg.inputs[0].ClearField("contents")
    msg.inputs[0].parameters["shared_memory_region"].string_param = region
    msg.inputs[0].parameters["shared_memory_byte_size"].int64_param = byte_size
    with grpc.insecure_channel(limited.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        grpc_status, grpc_message = grpc_error(stub, msg)
    expected = grpc.StatusCode.RESOURCE_EXHAUSTED if status == 413 else grpc.StatusCode.INVALID_ARGUMENT
    assert grpc_status == expected and fragment in grpc_message, grpc_message


def test_shm_bytes_byte_size_bounded(rel: Any, limited: Any, region: str) -> None:
    inputs = [
        {
            "name": "INPUT0",
            "shape": [1],
            "datatype": "BYTES",
            "parameters": {"shared_memory_region": region, "shared_memory_byte_size": 1 << 20},
        }
    ]
    code, message = infer_json(rel, limited.http_port, inputs, model="text")
    assert code == 400 and "more than 1 BYTES elements can take" in message, message


# ------------------------------------------------------------------ memory


def test_memory_does_not_grow_under_absurd_requests(rel: Any, limited: Any) -> None:
    """A burst of oversized and absurd requests over both protocols leaves the server's RSS
    where it was (each one is refused before anything is allocated from it)."""
    port = limited.http_port
    channel = grpc.insecure_channel(limited.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

    def burst(rounds: int) -> None:
        for _ in range(rounds):
            assert infer_json(rel, port, pair([2**31, 2**31], data=[1] * 16))[0] == 413
            assert infer_binary(rel, port, pair([2**31, 2**31], binary_data_size=64), b"\0" * 64)[0] == 413
            blob = struct.pack("<I", 2**31) + b"x" * 60
            bytes_input = [
                {"name": "INPUT0", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 64}}
            ]
            assert infer_binary(rel, port, bytes_input, blob, model="text")[0] == 413
            assert (
                infer_binary(
                    rel, port, pair([1, 16], binary_data_size=MAX_BODY // 2), b"\0" * (MAX_BODY // 2)
                )[0]
                == 400
            )
            for msg in (
                grpc_request([2**40, 2**40], b"\0" * 64),
                grpc_request([1, 16], b"\0" * (MAX_BODY // 2)),
            ):
                with pytest.raises(grpc.RpcError):
                    stub.ModelInfer(msg, timeout=30)

    try:
        burst(20)  # warm up: allocator arenas, buffers of the largest (refused) bodies
        samples = [rel.rss(limited.process.pid)]
        started = time.monotonic()
        for _ in range(4):
            burst(50)
            samples.append(rel.rss(limited.process.pid))
        elapsed = time.monotonic() - started
    finally:
        channel.close()
    mib = [f"{x / 2**20:.1f}" for x in samples]
    print(f"\nRSS (MiB) after warm-up and after each 300 absurd requests: {mib} ({elapsed:.1f} s)")
    # the allocator settles within the first bursts (thread arenas, buffers of refused bodies);
    # what matters is that it stops growing: no request leaves anything behind
    assert samples[-1] - samples[0] < 32 * 2**20, mib
    assert samples[-1] - samples[-2] < 4 * 2**20, mib
    good = [
        {"name": n, "shape": [1, 16], "datatype": "INT32", "data": ROW.reshape(-1).tolist()}
        for n in ("INPUT0", "INPUT1")
    ]
    assert infer_json(rel, port, good)[0] == 200
