"""ModelStreamInfer with a decoupled graph (a generator node: any number of responses per
request) on its own server, and Triton's final-response flag on ordinary models."""

from __future__ import annotations

import queue
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.slow

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"

NODES = '''
class Repeat:
    """Yields x + i for i in range(n); fails after two responses when x is negative."""

    outputs = {"y": ("INT32", [1])}

    def execute(self, inputs):
        for i in range(int(inputs["n"][0])):
            if i == 2 and inputs["x"][0] < 0:
                raise ValueError("negative x, stopped after two responses")
            yield {"y": inputs["x"] + i}
'''

GRAPH = """
inputs: {x: {datatype: INT32, dims: [1]}, n: {datatype: INT32, dims: [1]}}
outputs: {y: gen.y}
nodes:
  gen: {python: grpc_stream_nodes:Repeat, inputs: {x: $x, n: $n}}
"""

FINAL = "triton_final_response"


def shared_helper(name: str) -> Any:
    """A helper of tests/conftest.py (loaded by pytest under a mode-dependent module name)."""
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == str(CONFTEST) and hasattr(module, name):
            return getattr(module, name)
    raise RuntimeError(f"tests/conftest.py is not loaded; cannot find '{name}'")


@pytest.fixture(scope="module")
def decoupled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    start_server = shared_helper("start_server")
    root = tmp_path_factory.mktemp("grpc_stream")
    (root / "grpc_stream_nodes.py").write_text(textwrap.dedent(NODES))
    graphs = root / "graphs"
    graphs.mkdir()
    (graphs / "repeat.yaml").write_text(GRAPH)
    proc = start_server(repositories=(), graphs=(Path(graphs),), listeners="grpc")
    try:
        yield proc
    finally:
        proc.stop()


def repeat_inputs(x: int, n: int, module: Any = grpcclient) -> list[Any]:
    out = []
    for name, value in (("x", x), ("n", n)):
        t = module.InferInput(name, [1], "INT32")
        t.set_data_from_numpy(np.array([value], np.int32))
        out.append(t)
    return out


def final_flag(result: Any) -> bool | None:
    params = result.get_response().parameters
    return bool(params[FINAL].bool_param) if FINAL in params else None


def y_of(result: Any) -> int | None:
    y = result.as_numpy("y")
    return None if y is None else int(y[0])


def test_decoupled_responses_in_order_with_final_flag(decoupled_server: Any) -> None:
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(decoupled_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            client.async_stream_infer(
                "repeat", repeat_inputs(10, 3), request_id="a", enable_empty_final_response=True
            )
            client.async_stream_infer(
                "repeat", repeat_inputs(20, 2), request_id="b", enable_empty_final_response=True
            )
            got = [responses.get(timeout=30) for _ in range(7)]
        finally:
            client.stop_stream()
    assert all(error is None for _, error in got), got
    seen = [(r.get_response().id, y_of(r), final_flag(r)) for r, _ in got]
    assert seen == [
        ("a", 10, False),
        ("a", 11, False),
        ("a", 12, False),
        ("a", None, True),
        ("b", 20, False),
        ("b", 21, False),
        ("b", None, True),
    ]


def test_decoupled_zero_responses(decoupled_server: Any) -> None:
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(decoupled_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            client.async_stream_infer(
                "repeat", repeat_inputs(1, 0), request_id="none", enable_empty_final_response=True
            )
            result, error = responses.get(timeout=30)
        finally:
            client.stop_stream()
    assert error is None
    assert (result.get_response().id, y_of(result), final_flag(result)) == ("none", None, True)


def test_decoupled_error_mid_request_keeps_the_stream(decoupled_server: Any) -> None:
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    with grpcclient.InferenceServerClient(decoupled_server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            client.async_stream_infer("repeat", repeat_inputs(-5, 4), request_id="bad")
            client.async_stream_infer("repeat", repeat_inputs(7, 1), request_id="good")
            got = [responses.get(timeout=30) for _ in range(4)]
        finally:
            client.stop_stream()
    assert [y_of(r) for r, _ in got[:2]] == [-5, -4]
    result, error = got[2]
    assert result is None and isinstance(error, InferenceServerException)
    assert "negative x" in error.message() and "gen" in error.message()
    result, error = got[3]
    assert error is None and result.get_response().id == "good" and y_of(result) == 7


def test_decoupled_model_refuses_unary_infer(decoupled_server: Any) -> None:
    with (
        grpcclient.InferenceServerClient(decoupled_server.grpc_url) as client,
        pytest.raises(InferenceServerException) as info,
    ):
        client.infer("repeat", repeat_inputs(1, 2))
    assert info.value.status() == str(grpc.StatusCode.UNIMPLEMENTED)
    assert "'repeat'" in info.value.message() and "decoupled" in info.value.message()


async def test_aio_decoupled_stream(decoupled_server: Any) -> None:
    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i, n in enumerate((2, 3)):
            yield {
                "model_name": "repeat",
                "inputs": repeat_inputs(100 * (i + 1), n, aioclient),
                "request_id": str(i),
            }

    got = []
    async with aioclient.InferenceServerClient(decoupled_server.grpc_url) as client:
        async for result, error in client.stream_infer(requests()):
            assert error is None, error
            got.append((result.get_response().id, y_of(result), final_flag(result)))
            if len(got) == 5:
                break
    # (the aio client cannot ask for the final flag: without it, only data responses come)
    assert got == [("0", 100, None), ("0", 101, None), ("1", 200, None), ("1", 201, None), ("1", 202, None)]


def test_final_flag_on_an_ordinary_model(server: Any) -> None:
    """A model that is not decoupled answers once, and that response is the final one."""
    responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = grpcclient.InferInput(name, [1, 16], "INT32")
        t.set_data_from_numpy(a)
        inputs.append(t)
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        try:
            client.async_stream_infer("simple", inputs, request_id="s", enable_empty_final_response=True)
            client.async_stream_infer("simple", inputs, request_id="t")
            first, second = responses.get(timeout=30), responses.get(timeout=30)
        finally:
            client.stop_stream()
    assert first[1] is None and final_flag(first[0]) is True
    np.testing.assert_array_equal(first[0].as_numpy("OUTPUT0"), 2 * a)
    assert second[1] is None and final_flag(second[0]) is None
    with pytest.raises(queue.Empty):
        responses.get(timeout=0.3)
