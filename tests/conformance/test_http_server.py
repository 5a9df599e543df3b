"""Health, server metadata, trace and log settings, classification over HTTP."""

from __future__ import annotations

import http.client
import json
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow


def get(server: Any, path: str) -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read(), resp.getheader("Content-Type") or ""
    finally:
        conn.close()


def test_health(client: httpclient.InferenceServerClient, server: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    for path in (
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/models/simple/ready",
        "/v2/models/simple/versions/1/ready",
    ):
        status, body, _ = get(server, path)
        assert (status, body) == (200, b"")
    status, body, _ = get(server, "/v2/models/broken/ready")
    assert status == 400 and body == b""


def test_server_metadata(client: httpclient.InferenceServerClient, server: Any) -> None:
    meta = client.get_server_metadata()
    assert meta["name"] == "triton"  # Triton's clients check the name
    assert "flowserve" in meta["extensions"]
    assert meta["version"]
    for extension in (
        "binary_tensor_data",
        "model_repository",
        "system_shared_memory",
        "statistics",
        "classification",
    ):
        assert extension in meta["extensions"]
    assert "cuda_shared_memory" not in meta["extensions"]
    status, body, content_type = get(server, "/v2")
    assert status == 200 and content_type == "application/json" and json.loads(body) == meta


def test_trace_settings(client: httpclient.InferenceServerClient) -> None:
    settings = client.get_trace_settings()
    assert settings["trace_level"] == ["OFF"]
    try:
        updated = client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        assert updated["trace_level"] == ["TIMESTAMPS"] and updated["trace_rate"] == "1"
        assert client.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]
        model = client.update_trace_settings(model_name="simple", settings={"trace_level": ["OFF"]})
        assert model["trace_level"] == ["OFF"]
        assert client.get_trace_settings(model_name="simple")["trace_level"] == ["OFF"]
        assert client.get_trace_settings(model_name="fanout")["trace_level"] == ["TIMESTAMPS"]
        # None clears a model setting back to the global value
        cleared = client.update_trace_settings(model_name="simple", settings={"trace_level": None})
        assert cleared["trace_level"] == ["TIMESTAMPS"]
    finally:
        client.update_trace_settings(settings={"trace_level": ["OFF"], "trace_rate": "1000"})
    with pytest.raises(InferenceServerException) as err:
        client.update_trace_settings(settings={"trace_level": ["LOUD"]})
    assert err.value.status() == "400" and "trace_level" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.update_trace_settings(settings={"trace_rate": "often"})
    assert err.value.status() == "400" and "trace_rate" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.get_trace_settings(model_name="no_such_model")
    assert err.value.status() == "404"


def test_log_settings(client: httpclient.InferenceServerClient) -> None:
    settings = client.get_log_settings()
    assert settings["log_info"] is True and settings["log_format"] in ("default", "ISO8601")
    updated = client.update_log_settings({"log_verbose_level": 0, "log_warning": True})
    assert updated["log_verbose_level"] == 0 and updated["log_warning"] is True
    with pytest.raises(InferenceServerException) as err:
        client.update_log_settings({"log_verbose_level": -1})
    assert err.value.status() == "400" and "log_verbose_level" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.update_log_settings({"log_colour": True})
    assert err.value.status() == "400" and "log_colour" in err.value.message()
    assert client.get_log_settings() == updated


async def test_aio_settings_and_metadata(server: Any) -> None:
    async with aiohttpclient.InferenceServerClient(server.http_url) as client:
        assert await client.is_server_ready()
        assert (await client.get_server_metadata())["name"] == "triton"
        assert (await client.get_model_config("simple_ensemble"))["platform"] == "ensemble"
        assert (await client.get_trace_settings())["trace_level"] == ["OFF"]
        assert "log_info" in await client.get_log_settings()
        stats = await client.get_inference_statistics("simple")
        assert stats["model_stats"][0]["name"] == "simple"


@pytest.mark.parametrize("model", ["simple", "simple_ensemble", "fanout"])
def test_classification(client: httpclient.InferenceServerClient, model: str) -> None:
    names = ("a", "b") if model == "fanout" else ("INPUT0", "INPUT1")
    output = "sum" if model == "fanout" else "OUTPUT0"
    a = np.array([[3, 9, 1, 7, 0, 2, 8, 4, 6, 5, 11, 10, 15, 12, 14, 13]] * 2, dtype=np.int32)
    a[1] = a[1][::-1]
    b = np.zeros_like(a)
    inputs = []
    for name, value in zip(names, (a, b), strict=True):
        t = httpclient.InferInput(name, [2, 16], "INT32")
        t.set_data_from_numpy(value, binary_data=False)
        inputs.append(t)
    # a + b (simple, fanout "sum") or 2a (ensemble): the order of a either way
    scale = 2 if model == "simple_ensemble" else 1
    for binary in (False, True):
        result = client.infer(
            model,
            inputs,
            outputs=[httpclient.InferRequestedOutput(output, binary_data=binary, class_count=3)],
        )
        got = result.as_numpy(output)
        assert got.shape == (2, 3)
        for row in range(2):
            top = np.argsort(-a[row], kind="stable")[:3]
            want = [f"{float(a[row][i] * scale):f}:{i}" for i in top]
            assert [x.decode() if isinstance(x, bytes) else x for x in got[row]] == want
