"""The generate extension as Triton 2.51 answers it (its qa suite L0_http, generate endpoint):
keys that are not inputs become parameters, Triton's refusals (repeated keys, wrong JSON
types, missing inputs), server-sent events of ``text/event-stream; charset=utf-8`` for zero,
one or many responses, an error as the first answer setting the status, 0-element outputs."""

from __future__ import annotations

import http.client
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"

CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "PROMPT" data_type: TYPE_STRING dims: [ 1, 1 ] },
  { name: "STREAM" data_type: TYPE_BOOL dims: [ 1, 1 ] },
  { name: "input_ids" data_type: TYPE_INT32 dims: [ 1, -1 ] optional: true }
]
output [
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1, -1 ] },
  { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

# answers REPETITION times (default 1), then an error when FAIL_LAST; TEXT is the prompt, or
# no element at all with EMPTY; PARAMS is what request.parameters() said
MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = request.parameters()
            params = json.loads(text)
            sender = request.get_response_sender()
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()
            out = np.zeros((1, 0), dtype=object) if params.get("EMPTY") else prompt
            response = pb_utils.InferenceResponse(
                [pb_utils.Tensor("TEXT", out), pb_utils.Tensor("PARAMS", np.array([text.encode()], dtype=object))]
            )
            for _ in range(params.get("REPETITION", 1)):
                sender.send(response)
            last = pb_utils.InferenceResponse(error=pb_utils.TritonError("went wrong")) if params.get("FAIL_LAST") else None
            sender.send(last, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def shared_helper(name: str) -> Any:
    """A helper of tests/conftest.py (loaded by pytest under a mode-dependent module name)."""
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == str(CONFTEST) and hasattr(module, name):
            return getattr(module, name)
    raise RuntimeError(f"tests/conftest.py is not loaded; cannot find '{name}'")


@pytest.fixture(scope="module")
def llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    repo = tmp_path_factory.mktemp("generate") / "models"
    (repo / "llm" / "1").mkdir(parents=True)
    (repo / "llm" / "config.pbtxt").write_text(CONFIG)
    (repo / "llm" / "1" / "model.py").write_text(textwrap.dedent(MODEL))
    proc = shared_helper("start_server")(repositories=(repo,), graphs=(), listeners="http")
    try:
        yield proc
    finally:
        proc.stop()


def post(server: Any, route: str, body: str | dict[str, Any]) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        data = body if isinstance(body, str) else json.dumps(body)
        conn.request("POST", f"/v2/models/llm/{route}", data, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        return reply.status, reply.getheader("Content-Type") or "", reply.read()
    finally:
        conn.close()


def events(raw: bytes) -> list[dict[str, Any]]:
    chunks = raw.split(b"\n\n")
    assert chunks[-1] == b"", raw
    assert all(c.startswith(b"data: ") for c in chunks[:-1]), raw
    return [json.loads(c[len(b"data: ") :]) for c in chunks[:-1]]


def error(server: Any, route: str, body: str | dict[str, Any]) -> str:
    status, kind, raw = post(server, route, body)
    assert status == 400, raw
    assert kind == "application/json"
    message: str = json.loads(raw)["error"]
    return message


def test_keys_that_are_not_inputs_become_parameters(llm: Any) -> None:
    body = {"PROMPT": "hi", "STREAM": False, "id": "7", "flavour": "x", "parameters": {"n": 2}}
    status, kind, raw = post(llm, "generate", body)
    assert (status, kind) == (200, "application/json")
    doc = json.loads(raw)
    assert doc["TEXT"] == "hi" and doc["id"] == "7" and doc["model_name"] == "llm"
    # the id is a parameter too (as in Triton); nothing of the protocol's own reaches the model
    assert json.loads(doc["PARAMS"]) == {"id": "7", "flavour": "x", "n": 2}


def test_all_inputs_and_shapes(llm: Any) -> None:
    status, _, raw = post(llm, "generate", {"PROMPT": ["hi"], "STREAM": [False], "input_ids": [1, 2, 3]})
    assert status == 200, raw
    assert json.loads(raw)["TEXT"] == "hi"


def test_stream_content_type_and_many_responses(llm: Any) -> None:
    status, kind, raw = post(llm, "generate_stream", {"PROMPT": "hi", "STREAM": True, "REPETITION": 3})
    assert (status, kind) == (200, "text/event-stream; charset=utf-8")
    assert [e["TEXT"] for e in events(raw)] == ["hi"] * 3


def test_zero_responses(llm: Any) -> None:
    status, kind, raw = post(llm, "generate_stream", {"PROMPT": "hi", "STREAM": True, "REPETITION": 0})
    assert (status, kind, raw) == (200, "text/event-stream; charset=utf-8", b"")
    for n in (0, 2):
        status, _, raw = post(llm, "generate", {"PROMPT": "hi", "STREAM": True, "REPETITION": n})
        assert status == 501
        assert "generate expects model to produce exactly 1 response" in json.loads(raw)["error"]


def test_an_error_first_sets_the_status(llm: Any) -> None:
    body = {"PROMPT": "hi", "STREAM": True, "REPETITION": 0, "FAIL_LAST": True}
    status, kind, raw = post(llm, "generate_stream", body)
    assert (status, kind) == (500, "text/event-stream; charset=utf-8")
    assert events(raw) == [{"error": "went wrong"}]
    status, _, raw = post(llm, "generate_stream", {**body, "REPETITION": 1})
    assert status == 200
    assert [e.get("TEXT", e.get("error")) for e in events(raw)] == ["hi", "went wrong"]


def test_zero_element_output(llm: Any) -> None:
    status, _, raw = post(llm, "generate", {"PROMPT": "hi", "STREAM": False, "EMPTY": True})
    assert status == 200, raw
    assert json.loads(raw)["TEXT"] == []


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_refusals_in_triton_words(llm: Any, route: str) -> None:
    cases: list[tuple[str | dict[str, Any], str]] = [
        ('{"PROMPT": "a", "STREAM": false, "PROMPT": "b"}', "input 'PROMPT' already exists in request"),
        ('{"PROMPT": "a", "STREAM": false, "STREAM": true, "PROMPT": "b"}', "input 'STREAM' already exists"),
        ({"PROMPT": 1, "STREAM": False}, "attempt to access JSON non-string as string"),
        ({"PROMPT": "a", "STREAM": "no"}, "attempt to access JSON non-boolean as boolean"),
        ({"STREAM": 1, "PROMPT": True}, "attempt to access JSON non-boolean as boolean"),
        ({"PROMPT": {"u": "a"}, "STREAM": True}, "attempt to access JSON non-string as string"),
        ({"PROMPT": "a", "STREAM": True, "input_ids": [1.5]}, "non-signed-integer as signed-integer"),
        ({}, "expected number of inputs between 2 and 3 but got 0 inputs for model 'llm'"),
        ({"STREAM": False, "other": 1}, "expected number of inputs between 2 and 3 but got 1"),
        ({"PROMPT": "a", "STREAM": True, "P": {"x": 0}}, "parameter 'P' has invalid type"),
        ({"PROMPT": "a", "STREAM": True, "parameters": 1}, "Expected JSON object for keyword: 'parameters'"),
        (
            {"PROMPT": "a", "STREAM": True, "parameters": {"nested": {"twice": 1}}},
            "Converting keyword: 'parameters': parameter 'nested' has invalid type.",
        ),
        (
            {"PROMPT": "a", "STREAM": True, "triton_x": 1},
            "parameter keys starting with 'triton_' are reserved",
        ),
        (
            {"PROMPT": ["a", "b"], "STREAM": True},
            "can not convert input 'PROMPT' to tensor with proper shape",
        ),
        ({"PROMPT": [[["a"]]], "STREAM": True}, "lists nested deeper than its 2 dims"),
        ('{"PROMPT": ', "malformed generate request"),
        ("[1]", "must be a JSON object"),
    ]
    for body, words in cases:
        assert words in error(llm, route, body), body


def test_server_lives_after_a_client_leaves_a_stream(llm: Any) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", llm.http_port, timeout=30)
    conn.request(
        "POST",
        "/v2/models/llm/generate_stream",
        json.dumps({"PROMPT": "a", "STREAM": True, "REPETITION": 50}),
    )
    conn.close()
    status, _, raw = post(llm, "generate", {"PROMPT": "hi", "STREAM": False})
    assert status == 200 and json.loads(raw)["TEXT"] == "hi"
