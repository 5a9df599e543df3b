"""flowserve bench's pure parts: inputs from metadata and files, request encoding, the recorder's
window, percentiles, how a level is shared between client processes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from flowserve.bench import grpc_client, http
from flowserve.bench.inputs import InputError, from_file, generated, parse_shapes
from flowserve.bench.load import Level
from flowserve.bench.model import ModelInfo, TensorInfo, model_info
from flowserve.bench.spread import share
from flowserve.bench.stats import Measured, Recorder, summarize, table

SIMPLE = ModelInfo(
    "simple",
    (TensorInfo("INPUT0", "INT32", (-1, 16)), TensorInfo("INPUT1", "INT32", (-1, 16))),
    ("OUTPUT0", "OUTPUT1"),
    max_batch_size=8,
)


def test_model_info_reads_metadata_and_config() -> None:
    metadata = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}], "outputs": [{"name": "y"}]}
    info = model_info("m", metadata, {"max_batch_size": 4, "model_transaction_policy": {"decoupled": True}})
    assert info == ModelInfo("m", (TensorInfo("x", "FP32", (-1, 3)),), ("y",), 4, decoupled=True)


def test_generated_inputs_follow_the_metadata_with_the_batch_dimension() -> None:
    [sample] = generated(SIMPLE, batch_size=3)
    assert {k: (v.shape, v.dtype) for k, v in sample.items()} == {
        "INPUT0": ((3, 16), np.dtype(np.int32)),
        "INPUT1": ((3, 16), np.dtype(np.int32)),
    }
    [zeros] = generated(SIMPLE, zero=True)
    assert not zeros["INPUT0"].any()


def test_variable_dimensions_need_a_shape_and_errors_name_model_and_input() -> None:
    model = ModelInfo("img", (TensorInfo("IMAGE", "UINT8", (-1, -1, 3)),), ("y",), 0)
    with pytest.raises(InputError, match=r"model 'img'.*input 'IMAGE'.*--shape IMAGE:"):
        generated(model)
    [sample] = generated(model, parse_shapes(["IMAGE:4,5,3"]))
    assert sample["IMAGE"].shape == (4, 5, 3)
    with pytest.raises(InputError, match="does not fit"):
        generated(model, parse_shapes(["IMAGE:4,5,4"]))
    with pytest.raises(InputError, match="NAME:D1"):
        parse_shapes(["IMAGE"])
    with pytest.raises(InputError, match="exceeds its max_batch_size 8"):
        generated(SIMPLE, batch_size=9)


def test_samples_from_json_and_npz(tmp_path: Path) -> None:
    data = {"data": [{"INPUT0": list(range(16)), "INPUT1": {"content": [1] * 16, "shape": [16]}}]}
    (tmp_path / "in.json").write_text(json.dumps(data))
    [sample] = from_file(SIMPLE, tmp_path / "in.json", batch_size=2)
    assert sample["INPUT0"].shape == (2, 16) and sample["INPUT0"][1, 15] == 15
    np.savez(tmp_path / "in.npz", INPUT0=np.ones((1, 16), np.int32), INPUT1=np.ones((1, 16), np.int32))
    [sample] = from_file(SIMPLE, tmp_path / "in.npz")
    assert sample["INPUT1"].shape == (1, 16)
    (tmp_path / "bad.json").write_text(json.dumps({"data": [{"INPUT0": [1] * 16}]}))
    with pytest.raises(InputError, match=r"lacks input\(s\) \['INPUT1'\] of model 'simple'"):
        from_file(SIMPLE, tmp_path / "bad.json")


def test_http_request_is_the_binary_extension_with_binary_outputs() -> None:
    [sample] = generated(SIMPLE)
    payload = http.encode_request("h:1", SIMPLE, sample)
    head, body = payload.split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /v2/models/simple/infer HTTP/1.1\r\n")
    size = int(head.split(b"Inference-Header-Content-Length: ")[1].split(b"\r\n")[0])
    header = json.loads(body[:size])
    assert [i["parameters"]["binary_data_size"] for i in header["inputs"]] == [64, 64]
    assert all(o["parameters"]["binary_data"] for o in header["outputs"])
    assert body[size : size + 64] == sample["INPUT0"].tobytes()


def test_grpc_request_is_serialized_once() -> None:
    [sample] = generated(SIMPLE, batch_size=2)
    request = service_pb2.ModelInferRequest.FromString(grpc_client.encode_request(SIMPLE, sample))
    assert request.model_name == "simple" and [list(t.shape) for t in request.inputs] == [[2, 16], [2, 16]]
    assert request.raw_input_contents[1] == sample["INPUT1"].tobytes()


def test_recorder_keeps_only_the_window() -> None:
    recorder = Recorder(window_start=100, window_end=200)
    recorder.ok(50, 120)  # started before the window
    recorder.ok(110, 150)
    recorder.ok(190, 210)  # finished after it
    recorder.failed(120, 130, "boom")
    recorder.failed(10, 20, "boom")
    assert recorder.latencies == [40] and recorder.errors == 1 and recorder.messages == {"boom": 2}
    assert recorder.completed == 5


def test_summary_pools_processes() -> None:
    one = Recorder(latencies=[1_000_000] * 99 + [10_000_000])
    two = Recorder(latencies=[2_000_000] * 100)
    result = summarize(
        [Measured(one, 2.0, 0.2), Measured(two, 2.0, 0.2)],
        protocol="http",
        concurrency=8,
        rate=0,
        batch_size=2,
    )
    assert result.requests == 200 and result.throughput == pytest.approx(200.0)  # 100/s x 2 rows
    assert (
        result.p50_ms == pytest.approx(2.0) and result.p99_ms == pytest.approx(2.0) and result.max_ms == 10.0
    )
    assert result.client_cores == pytest.approx(0.2)
    assert "c=8" in table([result])


def test_levels_are_shared_between_processes() -> None:
    assert [share(Level(concurrency=5), i, 2).concurrency for i in range(2)] == [3, 2]
    assert [share(Level(concurrency=1), i, 2).concurrency for i in range(2)] == [1, 0]
    assert share(Level(rate=300.0), 1, 3).rate == pytest.approx(100.0)
