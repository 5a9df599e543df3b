"""Model repository extension (index, load with config/file overrides, unload with dependents)
and exact, cumulative statistics."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
IDENTITY_PY = (ROOT / "tests" / "models" / "identity_int32" / "1" / "model.py").read_bytes()


def identity_config(name: str) -> str:
    return json.dumps(
        {
            "name": name,
            "backend": "python",
            "max_batch_size": 8,
            "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        }
    )


def chain_config(name: str, step: str) -> str:
    return json.dumps(
        {
            "name": name,
            "platform": "ensemble",
            "max_batch_size": 8,
            "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [-1]}],
            "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [-1]}],
            "ensemble_scheduling": {
                "step": [
                    {
                        "model_name": step,
                        "model_version": -1,
                        "input_map": {"INPUT0": "IN"},
                        "output_map": {"OUTPUT0": "OUT"},
                    }
                ]
            },
        }
    )


def infer_identity(
    client: httpclient.InferenceServerClient, model: str, value: np.ndarray, name: str = "INPUT0"
) -> np.ndarray:
    t = httpclient.InferInput(name, list(value.shape), "INT32")
    t.set_data_from_numpy(value)
    result: np.ndarray = client.infer(model, [t]).as_numpy("OUTPUT0" if name == "INPUT0" else "OUT")
    return result


def post(server: Any, path: str, body: Any) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=json.dumps(body).encode())
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else {}
    finally:
        conn.close()


# ------------------------------------------------------------------ index


def test_repository_index(client: httpclient.InferenceServerClient, server: Any) -> None:
    index = {(m["name"], m["version"]): m for m in client.get_model_repository_index()}
    assert index[("simple", "1")]["state"] == "READY"
    assert index[("fanout", "1")]["state"] == "READY"
    broken = [m for m in index.values() if m["name"] == "broken"]
    assert broken and broken[0]["state"] == "UNAVAILABLE"
    assert "broken on purpose" in broken[0]["reason"]
    status, ready_only = post(server, "/v2/repository/index", {"ready": True})
    assert status == 200
    assert all(m["state"] == "READY" for m in ready_only)
    assert "broken" not in {m["name"] for m in ready_only}
    # a repository name in the path is accepted (one namespace for all repositories)
    status, named = post(server, "/v2/repository/model_repository/index", {})
    assert status == 200 and {m["name"] for m in named} == {m["name"] for m in index.values()}
    status, body = post(server, "/v2/repository/index", {"ready": "yes"})
    assert status == 400 and "'ready'" in body["error"]


# ------------------------------------------------------------------ load / unload


def test_load_with_config_and_files_then_unload(client: httpclient.InferenceServerClient) -> None:
    name = "http_copy"
    assert not client.is_model_ready(name)
    client.load_model(name, config=identity_config(name), files={"file:1/model.py": IDENTITY_PY})
    try:
        assert client.is_model_ready(name)
        meta = client.get_model_metadata(name)
        assert meta["inputs"] == [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, -1]}]
        value = np.array([[4, 5, 6]], dtype=np.int32)
        np.testing.assert_array_equal(infer_identity(client, name, value), value)
        states = {m["name"]: m["state"] for m in client.get_model_repository_index()}
        assert states[name] == "READY"
        # load again (a reload) with a different max_batch_size
        config = json.loads(identity_config(name))
        config["max_batch_size"] = 2
        client.load_model(name, config=json.dumps(config), files={"file:1/model.py": IDENTITY_PY})
        assert client.get_model_config(name)["max_batch_size"] == 2
        with pytest.raises(InferenceServerException) as err:
            infer_identity(client, name, np.zeros((3, 1), dtype=np.int32))
        assert err.value.status() == "400" and "<= 2" in err.value.message()
    finally:
        client.unload_model(name)
    assert not client.is_model_ready(name)
    with pytest.raises(InferenceServerException) as err:
        infer_identity(client, name, np.zeros((1, 1), dtype=np.int32))
    assert err.value.status() == "503" and name in err.value.message()
    states = {m["name"]: m["state"] for m in client.get_model_repository_index()}
    assert states[name] == "UNAVAILABLE"


def test_unload_dependents(client: httpclient.InferenceServerClient) -> None:
    base, chain = "http_base", "http_chain"
    value = np.array([[1, 2]], dtype=np.int32)
    for dependents in (False, True):
        client.load_model(base, config=identity_config(base), files={"file:1/model.py": IDENTITY_PY})
        client.load_model(chain, config=chain_config(chain, base), files={"file:1/.keep": b""})
        np.testing.assert_array_equal(infer_identity(client, chain, value, name="IN"), value)
        client.unload_model(base, unload_dependents=dependents)
        assert not client.is_model_ready(base)
        # either way the chain cannot run; without unload_dependents it stays loaded and the
        # index says why it is not ready
        assert not client.is_model_ready(chain)
        index = {m["name"]: m for m in client.get_model_repository_index()}
        if dependents:
            assert index[chain]["reason"] == "unloaded"
        else:
            assert index[chain]["state"] == "UNAVAILABLE"
            assert f"uses '{base}', which is not loaded" in index[chain]["reason"]
            client.unload_model(chain)
        assert not client.is_model_ready(chain)


def test_load_errors(client: httpclient.InferenceServerClient, server: Any) -> None:
    with pytest.raises(InferenceServerException) as err:
        client.load_model("http_bad", config="{not json")
    assert err.value.status() == "400" and "config JSON" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.load_model("http_bad", files={"file:1/model.py": IDENTITY_PY})
    assert err.value.status() == "400" and "'config'" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.load_model("http_nowhere")
    assert err.value.status() == "404" and "http_nowhere" in err.value.message()
    status, body = post(
        server,
        "/v2/repository/models/http_bad/load",
        {"parameters": {"config": identity_config("http_bad"), "file:1/model.py": "%%% not base64"}},
    )
    assert status == 400 and "base64" in body["error"]
    status, body = post(
        server, "/v2/repository/models/http_bad/unload", {"parameters": {"unload_dependents": 1}}
    )
    assert status == 400 and "unload_dependents" in body["error"]
    with pytest.raises(InferenceServerException) as err:
        client.unload_model("http_never_loaded")
    assert err.value.status() == "404"
    # a model that fails to load is reported, the others keep serving
    with pytest.raises(InferenceServerException) as err:
        client.load_model("broken")
    assert err.value.status() == "400" and "broken on purpose" in err.value.message()
    assert client.is_model_ready("simple")


async def test_aio_load_unload(server: Any) -> None:
    name = "http_aio_copy"
    async with aiohttpclient.InferenceServerClient(server.http_url) as client:
        await client.load_model(name, config=identity_config(name), files={"file:1/model.py": IDENTITY_PY})
        assert await client.is_model_ready(name)
        index = await client.get_model_repository_index()
        assert any(m["name"] == name and m["state"] == "READY" for m in index)
        await client.unload_model(name)
        assert not await client.is_model_ready(name)


# ------------------------------------------------------------------ statistics


def stats_of(client: httpclient.InferenceServerClient, model: str, version: str = "") -> dict[str, Any]:
    stats = client.get_inference_statistics(model, version)["model_stats"]
    assert len(stats) == 1 and stats[0]["name"] == model and stats[0]["version"] == "1"
    result: dict[str, Any] = stats[0]
    return result


@pytest.mark.parametrize("model", ["identity_int16", "simple_ensemble", "fanout"])
def test_statistics_are_exact(client: httpclient.InferenceServerClient, model: str) -> None:
    before = stats_of(client, model)
    rows = [1, 3, 2]
    for n in rows:
        if model == "identity_int16":
            t = httpclient.InferInput("INPUT0", [n, 4], "INT16")
            t.set_data_from_numpy(np.ones((n, 4), dtype=np.int16))
            inputs = [t]
        else:
            names = ("a", "b") if model == "fanout" else ("INPUT0", "INPUT1")
            inputs = []
            for name in names:
                t = httpclient.InferInput(name, [n, 16], "INT32")
                t.set_data_from_numpy(np.ones((n, 16), dtype=np.int32))
                inputs.append(t)
        client.infer(model, inputs)
    bad = httpclient.InferInput("INPUT0" if model != "fanout" else "a", [1, 4], "FP64")
    bad.set_data_from_numpy(np.ones((1, 4)))
    with pytest.raises(InferenceServerException):
        client.infer(model, [bad])
    after = stats_of(client, model, "1")
    assert after["inference_count"] - before["inference_count"] == sum(rows)
    assert after["execution_count"] - before["execution_count"] == len(rows)
    success = after["inference_stats"]["success"]
    assert success["count"] - before["inference_stats"]["success"]["count"] == len(rows)
    assert success["ns"] > before["inference_stats"]["success"]["ns"]
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1
    assert after["last_inference"] >= before["last_inference"]


def test_statistics_listing_and_errors(client: httpclient.InferenceServerClient) -> None:
    every = client.get_inference_statistics()["model_stats"]
    names = {s["name"] for s in every}
    assert {"simple", "simple_ensemble", "fanout", "identity_fp32"} <= names
    assert "broken" not in names
    for s in every:
        assert set(s["inference_stats"]) >= {
            "success",
            "fail",
            "queue",
            "compute_input",
            "compute_infer",
            "compute_output",
        }
    with pytest.raises(InferenceServerException) as err:
        client.get_inference_statistics("no_such_model")
    assert err.value.status() == "404"
    with pytest.raises(InferenceServerException) as err:
        client.get_inference_statistics("simple", "5")
    assert err.value.status() == "404"
