"""Fuzzing the HTTP API of a live server, for a bounded time.

1. schemathesis against flowserve/frontends/http/openapi.yaml (the KServe V2 endpoints served
   here), valid and schema-violating requests alike;
2. a hypothesis fuzzer of the binary tensor extension (JSON header + raw bytes +
   Inference-Header-Content-Length, all of them inconsistent on purpose), which an OpenAPI
   description cannot express.

For every request: no 500 (malformed input is the client's fault: 4xx, or 501/503 for what
the server does not support or cannot do now), an ``{"error": ...}`` body with every error,
and the server still alive and serving afterwards. FLOWSERVE_FUZZ_EXAMPLES sets the examples
per operation (default 20: about a minute on two cores).
"""

from __future__ import annotations

import http.client
import json
import os
import struct
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow

OPENAPI = Path(__file__).resolve().parents[2] / "flowserve" / "frontends" / "http" / "openapi.yaml"
EXAMPLES = int(os.environ.get("FLOWSERVE_FUZZ_EXAMPLES", "20"))
LOAD_MODELS = ("add_sub", "text")
SERVER_FLAGS = ("--max-request-bytes=1048576", "--max-tensor-elements=65536", "--allow-shm")
ALLOWED = {200, 400, 404, 405, 413, 501, 503}
# empty-bodied answers of the health and readiness checks
NO_BODY = {"serverLive", "serverReady", "modelReady"}

schema = schemathesis.openapi.from_path(
    OPENAPI,
    config=schemathesis.Config.from_dict({"generation": {"mode": "all", "database": "none"}}),
)
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
    database=None,
)


def check_reply(status: int, body: bytes, where: str, empty_ok: bool = False) -> None:
    assert status in ALLOWED, f"{where}: status {status}: {body[:500]!r}"
    if status >= 400 and not (empty_ok and not body):
        reply = json.loads(body)
        assert isinstance(reply, dict) and isinstance(reply.get("error"), str), f"{where}: {body[:500]!r}"


@schema.parametrize()
@schema.given(model=st.sampled_from([*LOAD_MODELS, "no_such_model"]))
@FUZZ_SETTINGS
def test_openapi_fuzz(case: Any, model: str, module_server: Any) -> None:
    params = case.path_parameters
    if params is not None and isinstance(params.get("model_name"), str):
        repository_change = case.operation.path.startswith("/v2/repository/models/")
        # aim at the loaded models (not only at 404s), but never unload or replace them
        params["model_name"] = "fuzz_target" if repository_change else model
    response = case.call(base_url=f"http://127.0.0.1:{module_server.http_port}", timeout=30)
    where = f"{case.method} {case.formatted_path}"
    check_reply(
        response.status_code,
        response.content,
        where,
        case.operation.definition.raw.get("operationId") in NO_BODY,
    )


# ------------------------------------------------------------------ the binary extension

DATATYPES = ["INT32", "FP32", "BYTES", "BOOL", "UINT8", "FP16", "BF16", "INT64", "nope"]
dims = st.one_of(st.integers(0, 20), st.integers(-(2**70), 2**70), st.sampled_from([16, 1, 0, -1]))
shapes = st.one_of(
    st.lists(dims, max_size=4), st.just([1, 16]), st.lists(st.just(1), min_size=30, max_size=70)
)


@st.composite
def binary_requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    model = draw(st.sampled_from([*LOAD_MODELS, "no_such_model"]))
    inputs = []
    blobs = []
    for name in draw(st.lists(st.sampled_from(["INPUT0", "INPUT1", "x"]), max_size=3)):
        size = draw(st.one_of(st.integers(0, 128), st.just(64), st.integers(-5, 2**40)))
        blob = draw(
            st.one_of(
                st.binary(max_size=160),
                st.just(b"\0" * 64),
                st.builds(lambda n: struct.pack("<I", n), st.integers(0, 2**32 - 1)),
            )
        )
        entry: dict[str, Any] = {
            "name": name,
            "shape": draw(shapes),
            "datatype": draw(st.sampled_from(DATATYPES)),
        }
        if draw(st.booleans()):
            entry["parameters"] = {"binary_data_size": size}
        inputs.append(entry)
        blobs.append(blob)
    header = json.dumps({"inputs": inputs}).encode()
    if draw(st.booleans()):
        header = header[: draw(st.integers(0, len(header)))]  # truncated JSON
    body = header + b"".join(blobs)
    length = draw(
        st.one_of(st.just(len(header)), st.integers(0, len(body) + 10), st.just(-1), st.just(10**12))
    )
    headers = {"Inference-Header-Content-Length": str(length), "Content-Type": "application/octet-stream"}
    return model, body, headers


@given(request=binary_requests())
@FUZZ_SETTINGS
def test_binary_extension_fuzz(request: tuple[str, bytes, dict[str, str]], module_server: Any) -> None:
    model, body, headers = request
    conn = http.client.HTTPConnection("127.0.0.1", module_server.http_port, timeout=30)
    try:
        conn.request("POST", f"/v2/models/{model}/infer", body=body, headers=headers)
        resp = conn.getresponse()
        check_reply(resp.status, resp.read(), f"binary infer of {model}")
    finally:
        conn.close()


def test_server_survived_the_fuzzing(module_server: Any) -> None:
    assert module_server.process.poll() is None, module_server.log()
    conn = http.client.HTTPConnection("127.0.0.1", module_server.http_port, timeout=30)
    try:
        conn.request("GET", "/v2/health/ready")
        ready = conn.getresponse()
        ready.read()
        assert ready.status == 200
        rows = list(range(16))
        body = {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32", "data": rows} for n in ("INPUT0", "INPUT1")
            ]
        }
        conn.request("POST", "/v2/models/add_sub/infer", json.dumps(body).encode())
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        assert json.loads(resp.read())["outputs"][0]["data"] == [2 * r for r in rows]
    finally:
        conn.close()
    assert "Traceback" not in module_server.log(), module_server.log()[-3000:]
