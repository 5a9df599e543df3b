"""Decoupled nodes: zero, one or many responses per request, flowing on through the graph."""

from __future__ import annotations

import asyncio
import itertools
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import FlowserveError, ResourceExhausted, Unsupported
from flowserve.core.types import InferRequest
from flowserve.dataplane import streams
from flowserve.dataplane.guard import SMALL, ByteBudget, Guards
from flowserve.dataplane.plane import DataPlane

_ids = itertools.count()

NODES = """
import asyncio
import numpy as np

class Repeat:
    '''Yields x + i for i in range(n): one response per value.'''
    outputs = {"y": ("INT32", [-1])}
    def execute(self, inputs):
        for i in range(int(inputs["n"][0])):
            if i == 3 and inputs["x"][0] < 0:
                raise RuntimeError("stopped at 3")
            yield {"y": inputs["x"] + i}

class AsyncRepeat:
    outputs = {"y": ("INT32", [-1])}
    async def execute(self, inputs):
        for i in range(int(inputs["n"][0])):
            await asyncio.sleep(0)
            yield {"y": inputs["x"] * 10 + i}

class Stall:
    '''One response, then nothing for a long time (a hung stream).'''
    outputs = {"y": ("INT32", [-1])}
    closed = []
    async def execute(self, inputs):
        try:
            yield {"y": inputs["x"]}
            await asyncio.sleep(30)
            yield {"y": inputs["x"] + 1}
        finally:
            Stall.closed.append(True)

class Double:
    outputs = {"z": ("INT32", [-1])}
    def execute(self, inputs):
        return {"z": inputs["y"] * 2}
"""


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[flowserve.Engine]:
    module = f"stream_nodes_{next(_ids)}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(NODES))
    sys.path.insert(0, str(tmp_path))
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    for name, cls in (("repeat", "Repeat"), ("arepeat", "AsyncRepeat"), ("stall", "Stall")):
        (graphs / f"{name}.yaml").write_text(
            f"""
inputs: {{x: {{datatype: INT32, dims: [1]}}, n: {{datatype: INT32, dims: [1]}}}}
outputs: {{z: double.z, y: gen.y}}
nodes:
  gen: {{python: {module}:{cls}, inputs: {{x: $x, n: $n}}}}
  double: {{python: {module}:Double, inputs: {{y: gen.y}}}}
"""
        )
    eng = await flowserve.Engine.start(graphs=graphs)
    try:
        yield eng
    finally:
        await eng.stop()
        sys.path.remove(str(tmp_path))


def request(model: str, x: int, n: int) -> InferRequest:
    return InferRequest(model, {"x": np.array([x], np.int32), "n": np.array([n], np.int32)}, id="s1")


@pytest.mark.parametrize("model,first", [("repeat", 5), ("arepeat", 50)])
async def test_each_response_flows_through_the_rest_of_the_graph(
    engine: flowserve.Engine, model: str, first: int
) -> None:
    responses = [r async for r in engine.stream_request(request(model, 5, 3))]
    assert [r.outputs["y"].tolist() for r in responses] == [[first], [first + 1], [first + 2]]
    assert [r.outputs["z"].tolist() for r in responses] == [[2 * first], [2 * first + 2], [2 * first + 4]]
    assert all(r.id == "s1" for r in responses)
    servable = engine.registry.get(model)
    assert servable.decoupled
    double = servable.executor.stats[servable.plan.node("double").index]
    assert double.calls == 3
    assert servable.stats.success.count == 1


async def test_zero_responses(engine: flowserve.Engine) -> None:
    assert [r async for r in engine.stream_request(request("repeat", 1, 0))] == []


async def test_plain_infer_on_a_decoupled_graph_is_refused(engine: flowserve.Engine) -> None:
    with pytest.raises(Unsupported, match="is decoupled: use the streaming API"):
        await engine.infer_request(request("repeat", 1, 2))


async def test_error_midway_names_the_node_after_earlier_responses(engine: flowserve.Engine) -> None:
    got = []
    with pytest.raises(FlowserveError, match="in graph 'repeat', node 'gen': RuntimeError: stopped at 3"):
        async for response in engine.stream_request(request("repeat", -1, 10)):
            got.append(response.outputs["y"].tolist())
    assert got == [[-1], [0], [1]]
    # and the node's instance is free again: the next request works
    assert len([r async for r in engine.stream_request(request("repeat", 1, 2))]) == 2


ROOT = Path(__file__).resolve().parents[2]


async def test_ordinary_model_streams_one_response() -> None:
    eng = await flowserve.Engine.start(ROOT / "model_repository")
    try:
        a = np.ones((1, 16), np.int32)
        responses = [r async for r in eng.stream_request(InferRequest("simple", {"INPUT0": a, "INPUT1": a}))]
        assert len(responses) == 1
        np.testing.assert_array_equal(responses[0].outputs["OUTPUT0"], 2 * a)
    finally:
        await eng.stop()


async def test_a_stream_past_the_request_timeout_is_abandoned_naming_the_node(
    engine: flowserve.Engine,
) -> None:
    stalled = request("stall", 4, 1)
    stalled.parameters = {"timeout": 200_000}  # us
    got: list[list[int]] = []
    started = time.monotonic()
    with pytest.raises(FlowserveError) as caught:
        async for response in engine.stream_request(stalled):
            got.append(response.outputs["y"].tolist())
    assert got == [[4]]  # the response before the deadline went out
    assert time.monotonic() - started < 5  # not the node's 30 s
    message = str(caught.value)
    assert "node 'gen'" in message and "request timeout expired (200000 us)" in message, message
    assert caught.value.code.name == "UNAVAILABLE"
    newest = max((n for n in sys.modules if n.startswith("stream_nodes_")), key=lambda n: int(n[13:]))
    stall_class = sys.modules[newest].Stall  # this test's module (each engine writes its own)
    assert stall_class.closed  # the node's stream was closed, not left hanging
    without = [r.outputs["y"].tolist() async for r in engine.stream_request(request("repeat", 1, 2))]
    assert without == [[1], [2]]  # no deadline: streams as before


# ------------------------------------------------------------------ slow and vanished clients


async def _collect(responses: AsyncIterator[Any]) -> list[Any]:
    return [r async for r in responses]


async def test_a_client_that_stops_reading_costs_only_itself(engine: flowserve.Engine) -> None:
    """The generator node has one instance; a client that takes one response and then reads no
    more must not hold it: another client's stream completes meanwhile."""
    plane = DataPlane(engine)
    slow = plane.stream(request("repeat", 1, 500))
    first = await slow.__anext__()
    assert first.outputs["y"].tolist() == [1]
    other = await asyncio.wait_for(_collect(plane.stream(request("repeat", 7, 3))), 10)
    assert [r.outputs["y"].tolist() for r in other] == [[7], [8], [9]]
    # the slow client still gets every response, in order, when it reads again
    rest = [r.outputs["y"].tolist() async for r in slow]
    assert rest == [[i] for i in range(2, 501)]
    assert plane.admission.in_flight == 0


async def test_a_client_too_far_behind_gets_an_error_naming_the_model(
    engine: flowserve.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams, "MAX_UNREAD_RESPONSES", 10)
    plane = DataPlane(engine)
    slow = plane.stream(request("repeat", 1, 100))
    await slow.__anext__()
    # the graph runs on (the other request is served), past the bound for the slow client
    assert len(await asyncio.wait_for(_collect(plane.stream(request("repeat", 1, 2))), 10)) == 2
    with pytest.raises(ResourceExhausted, match="model 'repeat': the client read responses too slowly"):
        async for _ in slow:
            pass
    assert plane.admission.in_flight == 0


async def test_a_client_that_goes_away_cancels_the_graph_work(engine: flowserve.Engine) -> None:
    plane = DataPlane(engine)
    stalled = plane.stream(request("stall", 4, 1))
    assert (await stalled.__anext__()).outputs["y"].tolist() == [4]
    newest = max((n for n in sys.modules if n.startswith("stream_nodes_")), key=lambda n: int(n[13:]))
    stall_class = sys.modules[newest].Stall
    started = time.monotonic()
    await stalled.aclose()  # what a front end does when its client disconnects
    assert stall_class.closed and time.monotonic() - started < 5  # not the node's 30 s
    assert plane.admission.in_flight == 0
    # the instance is free for the next client
    assert len(await asyncio.wait_for(_collect(plane.stream(request("repeat", 1, 2))), 10)) == 2


ENDLESS_MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            i = 0
            while not request.is_cancelled():  # Triton's way for a model to stop early
                out = pb_utils.Tensor("OUT", np.array([i], np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
                i += 1
                time.sleep(0.001)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
ENDLESS_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


async def test_a_triton_decoupled_model_sees_its_client_go_away(tmp_path: Path) -> None:
    """A model.py that streams until ``request.is_cancelled()``: a client going away ends it
    (and frees its instance) instead of letting it run forever."""
    model = tmp_path / "repo" / "endless"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(ENDLESS_CONFIG)
    (model / "1" / "model.py").write_text(ENDLESS_MODEL)
    eng = await flowserve.Engine.start(tmp_path / "repo")
    try:
        plane = DataPlane(eng)
        for _ in range(2):  # the second stream needs the instance the first one held
            stream = plane.stream(InferRequest("endless", {"IN": np.array([1], np.int32)}))
            got = [(await asyncio.wait_for(stream.__anext__(), 10)).outputs["OUT"].tolist() for _ in range(3)]
            assert got == [[0], [1], [2]]
            await asyncio.wait_for(stream.aclose(), 10)
        assert plane.admission.in_flight == 0
    finally:
        await eng.stop()


async def test_unread_responses_of_all_clients_share_the_servers_byte_budget(
    engine: flowserve.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each stream's own bound times many streams could still be a lot of memory: unread
    responses take their bytes from the server's budget, and a stream that does not fit ends
    like one over its own bound; what it held comes back."""
    monkeypatch.setattr(streams, "MAX_UNREAD_RESPONSES", 1 << 20)
    budget = ByteBudget(limit=SMALL)
    plane = DataPlane(engine, guards=Guards(budget=budget))
    slow = plane.stream(request("repeat", 1, 20_000))  # ~8 bytes a response: past 64 KiB unread
    await slow.__anext__()
    for _ in range(1000):  # the graph runs on while this client reads nothing (10 s at most)
        if budget.refused:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(
        ResourceExhausted, match=r"model 'repeat': the client read responses too slowly.*memory budget"
    ):
        async for _ in slow:
            pass
    assert budget.in_use == 0 and budget.refused == 1
    assert plane.admission.in_flight == 0
