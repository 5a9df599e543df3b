"""Bad requests get the right status and a message naming the model/tensor and the problem;
afterwards the server serves as before."""

from __future__ import annotations

import http.client
import json
import struct
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

A = np.arange(16, dtype=np.int32).reshape(1, 16)
RAW_A = A.tobytes()


def request(
    server: Any, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else {}
    finally:
        conn.close()


def infer_raw(
    server: Any, header: Any, binary: bytes = b"", model: str = "simple", **extra: str
) -> tuple[int, str]:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    headers = dict(extra)
    if binary or "Inference-Header-Content-Length" in headers:
        headers.setdefault("Inference-Header-Content-Length", str(len(head)))
    status, body = request(server, "POST", f"/v2/models/{model}/infer", head + binary, headers)
    return status, str(body.get("error", body))


def tensor(name: str, shape: list[int], datatype: str = "INT32", **params: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "shape": shape, "datatype": datatype}
    if "data" in params:
        out["data"] = params.pop("data")
    if params:
        out["parameters"] = params
    return out


def good_inputs(binary: bool = True) -> list[dict[str, Any]]:
    if binary:
        return [tensor(n, [1, 16], binary_data_size=64) for n in ("INPUT0", "INPUT1")]
    return [tensor(n, [1, 16], data=A.reshape(-1).tolist()) for n in ("INPUT0", "INPUT1")]


def client_inputs(*specs: tuple[str, np.ndarray, str]) -> list[httpclient.InferInput]:
    inputs = []
    for name, value, datatype in specs:
        t = httpclient.InferInput(name, list(value.shape), datatype)
        t.set_data_from_numpy(value)
        inputs.append(t)
    return inputs


def expect(exc: pytest.ExceptionInfo[InferenceServerException], status: str, *fragments: str) -> None:
    assert exc.value.status() == status, exc.value.message()
    for fragment in fragments:
        assert fragment in exc.value.message()


# ------------------------------------------------------------------ through the client


def test_unknown_model_and_version(client: httpclient.InferenceServerClient) -> None:
    inputs = client_inputs(("INPUT0", A, "INT32"), ("INPUT1", A, "INT32"))
    with pytest.raises(InferenceServerException) as err:
        client.infer("no_such_model", inputs)
    expect(err, "404", "no_such_model")
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs, model_version="9")
    expect(err, "404", "Request for unknown model: 'simple' version 9 is not found")
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("no_such_model")
    expect(err, "404", "no_such_model")
    with pytest.raises(InferenceServerException) as err:
        client.get_model_config("simple", "abc")
    expect(err, "404", "abc")
    assert not client.is_model_ready("no_such_model")


def test_missing_and_extra_inputs(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", client_inputs(("INPUT0", A, "INT32")))
    expect(err, "400", "'simple'", "missing required input(s) ['INPUT1']")
    with pytest.raises(InferenceServerException) as err:
        client.infer(
            "simple", client_inputs(("INPUT0", A, "INT32"), ("INPUT1", A, "INT32"), ("EXTRA", A, "INT32"))
        )
    expect(err, "400", "unexpected inference input 'EXTRA'", "'simple'")


def test_wrong_datatype_and_shape(client: httpclient.InferenceServerClient) -> None:
    as_float = A.astype(np.float32)
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", client_inputs(("INPUT0", as_float, "FP32"), ("INPUT1", A, "INT32")))
    expect(err, "400", "'INPUT0'", "FP32", "INT32", "'simple'")
    short = np.arange(15, dtype=np.int32).reshape(1, 15)
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", client_inputs(("INPUT0", short, "INT32"), ("INPUT1", short, "INT32")))
    expect(err, "400", "unexpected shape for input 'INPUT0'", "'simple'", "[16]", "[15]")


def test_unknown_requested_output(client: httpclient.InferenceServerClient) -> None:
    inputs = client_inputs(("INPUT0", A, "INT32"), ("INPUT1", A, "INT32"))
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", inputs, outputs=[httpclient.InferRequestedOutput("NOPE")])
    expect(err, "400", "'NOPE'", "'simple'")


def test_failing_and_broken_models(client: httpclient.InferenceServerClient) -> None:
    good = np.array([1, 2], dtype=np.int32)
    result = client.infer("failing", client_inputs(("INPUT0", good, "INT32")))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), good)
    with pytest.raises(InferenceServerException) as err:
        client.infer("failing", client_inputs(("INPUT0", -good, "INT32")))
    expect(err, "500", "model 'failing_0_0'", "negative input")
    assert not client.is_model_ready("broken")
    with pytest.raises(InferenceServerException) as err:
        client.infer("broken", client_inputs(("INPUT0", good, "INT32")))
    expect(err, "503", "'broken'", "broken on purpose")


# ------------------------------------------------------------------ malformed bodies


def test_malformed_json(server: Any) -> None:
    status, message = infer_raw(server, b'{"inputs": [')
    assert status == 400 and "malformed inference request JSON" in message
    status, message = infer_raw(server, b"\xff\xfe{}")
    assert status == 400 and "malformed" in message
    status, message = infer_raw(server, b"[1, 2]")
    assert status == 400 and "must be an object" in message and "'simple'" in message
    status, message = infer_raw(server, {"inputs": {"INPUT0": 1}})
    assert status == 400 and "'inputs' must be an array" in message
    status, message = infer_raw(
        server, {"inputs": [{"shape": [1, 16], "datatype": "INT32", "data": [0] * 16}]}
    )
    assert status == 400 and "no string 'name'" in message
    status, message = infer_raw(server, {"inputs": good_inputs(False), "id": 7})
    assert status == 400 and "'id' must be a string" in message


def test_bad_tensor_descriptions(server: Any) -> None:
    inputs = good_inputs(False)
    inputs[0]["datatype"] = "FP8"
    status, message = infer_raw(server, {"inputs": inputs})
    assert status == 400 and "input 'INPUT0': unknown datatype 'FP8'" in message
    inputs = good_inputs(False)
    inputs[1]["shape"] = [1, -16]
    status, message = infer_raw(server, {"inputs": inputs})
    assert status == 400 and "input 'INPUT1'" in message and "shape" in message
    inputs = good_inputs(False)
    inputs[0]["data"] = list(range(15))
    status, message = infer_raw(server, {"inputs": inputs})
    assert status == 400 and "input 'INPUT0'" in message and "16 elements, got 15" in message
    inputs = good_inputs(False)
    inputs[0]["data"] = ["a"] * 16
    status, message = infer_raw(server, {"inputs": inputs})
    assert status == 400 and "input 'INPUT0'" in message and "INT32" in message
    inputs = good_inputs(False)
    inputs[0]["parameters"] = {"binary_data_size": 64}
    status, message = infer_raw(server, {"inputs": inputs}, RAW_A)
    assert status == 400 and "input 'INPUT0' must set exactly one of 'data'" in message
    inputs = good_inputs(False)
    inputs.append(dict(inputs[0]))
    status, message = infer_raw(server, {"inputs": inputs})
    assert status == 400 and "'INPUT0' appears more than once" in message


def test_binary_body_errors(server: Any) -> None:
    header = {"inputs": good_inputs(True)}
    # the second tensor is cut short
    status, message = infer_raw(server, header, RAW_A + RAW_A[:32])
    assert status == 400 and "input 'INPUT1'" in message and "truncated" in message
    # binary_data_size disagrees with the shape
    inputs = good_inputs(True)
    inputs[0]["parameters"]["binary_data_size"] = 60
    status, message = infer_raw(server, {"inputs": inputs}, RAW_A[:60] + RAW_A)
    assert status == 400 and "input 'INPUT0'" in message and "60 bytes" in message and "64" in message
    # bytes left over after the last input
    status, message = infer_raw(server, header, RAW_A + RAW_A + b"\0\0\0\0")
    assert status == 400 and "4 bytes of binary data follow" in message
    # the header claims more than the whole body
    head = json.dumps(header).encode()
    status, message = infer_raw(
        server, head, RAW_A, **{"Inference-Header-Content-Length": str(len(head) + 500)}
    )
    assert status == 400 and "Inference-Header-Content-Length" in message and "only" in message
    status, message = infer_raw(server, head, RAW_A, **{"Inference-Header-Content-Length": "ten"})
    assert status == 400 and "Inference-Header-Content-Length must be a non-negative integer" in message
    # a header length that cuts the JSON short
    status, message = infer_raw(server, head, RAW_A + RAW_A, **{"Inference-Header-Content-Length": "20"})
    assert status == 400 and "malformed" in message


def test_bytes_length_prefix_errors(server: Any) -> None:
    good = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 0)
    header = {"inputs": [tensor("INPUT0", [1, 2], "BYTES", binary_data_size=len(good))]}
    status, _ = infer_raw(server, header, good, model="identity_string")
    assert status == 200
    claims_too_much = struct.pack("<I", 2) + b"hi" + struct.pack("<I", 50) + b"abc"
    header = {"inputs": [tensor("INPUT0", [1, 2], "BYTES", binary_data_size=len(claims_too_much))]}
    status, message = infer_raw(server, header, claims_too_much, model="identity_string")
    assert status == 400 and "input 'INPUT0'" in message and "claims 50 bytes" in message
    cut_prefix = struct.pack("<I", 2) + b"hi" + b"\x01\x00"
    header = {"inputs": [tensor("INPUT0", [1, 2], "BYTES", binary_data_size=len(cut_prefix))]}
    status, message = infer_raw(server, header, cut_prefix, model="identity_string")
    assert status == 400 and "length prefix" in message
    header = {"inputs": [tensor("INPUT0", [1, 3], "BYTES", binary_data_size=len(good))]}
    status, message = infer_raw(server, header, good, model="identity_string")
    assert status == 400 and "needs 3 BYTES elements" in message


def test_bad_parameters(server: Any) -> None:
    for parameters, fragment in [
        ({"priority": -1}, "'priority' must be an unsigned integer"),
        ({"timeout": "soon"}, "'timeout' must be an unsigned integer"),
        ({"sequence_id": 1.5}, "'sequence_id'"),
        ({"sequence_start": 1}, "'sequence_start' must be a boolean"),
        ({"binary_data_output": "yes"}, "'binary_data_output' must be a boolean"),
        ({"triton_enable_x": True}, "reserved"),
        ({"custom": {"nested": 1}}, "parameter 'custom'"),
    ]:
        status, message = infer_raw(server, {"inputs": good_inputs(False), "parameters": parameters})
        assert status == 400, parameters
        assert fragment in message, message
    outputs = [{"name": "OUTPUT0", "parameters": {"classification": "two"}}]
    status, message = infer_raw(server, {"inputs": good_inputs(False), "outputs": outputs})
    assert status == 400 and "output 'OUTPUT0'" in message and "'classification'" in message
    outputs = [{"name": "OUTPUT0", "parameters": {"binary_data": 1}}]
    status, message = infer_raw(server, {"inputs": good_inputs(False), "outputs": outputs})
    assert status == 400 and "'binary_data' must be a boolean" in message


def test_raw_binary_request_errors(server: Any) -> None:
    status, message = infer_raw(server, b"", RAW_A, **{"Inference-Header-Content-Length": "0"})
    assert status == 400 and "exactly one input" in message and "'simple'" in message
    status, message = infer_raw(
        server, b"", b"\0\0\0", model="identity_fp32", **{"Inference-Header-Content-Length": "0"}
    )
    assert status == 400 and "input 'INPUT0'" in message


def test_routes_and_methods(server: Any) -> None:
    status, body = request(server, "GET", "/v2/nothing/here")
    assert status == 404 and "unknown route" in body["error"]
    status, body = request(server, "GET", "/v1/models/simple")
    assert status == 404
    status, body = request(server, "GET", "/v2/models/simple/infer")
    assert status == 405 and "POST" in body["error"]
    status, body = request(server, "POST", "/v2/models/simple", b"{}")
    assert status == 405 and "GET" in body["error"]
    status, body = request(server, "DELETE", "/v2/health/live")
    assert status == 405


def test_server_still_serves_after_errors(client: httpclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    result = client.infer("simple", client_inputs(("INPUT0", A, "INT32"), ("INPUT1", A, "INT32")))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * A)


def test_request_size_limit(server_factory: Any) -> None:
    small = server_factory.start("--max-request-bytes", "2048", listeners="http")
    status, body = request(
        small, "POST", "/v2/models/simple/infer", json.dumps({"inputs": good_inputs(False)}).encode()
    )
    assert status == 200, body
    big = json.dumps({"inputs": good_inputs(False), "id": "x" * 4000}).encode()
    status, body = request(small, "POST", "/v2/models/simple/infer", big)
    assert status == 413 and "2048" in body["error"]
    # no Content-Length (chunked): the limit is enforced while reading
    conn = http.client.HTTPConnection("127.0.0.1", small.http_port, timeout=30)
    try:
        conn.request(
            "POST", "/v2/models/simple/infer", body=iter([big[:1500], big[1500:]]), encode_chunked=True
        )
        resp = conn.getresponse()
        assert resp.status == 413 and "2048" in json.loads(resp.read())["error"]
    finally:
        conn.close()
    # a decompressed body is held to the same limit
    import gzip

    status, body = request(
        small, "POST", "/v2/models/simple/infer", gzip.compress(big), {"Content-Encoding": "gzip"}
    )
    assert status == 413 and "decompressed" in body["error"]
