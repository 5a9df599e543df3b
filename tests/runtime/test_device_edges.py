"""The executor's edges with the fake device: a "torch" -> "onnxruntime" -> "torch" graph whose
nodes run on their own streams. Proves: a consumer on another stream waits on the producer's
event before it reads (never a device-wide synchronize; the fake has none), device tensors pass
between device-aware nodes untouched, and host copies happen only where numpy is needed (a
numpy node's input, the graph's outputs), counted as bytes copied on the right node."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowserve.core.device import DeviceTensor, FakeDevice, OrderingError, edges, take, tensor_map
from flowserve.core.errors import NodeError
from flowserve.core.node import Context, Node, TensorMap
from flowserve.graph.compile import compile_graph
from flowserve.graph.plan import Plan, Signature
from flowserve.runtime.executor import Executor
from flowserve.runtime.stats import NodeStats
from flowserve.spec.graph_yaml import load_graph_file
from flowserve.spec.schema import NodeSpec

GRAPH = """
inputs:
  x: {datatype: FP32, dims: [-1]}
outputs:
  y: {from: post.y, datatype: FP32, dims: [-1]}
  side: {from: numpy_side.y, datatype: FP32, dims: [-1]}
nodes:
  pre: {python: "m:Torch", inputs: {x: $x}}
  mid: {python: "m:Ort", inputs: {x: pre.y}}
  post: {python: "m:Torch", inputs: {x: mid.y}}
  numpy_side: {python: "m:Numpy", inputs: {x: mid.y}}
"""


def resolve(node: NodeSpec) -> Signature:
    return Signature(None, {"y": None})


def plan(tmp_path: Path) -> Plan:
    path = tmp_path / "g.yaml"
    path.write_text(GRAPH)
    return compile_graph(load_graph_file(path), resolve)


class FakeGpuNode(Node):
    """A framework node on the fake GPU: its own stream, host inputs uploaded (a counted copy),
    device inputs taken with the ordering rule, its output left on the device."""

    device_tensors = True

    def __init__(
        self, name: str, dev: FakeDevice, fn: Callable[[np.ndarray], np.ndarray], *, wait: bool = True
    ):
        self.name = name
        self.dev = dev
        self.fn = fn
        self.wait = wait  # False: a broken node that reads without the event wait
        self.stream = dev.stream(dev.device)
        self.node_stats = NodeStats()  # shared with the executor, as a batcher's are
        self.seen: list[type] = []

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        (value,) = edges(inputs).values()
        self.seen.append(type(value))
        if isinstance(value, DeviceTensor):
            if self.wait:
                buffer = take(value, self.stream)
            else:
                buffer = value.value
                self.dev.use(buffer, self.stream)
        else:
            buffer = self.dev.upload(value, self.stream)
            self.node_stats.bytes_copied += value.nbytes
        out = self.dev.launch(self.stream, self.name, self.fn, buffer)
        return tensor_map({"y": self.dev.tensor(out, self.stream)})


class NumpyNode(Node):
    def __init__(self) -> None:
        self.name = "numpy_side"
        self.seen: list[Any] = []

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        self.seen.append(type(inputs["x"]))
        return {"y": inputs["x"] * 10}


def build(tmp_path: Path, dev: FakeDevice, wait_mid: bool = True) -> tuple[Executor, list[Node]]:
    p = plan(tmp_path)
    by_name: dict[str, Node] = {
        "pre": FakeGpuNode("pre", dev, lambda a: a * 2),
        "mid": FakeGpuNode("mid", dev, lambda a: a + 1, wait=wait_mid),
        "post": FakeGpuNode("post", dev, lambda a: a - 3),
        "numpy_side": NumpyNode(),
    }
    nodes = [by_name[n.name] for n in p.nodes]
    return Executor(p, nodes), nodes


async def test_cross_stream_edges_wait_on_events_and_copy_only_at_the_edges(tmp_path: Path) -> None:
    dev = FakeDevice()
    executor, nodes = build(tmp_path, dev)
    by = {n.name: n for n in nodes}
    x = np.arange(8, dtype=np.float32)
    out = await executor.run({"x": x}, Context())

    # results are numpy for the front end, and right
    assert type(out["y"]) is np.ndarray and type(out["side"]) is np.ndarray
    np.testing.assert_array_equal(out["y"], (x * 2 + 1) - 3)
    np.testing.assert_array_equal(out["side"], (x * 2 + 1) * 10)

    # device tensors went between the framework nodes as they were; the numpy node got numpy
    assert by["mid"].seen == [DeviceTensor] and by["post"].seen == [DeviceTensor]  # type: ignore[attr-defined]
    assert by["numpy_side"].seen == [np.ndarray]  # type: ignore[attr-defined]

    # each cross-stream read came after a wait on the producer's event, on the reader's stream
    pre, mid, post = by["pre"], by["mid"], by["post"]
    records = {entry[1]: entry[2] for entry in dev.ops("record")}
    waits = dev.ops("wait")
    assert ("wait", mid.stream, records[pre.stream]) in waits  # type: ignore[attr-defined]
    assert ("wait", post.stream, records[mid.stream]) in waits  # type: ignore[attr-defined]
    for _, stream, event in waits:
        wait_at = dev.log.index(("wait", stream, event))
        read_at = next(i for i, e in enumerate(dev.log) if e[0] == "read" and e[1] is stream)
        launch_at = next(i for i, e in enumerate(dev.log) if e[0] == "launch" and e[1] is stream)
        assert wait_at < read_at < launch_at

    # copies: the graph input uploaded by pre; mid's output to host for the numpy node (counted
    # on that node); post's output to host for the front end (counted on post); nothing else
    n = x.nbytes
    stats = {p.name: executor.stats[p.index] for p in executor.plan.nodes}
    assert {name: s.bytes_copied for name, s in stats.items()} == {
        "pre": n,
        "mid": 0,
        "post": n,
        "numpy_side": n,
    }
    assert [e for e in dev.log if e[0] == "upload"] == [("upload", pre.stream, n)]  # type: ignore[attr-defined]
    assert dev.ops("to_host") == [("to_host", n), ("to_host", n)]
    # the host waited on the two events whose tensors it copied, never on a whole device
    assert sorted(e[1].number for e in dev.ops("host_wait")) == sorted(
        [records[mid.stream].number, records[post.stream].number]  # type: ignore[attr-defined]
    )


async def test_a_graph_step_keeps_its_outputs_on_the_device(tmp_path: Path) -> None:
    dev = FakeDevice()
    executor, _ = build(tmp_path, dev)
    out = await executor.run({"x": np.ones(4, np.float32)}, Context(), host=False)
    assert isinstance(out["y"], DeviceTensor)  # handed on as it is (a StepNode's call)
    assert dev.ops("to_host") == [("to_host", 16)]  # only the numpy node's input


async def test_a_read_without_the_event_wait_fails_the_node(tmp_path: Path) -> None:
    dev = FakeDevice()
    executor, _ = build(tmp_path, dev, wait_mid=False)
    with pytest.raises(NodeError, match="mid") as info:
        await executor.run({"x": np.ones(4, np.float32)}, Context())
    assert isinstance(info.value.__cause__, OrderingError)


async def test_the_copying_path_counts_one_copy_per_node_input(tmp_path: Path) -> None:
    dev = FakeDevice()
    executor, _ = build(tmp_path, dev)
    executor.copy_edges(True)
    x = np.ones(4, np.float32)
    out = await executor.run({"x": x}, Context())
    np.testing.assert_array_equal(out["y"], (x * 2 + 1) - 3)
    # every node got an owned host copy of its input, which each device node uploaded again;
    # post's output went to the host for the front end
    n = x.nbytes
    copied = {p.name: executor.stats[p.index].bytes_copied for p in executor.plan.nodes}
    assert copied == {"pre": 2 * n, "mid": 2 * n, "post": 3 * n, "numpy_side": n}
