"""HTTP inference with the official clients: the same tests for a single model ("simple"), a
Triton ensemble ("simple_ensemble") and a YAML graph ("fanout")."""

from __future__ import annotations

import gzip
import http.client
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

Expect = Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]


@dataclass(frozen=True)
class Case:
    model: str
    inputs: tuple[str, str]
    expect: Expect
    platform: str


CASES = [
    Case("simple", ("INPUT0", "INPUT1"), lambda a, b: {"OUTPUT0": a + b, "OUTPUT1": a - b}, "python"),
    Case(
        "simple_ensemble", ("INPUT0", "INPUT1"), lambda a, b: {"OUTPUT0": 2 * a, "OUTPUT1": 2 * b}, "ensemble"
    ),
    Case("fanout", ("a", "b"), lambda a, b: {"total": 5 * a - b, "sum": a + b}, "ensemble"),
]


@pytest.fixture(params=CASES, ids=[c.model for c in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    param: Case = request.param
    return param


def operands(batch: int = 1) -> tuple[np.ndarray, np.ndarray]:
    a = np.arange(16 * batch, dtype=np.int32).reshape(batch, 16)
    b = np.full((batch, 16), 3, dtype=np.int32) - a % 5
    return a, b


def make_inputs(
    case: Case, a: np.ndarray, b: np.ndarray, binary: tuple[bool, bool]
) -> list[httpclient.InferInput]:
    inputs = []
    for name, value, as_binary in zip(case.inputs, (a, b), binary, strict=True):
        tensor = httpclient.InferInput(name, list(value.shape), "INT32")
        tensor.set_data_from_numpy(value, binary_data=as_binary)
        inputs.append(tensor)
    return inputs


def post(
    server: Any, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


# ------------------------------------------------------------------ metadata


def test_model_metadata_and_config(client: httpclient.InferenceServerClient, case: Case) -> None:
    meta = client.get_model_metadata(case.model)
    assert meta["name"] == case.model
    assert meta["versions"] == ["1"]
    assert meta["platform"] == case.platform
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        (n, "INT32", [-1, 16]) for n in case.inputs
    ]
    outputs = case.expect(*operands())
    assert sorted(t["name"] for t in meta["outputs"]) == sorted(outputs)
    assert client.get_model_metadata(case.model, "1") == meta
    config = client.get_model_config(case.model)
    assert config["name"] == case.model
    assert config["max_batch_size"] == 8
    assert client.is_model_ready(case.model)
    assert client.is_model_ready(case.model, "1")
    assert not client.is_model_ready(case.model, "7")


# ------------------------------------------------------------------ inference


@pytest.mark.parametrize(
    "binary", [(True, True), (False, False), (True, False)], ids=["binary", "json", "mixed"]
)
def test_infer_all_outputs(
    client: httpclient.InferenceServerClient, case: Case, binary: tuple[bool, bool]
) -> None:
    a, b = operands()
    result = client.infer(case.model, make_inputs(case, a, b, binary))
    response = result.get_response()
    assert response["model_name"] == case.model
    assert response["model_version"] == "1"
    expected = case.expect(a, b)
    assert sorted(o["name"] for o in response["outputs"]) == sorted(expected)
    for name, want in expected.items():
        got = result.as_numpy(name)
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)
    # no outputs requested: the client asks for binary_data_output, so every output is binary
    assert all("binary_data_size" in o["parameters"] for o in response["outputs"])


@pytest.mark.parametrize("binary_out", [True, False], ids=["binary-out", "json-out"])
def test_infer_requested_output_subset(
    client: httpclient.InferenceServerClient, case: Case, binary_out: bool
) -> None:
    a, b = operands(batch=3)
    expected = case.expect(a, b)
    first = sorted(expected)[0]
    outputs = [httpclient.InferRequestedOutput(first, binary_data=binary_out)]
    result = client.infer(
        case.model, make_inputs(case, a, b, (True, True)), outputs=outputs, request_id="req-42"
    )
    response = result.get_response()
    assert response["id"] == "req-42"
    assert [o["name"] for o in response["outputs"]] == [first]
    out = response["outputs"][0]
    assert out["datatype"] == "INT32" and out["shape"] == [3, 16]
    assert ("data" in out) is not binary_out
    np.testing.assert_array_equal(result.as_numpy(first), expected[first])


def test_infer_max_batch(client: httpclient.InferenceServerClient, case: Case) -> None:
    a, b = operands(batch=8)
    result = client.infer(case.model, make_inputs(case, a, b, (True, True)))
    for name, want in case.expect(a, b).items():
        np.testing.assert_array_equal(result.as_numpy(name), want)
    a, b = operands(batch=9)
    with pytest.raises(InferenceServerException) as err:
        client.infer(case.model, make_inputs(case, a, b, (True, True)))
    assert err.value.status() == "400"
    assert "batch-size must be <= 8" in err.value.message()
    assert case.model in err.value.message()


async def test_infer_aio(server: Any, case: Case) -> None:
    async with aiohttpclient.InferenceServerClient(server.http_url) as client:
        assert await client.is_server_live()
        assert await client.is_model_ready(case.model)
        meta = await client.get_model_metadata(case.model)
        assert meta["name"] == case.model
        a, b = operands(batch=2)
        expected = case.expect(a, b)
        for binary in (True, False):
            inputs = []
            for name, value in zip(case.inputs, (a, b), strict=True):
                tensor = aiohttpclient.InferInput(name, list(value.shape), "INT32")
                tensor.set_data_from_numpy(value, binary_data=binary)
                inputs.append(tensor)
            outputs = [aiohttpclient.InferRequestedOutput(n, binary_data=binary) for n in expected]
            result = await client.infer(case.model, inputs, outputs=outputs, request_id=f"aio-{binary}")
            assert result.get_response()["id"] == f"aio-{binary}"
            for name, want in expected.items():
                np.testing.assert_array_equal(result.as_numpy(name), want)
        with pytest.raises(InferenceServerException) as err:
            await client.infer("no_such_model", inputs)
        assert err.value.status() == "404"


def test_infer_nested_json_data(server: Any, case: Case) -> None:
    a, b = operands(batch=2)
    body = {
        "id": "nested",
        "inputs": [
            {"name": case.inputs[0], "shape": [2, 16], "datatype": "INT32", "data": a.tolist()},
            {"name": case.inputs[1], "shape": [2, 16], "datatype": "INT32", "data": b.reshape(-1).tolist()},
        ],
    }
    status, raw, headers = post(server, f"/v2/models/{case.model}/infer", json.dumps(body).encode())
    assert status == 200, raw
    assert headers["content-type"] == "application/json"
    response = json.loads(raw)
    assert response["id"] == "nested"
    expected = case.expect(a, b)
    for out in response["outputs"]:
        assert out["datatype"] == "INT32" and out["shape"] == [2, 16]
        np.testing.assert_array_equal(np.array(out["data"]).reshape(2, 16), expected[out["name"]])


def test_infer_with_version_in_path(client: httpclient.InferenceServerClient, case: Case) -> None:
    a, b = operands()
    result = client.infer(case.model, make_inputs(case, a, b, (True, True)), model_version="1")
    assert result.get_response()["model_version"] == "1"
    with pytest.raises(InferenceServerException) as err:
        client.infer(case.model, make_inputs(case, a, b, (True, True)), model_version="3")
    assert err.value.status() == "404"
    assert f"Request for unknown model: '{case.model}' version 3 is not found" in err.value.message()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_infer_compressed(client: httpclient.InferenceServerClient, case: Case, algorithm: str) -> None:
    a, b = operands(batch=4)
    result = client.infer(
        case.model,
        make_inputs(case, a, b, (True, False)),
        request_compression_algorithm=algorithm,
        response_compression_algorithm=algorithm,
    )
    for name, want in case.expect(a, b).items():
        np.testing.assert_array_equal(result.as_numpy(name), want)


def test_compressed_response_headers(server: Any) -> None:
    a, b = operands()
    body = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.reshape(-1).tolist()},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.reshape(-1).tolist()},
            ]
        }
    ).encode()
    status, raw, headers = post(
        server,
        "/v2/models/simple/infer",
        gzip.compress(body),
        {"Content-Encoding": "gzip", "Accept-Encoding": "br;q=1.0, deflate;q=0.5, gzip;q=0.8"},
    )
    assert status == 200
    assert headers["content-encoding"] == "gzip"
    response = json.loads(gzip.decompress(raw))
    assert {o["name"] for o in response["outputs"]} == {"OUTPUT0", "OUTPUT1"}
    status, raw, headers = post(
        server, "/v2/models/simple/infer", zlib.compress(body), {"Content-Encoding": "deflate"}
    )
    assert status == 200 and "content-encoding" not in headers
    status, raw, _ = post(server, "/v2/models/simple/infer", body, {"Content-Encoding": "br"})
    assert status == 501
    assert "Content-Encoding 'br'" in json.loads(raw)["error"]


def test_infer_parameters_accepted(client: httpclient.InferenceServerClient, case: Case) -> None:
    a, b = operands()
    result = client.infer(
        case.model,
        make_inputs(case, a, b, (True, True)),
        priority=1,
        timeout=10_000_000,
        parameters={"custom_flag": True, "custom_text": "x", "custom_number": 2.5},
    )
    for name, want in case.expect(a, b).items():
        np.testing.assert_array_equal(result.as_numpy(name), want)


def test_infer_timeout_parameter_expires(client: httpclient.InferenceServerClient) -> None:
    # a 1 microsecond budget is spent before the first node can start: UNAVAILABLE (503)
    a, b = operands()
    with pytest.raises(InferenceServerException) as err:
        client.infer("simple", make_inputs(CASES[0], a, b, (True, True)), timeout=1)
    assert err.value.status() == "503"
    assert "timeout" in err.value.message()


def test_raw_binary_request(server: Any) -> None:
    # Inference-Header-Content-Length: 0 sends the raw bytes of the only input, batch 1
    data = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    status, raw, headers = post(
        server,
        "/v2/models/identity_fp32/infer",
        data.tobytes(),
        {"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"},
    )
    assert status == 200, raw
    length = int(headers["inference-header-content-length"])
    result = httpclient.InferenceServerClient.parse_response_body(raw, header_length=length)
    out = result.get_output("OUTPUT0")
    assert out["shape"] == [1, 3] and out["datatype"] == "FP32"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data.reshape(1, 3))


def test_generate_takes_unknown_keys_as_parameters(server: Any) -> None:
    # Triton's rule: a key that names no input is a request parameter, so the inputs are missing
    for endpoint in ("generate", "generate_stream"):
        status, raw, _ = post(server, f"/v2/models/simple/{endpoint}", b'{"text_input": "hi"}')
        assert status == 400
        assert "expected 2 inputs but got 0 inputs for model 'simple'" in json.loads(raw)["error"]
