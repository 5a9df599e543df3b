"""Every datatype round trips through the identity_<dtype> models, as binary and as JSON."""

from __future__ import annotations

import json
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient

pytestmark = pytest.mark.slow

NUMERIC: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
}


def sample(datatype: str, rows: int = 2, cols: int = 5) -> np.ndarray:
    if datatype == "BYTES":
        words = [b"", b"alpha", "\u00fcber".encode(), b"x" * 300, b"tab\tnew\nline"]
        return np.array(
            [[words[(r + c) % len(words)] for c in range(cols)] for r in range(rows)], dtype=np.object_
        )
    dtype = NUMERIC[datatype]
    if datatype == "BOOL":
        flags: np.ndarray = np.arange(rows * cols).reshape(rows, cols) % 3 == 0
        return flags
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    if info is not None:
        # the extremes survive both encodings (JSON numbers are arbitrary-precision integers)
        values = np.linspace(0, 1, rows * cols)
        data = np.array([int(info.min + (int(info.max) - int(info.min)) * v) for v in values], dtype=object)
        data[0], data[-1] = info.min, info.max
        result: np.ndarray = data.astype(dtype).reshape(rows, cols)
        return result
    return (np.arange(rows * cols, dtype=np.float64).reshape(rows, cols) * 0.5 - 3.25).astype(dtype)


def model_for(datatype: str) -> str:
    return "identity_string" if datatype == "BYTES" else f"identity_{datatype.lower()}"


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if want.dtype == np.object_:
        # the client gives JSON BYTES back as str, binary BYTES as bytes
        flat = [x.encode() if isinstance(x, str) else x for x in got.reshape(-1).tolist()]
        assert flat == want.reshape(-1).tolist()
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


ALL = [*NUMERIC, "BYTES"]


@pytest.mark.parametrize("datatype", ALL)
def test_binary_round_trip(client: httpclient.InferenceServerClient, datatype: str) -> None:
    data = sample(datatype)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=True)
    result = client.infer(model_for(datatype), [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
    out = result.get_output("OUTPUT0")
    assert out["datatype"] == datatype
    assert "binary_data_size" in out["parameters"]
    assert_same(result.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("datatype", [d for d in ALL if d not in ("FP16", "BF16")])
def test_json_round_trip(client: httpclient.InferenceServerClient, datatype: str) -> None:
    data = sample(datatype)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=False)
    result = client.infer(
        model_for(datatype), [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    )
    out = result.get_output("OUTPUT0")
    assert out["datatype"] == datatype
    assert "data" in out and "parameters" not in out
    if datatype == "BYTES":
        # JSON carries BYTES as strings
        assert out["data"][:2] == ["", "alpha"]
    assert_same(result.as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_types_are_binary_unless_json_is_asked(
    server: Any, client: httpclient.InferenceServerClient, datatype: str
) -> None:
    data = sample(datatype)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=True)
    # the output is not named, so the default (JSON) applies: FP16/BF16 still come back binary
    body, header_length = httpclient.InferenceServerClient.generate_request_body([tensor])
    request = json.loads(body[:header_length])
    del request["parameters"]  # drop binary_data_output: the default output kind is JSON
    header = json.dumps(request).encode()
    raw_data = body[header_length:]
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request(
            "POST",
            f"/v2/models/{model_for(datatype)}/infer",
            body=header + raw_data,
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
        resp = conn.getresponse()
        raw = resp.read()
        assert resp.status == 200, raw
        length = int(resp.getheader("Inference-Header-Content-Length") or "-1")
    finally:
        conn.close()
    result = httpclient.InferenceServerClient.parse_response_body(raw, header_length=length)
    assert result.get_output("OUTPUT0")["parameters"]["binary_data_size"] == data.nbytes
    assert_same(result.as_numpy("OUTPUT0"), data)
    # explicitly asked for JSON: numbers, which convert back exactly
    result = client.infer(
        model_for(datatype), [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    )
    assert len(result.get_output("OUTPUT0")["data"]) == data.size
    assert_same(result.as_numpy("OUTPUT0"), data)


def test_fp16_json_input(client: httpclient.InferenceServerClient) -> None:
    data = sample("FP16")
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP16")
    tensor.set_data_from_numpy(data, binary_data=False)
    result = client.infer("identity_fp16", [tensor])
    assert_same(result.as_numpy("OUTPUT0"), data)


def test_bytes_not_utf8_fall_back_to_binary(client: httpclient.InferenceServerClient) -> None:
    data = np.array([[b"\xff\xfe", b"ok", b"\x80"]], dtype=np.object_)
    tensor = httpclient.InferInput("INPUT0", [1, 3], "BYTES")
    tensor.set_data_from_numpy(data, binary_data=True)
    result = client.infer(
        "identity_string", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    )
    out = result.get_output("OUTPUT0")
    assert "data" not in out and out["parameters"]["binary_data_size"] == 4 * 3 + 2 + 2 + 1
    assert_same(result.as_numpy("OUTPUT0"), data)


def test_empty_tensor(client: httpclient.InferenceServerClient) -> None:
    for datatype in ("FP32", "BYTES"):
        data = np.zeros((1, 0), dtype=np.object_ if datatype == "BYTES" else np.float32)
        tensor = httpclient.InferInput("INPUT0", [1, 0], datatype)
        tensor.set_data_from_numpy(data, binary_data=True)
        result = client.infer(model_for(datatype), [tensor])
        assert result.get_output("OUTPUT0")["shape"] == [1, 0]
        assert result.as_numpy("OUTPUT0").shape == (1, 0)


@pytest.mark.parametrize("datatype", ["INT64", "FP64", "BYTES", "BOOL"])
async def test_aio_round_trip(server: Any, datatype: str) -> None:
    data = sample(datatype, rows=3)
    async with aiohttpclient.InferenceServerClient(server.http_url) as client:
        for binary in (True, False):
            tensor = aiohttpclient.InferInput("INPUT0", list(data.shape), datatype)
            tensor.set_data_from_numpy(data, binary_data=binary)
            outputs = [aiohttpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
            result = await client.infer(model_for(datatype), [tensor], outputs=outputs)
            assert_same(result.as_numpy("OUTPUT0"), data)
