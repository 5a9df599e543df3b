"""What a python model's ``request.parameters()`` holds, over HTTP and gRPC alike (as Triton 2.51's
qa suite L0_parameters checks it): the request's own parameters and the forwarded headers, never
the protocol's keys (``binary_data_output``, ``triton_enable_empty_final_response``); reserved
``triton_`` keys refused in Triton's words; header patterns in RE2 syntax."""

from __future__ import annotations

import http.client
import json
import queue
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("PARAMS", np.array([r.parameters().encode()], dtype=object))]
            )
            for r in requests
        ]
"""

HEADERS = {"my_header_1": "a", "MY_HEADER_2": "b", "fwd_x": "c", "other": "d"}
GRPC_HEADERS = {"my_header_1": "a", "fwd_x": "c", "other": "d"}  # gRPC metadata keys are lower case


def shared_helper(name: str) -> Any:
    """A helper of tests/conftest.py (loaded by pytest under a mode-dependent module name)."""
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == str(CONFTEST) and hasattr(module, name):
            return getattr(module, name)
    raise RuntimeError(f"tests/conftest.py is not loaded; cannot find '{name}'")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    repo = tmp_path_factory.mktemp("parameters") / "models"
    (repo / "params" / "1").mkdir(parents=True)
    (repo / "params" / "config.pbtxt").write_text(CONFIG)
    (repo / "params" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    proc = shared_helper("start_server")(
        "--http-header-forward-pattern=MY_HEADER.*",
        # RE2: case-sensitive upper case (no gRPC metadata key is), or fwd_ in any case
        "--grpc-header-forward-pattern=(?-i)MY_HEADER.*|(?i)FWD_.*",
        repositories=(repo,),
        graphs=(),
        listeners="http,grpc",
    )
    try:
        yield proc
    finally:
        proc.stop()


def inputs(module: Any) -> list[Any]:
    item = module.InferInput("INPUT0", [1], "FP32")
    item.set_data_from_numpy(np.ones(1, np.float32))
    return [item]


def seen(result: Any) -> dict[str, Any]:
    parameters: dict[str, Any] = json.loads(result.as_numpy("PARAMS")[0])
    return parameters


def test_http(served: Any) -> None:
    client = httpclient.InferenceServerClient(served.http_url)
    try:
        # no outputs named: the client adds binary_data_output, which the model never sees
        result = client.infer("params", inputs(httpclient), parameters={"k": 1, "s": "v"}, headers=HEADERS)
        assert seen(result) == {"k": 1, "s": "v", "my_header_1": "a", "my_header_2": "b"}
    finally:
        client.close()


def test_grpc(served: Any) -> None:
    client = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        result = client.infer(
            "params", inputs(grpcclient), parameters={"k": True, "f": 1.5}, headers=GRPC_HEADERS
        )
        assert seen(result) == {"k": True, "f": 1.5, "fwd_x": "c"}
    finally:
        client.close()


def test_the_schedulers_settings_are_not_the_models(served: Any) -> None:
    """priority and timeout set how the request is scheduled (Triton's front ends take them out
    of the parameters); the model sees only the rest."""
    http = httpclient.InferenceServerClient(served.http_url)
    grpc_ = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        for client, module in ((http, httpclient), (grpc_, grpcclient)):
            result = client.infer(
                "params", inputs(module), priority=1, timeout=10_000_000, parameters={"k": 1}
            )
            assert seen(result) == {"k": 1}, module.__name__
    finally:
        http.close()
        grpc_.close()


def test_grpc_stream_forwards_the_streams_headers(served: Any) -> None:
    client = grpcclient.InferenceServerClient(served.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error or result), headers=GRPC_HEADERS)
    try:
        for n in range(2):
            client.async_stream_infer(
                "params", inputs(grpcclient), parameters={"n": n}, enable_empty_final_response=True
            )
            result = answers.get(timeout=30)
            assert seen(result) == {"n": n, "fwd_x": "c"}  # no triton_enable_empty_final_response
            assert result.get_response().parameters["triton_final_response"].bool_param
    finally:
        client.stop_stream()
        client.close()


def test_reserved_keys_are_refused(served: Any) -> None:
    # tritonclient refuses them itself; a raw request is what an older client sends
    body = {
        "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}],
        "parameters": {"triton_": True},
    }
    conn = http.client.HTTPConnection("127.0.0.1", served.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/params/infer", json.dumps(body))
        answer = conn.getresponse()
        assert answer.status == 400
        assert (
            "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."
            in json.loads(answer.read())["error"]
        )
    finally:
        conn.close()
    stub = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        request = grpcclient.service_pb2.ModelInferRequest(model_name="params")
        tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
        tensor.contents.fp32_contents.append(1.0)
        request.parameters["triton_x"].bool_param = True
        with pytest.raises(Exception) as err:
            stub._client_stub.ModelInfer(request)
        assert "INVALID_ARGUMENT" in str(err.value)
        assert "Only the following keys starting with 'triton_' are allowed" in str(err.value)
    finally:
        stub.close()
