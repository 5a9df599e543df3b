"""Decoupled nodes: zero, one or many responses per request, flowing on through the graph."""

from __future__ import annotations

import itertools
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import FlowserveError, Unsupported
from flowserve.core.types import InferRequest

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
