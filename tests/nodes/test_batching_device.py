"""Device tensors through a dynamic batcher: the batcher takes tensors as its inner node does
(``device_tensors``), a batch of tensors on the (fake) GPU is merged there after waiting on
every producer's event (no host copy), tensors that cannot be merged where they are go through
the host, every merge's bytes are counted as the node's bytes copied (from instance threads too,
without losing updates), and a batched torch model in a real graph gets torch tensors.

The fake device (flowserve/core/device.py) refuses a read on a stream that did not wait on the
producer's event, so a merge that skipped the ordering rule fails these tests."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowserve.core.clock import FakeClock
from flowserve.core.device import (
    DeviceTensor,
    FakeDevice,
    FakeStream,
    edges,
    ordered_device,
    take,
    tensor_map,
    wrap,
)
from flowserve.core.node import Context, Node, TensorMap
from flowserve.nodes.batching import Batcher
from flowserve.nodes.batching.tensors import merge_rows, split_rows
from flowserve.runtime.stats import ModelStats, NodeStats
from flowserve.spec.schema import BatchingSpec

LONG_US = 10_000_000


class Meter:
    def __init__(self) -> None:
        self.bytes_copied = 0

    def add_copied(self, nbytes: int) -> None:
        self.bytes_copied += nbytes


class FakeGpuDoubler(Node):
    """A device-aware node on the fake GPU: takes its input on its own stream, y = 2x there."""

    device_tensors = True

    def __init__(self, dev: FakeDevice) -> None:
        self.name = "gpu"
        self.dev = dev
        self.stream = dev.stream(dev.device)
        self.seen: list[Any] = []

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        x = edges(inputs)["x"]
        self.seen.append(x)
        assert isinstance(x, DeviceTensor)
        out = self.dev.launch(self.stream, "double", lambda a: a * 2, take(x, self.stream))
        return tensor_map({"y": self.dev.tensor(out, self.stream)})


class HostNode(Node):
    def __init__(self) -> None:
        self.name = "host"

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        return {"y": inputs["x"]}


def on_gpu(dev: FakeDevice, array: np.ndarray) -> tuple[DeviceTensor, FakeStream]:
    """A tensor a producer on its own stream made on the fake GPU."""
    stream = dev.stream(dev.device)
    buffer = dev.launch(stream, "produce", lambda: array)
    return dev.tensor(buffer, stream), stream


def test_a_batcher_takes_tensors_as_its_inner_node_does() -> None:
    dev = FakeDevice()
    assert ordered_device(Batcher(FakeGpuDoubler(dev), BatchingSpec(4)))
    assert not ordered_device(Batcher(HostNode(), BatchingSpec(4)))


def test_a_merge_of_fake_gpu_tensors_runs_on_the_device_after_every_producers_event() -> None:
    dev = FakeDevice()
    a, stream_a = on_gpu(dev, np.ones((2, 3), np.float32))
    b, stream_b = on_gpu(dev, np.full((1, 3), 5, np.float32))
    meter = Meter()
    merged = edges(merge_rows([{"x": a}, {"x": b}], meter=meter))["x"]
    assert isinstance(merged, DeviceTensor) and merged.device == dev.device
    assert merged.shape == (3, 3) and merged.dtype == np.float32
    # the merge's stream waited on both producers' events before it read their buffers
    merge_stream = dev.current(dev.device)
    waits = [(entry[1], entry[2]) for entry in dev.ops("wait")]
    assert (merge_stream, a.event) in waits and (merge_stream, b.event) in waits
    assert ("launch", merge_stream, "concat") in dev.log
    assert dev.ops("to_host") == [] and dev.ops("host_wait") == []  # never through the host
    assert meter.bytes_copied == merged.nbytes == 36  # the device copy a merge is, counted
    # a consumer on another stream must wait on the merge's event (the fake refuses otherwise)
    parts = split_rows({"y": merged}, [2, 1], "gpu")
    assert [p["y"].shape for p in parts] == [(2, 3), (1, 3)]
    host, copied = merged.host()
    np.testing.assert_array_equal(host, [[1, 1, 1], [1, 1, 1], [5, 5, 5]])
    assert copied == 36
    del stream_a, stream_b


def test_tensors_that_cannot_merge_where_they_are_merge_on_the_host_counted() -> None:
    dev = FakeDevice()
    gpu, _ = on_gpu(dev, np.ones((1, 2), np.float32))
    host = np.zeros((2, 2), np.float32)
    meter = Meter()
    merged = merge_rows([{"x": gpu}, {"x": host}], meter=meter)["x"]
    assert type(merged) is np.ndarray
    np.testing.assert_array_equal(merged, [[1, 1], [0, 0], [0, 0]])
    # the device tensor's copy to the host (8 bytes) and the merge (24 bytes)
    assert dev.ops("to_host") == [("to_host", 8)]
    assert meter.bytes_copied == 8 + 24


def test_numpy_merges_are_counted_and_a_single_request_is_not() -> None:
    meter = Meter()
    one = {"x": np.ones((2, 2), np.float32)}
    assert merge_rows([one], meter=meter) is one
    assert meter.bytes_copied == 0
    merge_rows([one, one], meter=meter)
    assert meter.bytes_copied == 32


def test_torch_tensors_merge_with_torch_cat_and_split_into_views() -> None:
    torch = pytest.importorskip("torch")
    a = wrap(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    b = wrap(torch.full((1, 3), 9.0))
    meter = Meter()
    merged = edges(merge_rows([{"x": a}, {"x": b}], meter=meter))["x"]
    assert isinstance(merged, DeviceTensor) and isinstance(merged.value, torch.Tensor)
    assert merged.shape == (3, 3) and meter.bytes_copied == 36
    first, second = split_rows({"y": merged}, [2, 1], "t")
    assert first["y"].value.data_ptr() == merged.value.data_ptr()  # views of the merged tensor
    np.testing.assert_array_equal(second["y"].host()[0], [[9, 9, 9]])
    ragged = edges(merge_rows([{"x": a}, {"x": b}], frozenset({"x"}), meter))["x"]
    assert isinstance(ragged, DeviceTensor) and ragged.shape == (9,)


async def test_a_batched_device_node_gets_one_merged_device_tensor_counted_on_the_node() -> None:
    dev = FakeDevice()
    inner = FakeGpuDoubler(dev)
    clock = FakeClock(1_000_000)
    batcher = Batcher(inner, BatchingSpec(2, max_queue_delay_us=LONG_US), clock=clock)
    await batcher.start()
    try:
        a, _ = on_gpu(dev, np.ones((1, 2), np.float32))
        b, _ = on_gpu(dev, np.full((1, 2), 3, np.float32))
        results = await asyncio.gather(batcher({"x": a}, Context()), batcher({"x": b}, Context()))
    finally:
        await batcher.stop()
    assert len(inner.seen) == 1 and inner.seen[0].shape == (2, 2)  # one batch of both requests
    ys = [edges(r)["y"] for r in results]
    assert all(isinstance(y, DeviceTensor) for y in ys)
    np.testing.assert_array_equal(np.concatenate([y.host()[0] for y in ys]), [[2, 2], [6, 6]])
    assert dev.ops("to_host") == [("to_host", 8), ("to_host", 8)]  # only the checks just above
    assert batcher.node_stats.bytes_copied == 16  # the merge, on the batcher's node statistics


def test_bytes_copied_from_many_threads_loses_no_update() -> None:
    stats = ModelStats()
    node = NodeStats()
    threads = [
        threading.Thread(target=lambda: [s.add_copied(3) for s in (stats, node) for _ in range(20_000)])
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert stats.bytes_copied == node.bytes_copied == 4 * 20_000 * 3


# ------------------------------------------------------------------ a real batched torch model

PRODUCER = """name: "zb_pre"
platform: "pytorch_libtorch"
default_model_filename: "model.pt2"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

BATCHED = """name: "zb_net"
platform: "pytorch_libtorch"
default_model_filename: "model.pt2"
max_batch_size: 2
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 10000000 }
"""

GRAPH = """name: zb_graph
inputs:
  x: {datatype: FP32, dims: [-1, 4]}
outputs:
  y: net.y
nodes:
  pre: {model: zb_pre, inputs: {x: $x}}
  net: {model: zb_net, inputs: {x: pre.y}}
"""


def _export(path: Path, scale: float) -> None:
    import torch

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * scale

    rows = torch.export.Dim("rows", min=1, max=64)
    program = torch.export.export(Scale().eval(), (torch.zeros(2, 4),), dynamic_shapes={"x": {0: rows}})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))


@pytest.fixture(scope="module")
def batched_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("zb")
    repo, graphs = root / "models", root / "graphs"
    for name, config, scale in (("zb_pre", PRODUCER, 2.0), ("zb_net", BATCHED, 10.0)):
        (repo / name).mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        _export(repo / name / "1" / "model.pt2", scale)
    graphs.mkdir()
    (graphs / "zb_graph.yaml").write_text(GRAPH)
    return repo, graphs


async def test_a_batched_torch_model_gets_torch_tensors_merged_with_torch_cat(
    batched_repo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from flowserve.dataplane.engine import Engine
    from flowserve.nodes.backends.torch import TorchBackend

    seen: list[Any] = []
    real = TorchBackend.execute

    def spy(self: TorchBackend, instance: Any, inputs: TensorMap) -> TensorMap:
        if self.name == "zb_net":
            seen.append(edges(inputs)["x"])
        return real(self, instance, inputs)

    monkeypatch.setattr(TorchBackend, "execute", spy)
    repo, graphs = batched_repo
    engine = await Engine.start([repo], [graphs])
    try:
        xs = [np.full((1, 4), v, np.float32) for v in (1.0, 2.0)]
        outs = await asyncio.gather(*(engine.infer("zb_graph", {"x": x}) for x in xs))
        net = engine.registry.get("zb_net")
        graph = engine.registry.get("zb_graph")
    finally:
        await engine.stop()
    for x, out in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(out["y"], x * 20)
    # one execution of both requests' rows, as the torch tensors the producer made, torch.cat-ed
    assert len(seen) == 1
    merged = seen[0]
    assert isinstance(merged, DeviceTensor) and isinstance(merged.value, torch.Tensor)
    assert merged.shape == (2, 4)
    assert net.stats.batches.keys() == {2}
    assert net.stats.bytes_copied == 2 * 16  # the merge, counted on the model
    # the model's one node is its batcher, which takes device tensors as its torch model does
    assert net.executor._device == [True]
    assert sum(s.bytes_copied for s in (*net.executor.stats, *graph.executor.stats)) == 0
