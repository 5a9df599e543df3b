"""gRPC health, metadata, configuration, statistics, repository (index/load/unload), trace and
log settings, and graceful shutdown, through tritonclient.grpc and tritonclient.grpc.aio."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

StatusCode = grpc.StatusCode
TESTS = Path(__file__).resolve().parent.parent
LEAF_MODEL_PY = (TESTS / "models" / "grpc_leaf" / "1" / "model.py").read_bytes()


def raises(code: grpc.StatusCode, *fragments: str) -> Any:
    class Check:
        def __enter__(self) -> None:
            return None

        def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
            assert isinstance(exc, InferenceServerException), f"expected {code}, got {exc!r}"
            assert exc.status() == str(code), exc
            for fragment in fragments:
                assert fragment in exc.message(), exc.message()
            return True

    return Check()


def int32_input(array: np.ndarray, name: str = "INPUT0") -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(array.shape), "INT32")
    t.set_data_from_numpy(array)
    return t


# ------------------------------------------------------------------ health and metadata


def test_live_ready_and_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "triton" and meta.version  # Triton's clients check the name
    assert "flowserve" in meta.extensions
    for ext in (
        "model_repository",
        "system_shared_memory",
        "statistics",
        "classification",
        "trace",
        "logging",
    ):
        assert ext in meta.extensions
    assert "cuda_shared_memory" not in meta.extensions
    as_json = client.get_server_metadata(as_json=True)
    assert as_json["name"] == "triton"


def test_model_ready(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "2")
    assert not client.is_model_ready("broken")
    assert not client.is_model_ready("no_such_model")


def test_model_metadata_errors(client: grpcclient.InferenceServerClient) -> None:
    with raises(StatusCode.NOT_FOUND, "'no_such_model'"):
        client.get_model_metadata("no_such_model")
    with raises(StatusCode.NOT_FOUND, "Request for unknown model: 'simple' version 9 is not found"):
        client.get_model_metadata("simple", "9")
    with raises(StatusCode.UNAVAILABLE, "'broken'"):
        client.get_model_metadata("broken")


def test_model_config(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple").config
    assert config.name == "simple" and config.backend == "python" and config.max_batch_size == 8
    assert [(i.name, list(i.dims)) for i in config.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    ensemble = client.get_model_config("simple_ensemble", as_json=True)["config"]
    assert ensemble["platform"] == "ensemble"
    assert [s["model_name"] for s in ensemble["ensemble_scheduling"]["step"]] == ["simple", "simple"]
    graph = client.get_model_config("fanout").config
    assert graph.platform == "ensemble" and graph.max_batch_size == 8
    with raises(StatusCode.NOT_FOUND, "'no_such_model'"):
        client.get_model_config("no_such_model")


def test_statistics_of_all_models_and_errors(client: grpcclient.InferenceServerClient) -> None:
    every = client.get_inference_statistics()
    names = {s.name for s in every.model_stats}
    assert {"simple", "simple_ensemble", "fanout", "identity_fp32"} <= names
    one = client.get_inference_statistics("simple", "1", as_json=True)
    assert [s["name"] for s in one["model_stats"]] == ["simple"]
    with raises(StatusCode.NOT_FOUND, "'no_such_model'"):
        client.get_inference_statistics("no_such_model")
    with raises(StatusCode.NOT_FOUND, "'simple'"):
        client.get_inference_statistics("simple", "5")


def test_statistics_count_composing_model(client: grpcclient.InferenceServerClient) -> None:
    """One ensemble request runs "simple" twice: both counters are exact."""

    def counts() -> tuple[int, int]:
        stats = {s.name: s for s in client.get_inference_statistics().model_stats}
        return stats["simple_ensemble"].inference_stats.success.count, stats[
            "simple"
        ].inference_stats.success.count

    before = counts()
    a = np.ones((1, 16), np.int32)
    client.infer("simple_ensemble", [int32_input(a, "INPUT0"), int32_input(a, "INPUT1")])
    after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 2)


async def test_aio_admin(server: Any) -> None:
    async with aioclient.InferenceServerClient(server.grpc_url) as c:
        assert await c.is_server_live()
        assert await c.is_server_ready()
        assert (await c.get_server_metadata()).name == "triton"
        assert (await c.get_model_metadata("fanout")).name == "fanout"
        assert (await c.get_model_config("simple")).config.name == "simple"
        stats = await c.get_inference_statistics("simple")
        assert stats.model_stats[0].name == "simple"
        index = await c.get_model_repository_index()
        assert any(m.name == "simple" for m in index.models)
        assert (await c.get_log_settings(as_json=True))["settings"]
        assert (await c.get_trace_settings(as_json=True))["settings"]
        assert (await c.get_system_shared_memory_status()) is not None
        with pytest.raises(InferenceServerException):
            await c.get_model_metadata("no_such_model")


# ------------------------------------------------------------------ repository


def index_of(client: grpcclient.InferenceServerClient) -> dict[str, Any]:
    return {m.name: m for m in client.get_model_repository_index().models}


def test_repository_index(client: grpcclient.InferenceServerClient, server: Any) -> None:
    index = index_of(client)
    assert index["simple"].state == "READY" and index["simple"].version == "1"
    assert index["fanout"].state == "READY"
    assert index["broken"].state == "UNAVAILABLE" and "broken on purpose" in index["broken"].reason
    # tritonclient does not expose the "ready" filter: ask with the generated stub
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        ready = {m.name for m in stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True)).models}
    assert "simple" in ready and "broken" not in ready


def leaf_infer(client: grpcclient.InferenceServerClient, model: str) -> np.ndarray:
    x = np.arange(4, dtype=np.int32).reshape(1, 4)
    out: np.ndarray = client.infer(model, [int32_input(x)]).as_numpy("OUTPUT0")
    return out


def test_unload_and_load(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("grpc_leaf")
    client.unload_model("grpc_leaf")
    assert not client.is_model_ready("grpc_leaf")
    assert index_of(client)["grpc_leaf"].state == "UNAVAILABLE"
    with raises(StatusCode.UNAVAILABLE, "'grpc_leaf'"):
        leaf_infer(client, "grpc_leaf")
    client.load_model("grpc_leaf")
    assert client.is_model_ready("grpc_leaf")
    np.testing.assert_array_equal(leaf_infer(client, "grpc_leaf"), [[0, 1, 2, 3]])


def test_unload_dependents(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("grpc_dependent")
    client.unload_model("grpc_leaf", unload_dependents=True)
    try:
        assert not client.is_model_ready("grpc_leaf")
        assert not client.is_model_ready("grpc_dependent")
    finally:
        client.load_model("grpc_leaf")
        client.load_model("grpc_dependent")
    np.testing.assert_array_equal(leaf_infer(client, "grpc_dependent"), [[0, 1, 2, 3]])


def test_load_with_config_override(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("grpc_leaf", as_json=True)["config"]
    override = {
        "name": "grpc_leaf",
        "backend": "python",
        "max_batch_size": 2,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
    }
    assert config["max_batch_size"] == 8
    client.load_model("grpc_leaf", config=json.dumps(override))
    try:
        assert client.get_model_config("grpc_leaf").config.max_batch_size == 2
        with raises(StatusCode.INVALID_ARGUMENT, "'grpc_leaf'"):
            client.infer("grpc_leaf", [int32_input(np.zeros((3, 2), np.int32))])
    finally:
        client.load_model("grpc_leaf")
    assert client.get_model_config("grpc_leaf").config.max_batch_size == 8


def test_load_with_files(client: grpcclient.InferenceServerClient) -> None:
    config = {
        "name": "grpc_uploaded",
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
    }
    client.load_model("grpc_uploaded", config=json.dumps(config), files={"file:1/model.py": LEAF_MODEL_PY})
    try:
        assert client.is_model_ready("grpc_uploaded")
        np.testing.assert_array_equal(leaf_infer(client, "grpc_uploaded"), [[0, 1, 2, 3]])
    finally:
        client.unload_model("grpc_uploaded")
    assert not client.is_model_ready("grpc_uploaded")


def test_repository_errors(client: grpcclient.InferenceServerClient) -> None:
    with raises(StatusCode.NOT_FOUND, "'no_such_model'"):
        client.load_model("no_such_model")
    with raises(StatusCode.NOT_FOUND, "'no_such_model'"):
        client.unload_model("no_such_model")
    with raises(StatusCode.INVALID_ARGUMENT, "'broken'"):
        client.load_model("broken")
    with raises(StatusCode.INVALID_ARGUMENT, "grpc_x", "config"):
        client.load_model("grpc_x", files={"file:1/model.py": b"pass"})
    with raises(StatusCode.INVALID_ARGUMENT):
        client.load_model("grpc_x", config="{not json")
    assert client.is_model_ready("simple")


# ------------------------------------------------------------------ trace and log settings


def test_trace_settings(client: grpcclient.InferenceServerClient) -> None:
    initial = client.get_trace_settings(as_json=True)["settings"]
    assert initial["trace_level"]["value"] == ["OFF"]
    updated = client.update_trace_settings(
        model_name="simple", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}, as_json=True
    )["settings"]
    try:
        assert updated["trace_level"]["value"] == ["TIMESTAMPS"]
        assert updated["trace_rate"]["value"] == ["1"]
        assert client.get_trace_settings(model_name="simple", as_json=True)["settings"]["trace_rate"][
            "value"
        ] == ["1"]
        # the global settings are untouched
        assert client.get_trace_settings(as_json=True)["settings"]["trace_level"]["value"] == ["OFF"]
        a = np.ones((1, 16), np.int32)
        client.infer("simple", [int32_input(a, "INPUT0"), int32_input(a, "INPUT1")])
    finally:
        reset = client.update_trace_settings(
            model_name="simple", settings={"trace_level": None, "trace_rate": None}, as_json=True
        )["settings"]
    assert reset["trace_level"]["value"] == initial["trace_level"]["value"]
    assert reset["trace_rate"]["value"] == initial["trace_rate"]["value"]
    with raises(StatusCode.INVALID_ARGUMENT, "trace_level"):
        client.update_trace_settings(settings={"trace_level": ["LOUD"]})
    with raises(StatusCode.INVALID_ARGUMENT, "bogus"):
        client.update_trace_settings(settings={"bogus": "1"})
    with raises(StatusCode.NOT_FOUND, "'no_such_model'"):
        client.get_trace_settings(model_name="no_such_model")


def test_log_settings(client: grpcclient.InferenceServerClient, server: Any) -> None:
    initial = client.get_log_settings(as_json=True)["settings"]
    assert initial["log_info"]["bool_param"] is True
    updated = client.update_log_settings({"log_verbose_level": 1, "log_warning": True}, as_json=True)[
        "settings"
    ]
    try:
        assert updated["log_verbose_level"]["uint32_param"] == 1
    finally:
        restored = client.update_log_settings({"log_verbose_level": 0}, as_json=True)["settings"]
    assert restored.get("log_verbose_level", {}).get("uint32_param", 0) == 0
    with raises(StatusCode.INVALID_ARGUMENT, "'bogus'"):
        client.update_log_settings({"bogus": True})
    # a wrongly typed value (tritonclient refuses to send one; the generated stub does not)
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.LogSettingsRequest()
        request.settings["log_info"].string_param = "yes"
        with pytest.raises(grpc.RpcError) as info:
            stub.LogSettings(request)
    assert info.value.code() == StatusCode.INVALID_ARGUMENT and "'log_info'" in str(info.value.details())
    with raises(StatusCode.INVALID_ARGUMENT, "log_format"):
        client.update_log_settings({"log_format": "fancy"})


# ------------------------------------------------------------------ shutdown


async def test_graceful_stop_finishes_in_flight_requests(server_factory: Any) -> None:
    proc = server_factory.start(listeners="grpc")
    async with aioclient.InferenceServerClient(proc.grpc_url) as c:
        t = aioclient.InferInput("INPUT0", [1], "FP32")
        t.set_data_from_numpy(np.array([1.0], np.float32))
        call = asyncio.ensure_future(c.infer("grpc_slow", [t]))
        await asyncio.sleep(0.4)
        started = time.monotonic()
        stopper = asyncio.get_running_loop().run_in_executor(None, proc.stop)
        result = await call
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [1.0])
        assert await stopper == 0
        assert time.monotonic() - started < 15
    with grpcclient.InferenceServerClient(proc.grpc_url) as after, pytest.raises(InferenceServerException):
        after.is_server_live(client_timeout=2)
