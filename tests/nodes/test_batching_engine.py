"""Dynamic batching through the whole engine: config.pbtxt ``dynamic_batching`` in front of
python-backend models, YAML ``batching:`` in front of graph nodes, statistics.

Models are written into tmp_path. Their ``execute`` calls an optional hook the test installs
(``sys.modules['batch_test_hook'].hook``) with every request's INPUT0, on the instance's
thread: tests use it to hold an instance busy (threading events) or to prove that instances
run at the same time (a barrier). Nothing sleeps; waits on threads have generous timeouts so a
failure fails rather than hangs."""

from __future__ import annotations

import asyncio
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import ErrorCode, FlowserveError
from flowserve.core.node import TensorMap
from flowserve.nodes.batching import Batcher

MODEL_PY = """
import sys

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        hook = getattr(sys.modules.get("batch_test_hook"), "hook", None)
        if hook is not None:
            hook(arrays)
        total = sum(a.shape[0] for a in arrays)
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor("OUTPUT0", a * 2),
                    pb_utils.Tensor("ROWS", np.full((a.shape[0], 1), total, np.int32)),
                ]
            )
            for a in arrays
        ]
"""

NODES_PY = """
import numpy as np


class Double:
    inputs = {"x": {"datatype": "FP32", "dims": [-1, 4]}}
    outputs = {"y": {"datatype": "FP32", "dims": [-1, 4]}, "rows": {"datatype": "INT32", "dims": [-1, 1]}}

    def execute(self, inputs):
        x = inputs["x"]
        return {"y": x * 2, "rows": np.full((x.shape[0], 1), x.shape[0], np.int32)}
"""


def write_model(repo: Path, name: str, extra: str, dims: str = "[ -1 ]", ragged: bool = False) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL_PY)
    flag = " allow_ragged_batch: true" if ragged else ""
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims}{flag} }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }},'
        f' {{ name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }} ]\n' + extra
    )


class Hook:
    """Installed as ``sys.modules['batch_test_hook'].hook``; runs on instance threads."""

    def __init__(self) -> None:
        self.calls: list[list[np.ndarray]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.hold_first = False
        self.barrier: threading.Barrier | None = None
        self._lock = threading.Lock()

    def __call__(self, arrays: list[np.ndarray]) -> None:
        with self._lock:
            self.calls.append(arrays)
            first = len(self.calls) == 1
        if self.barrier is not None:
            self.barrier.wait()
        if first and self.hold_first:
            self.entered.set()
            assert self.release.wait(30), "the test never released the first execution"

    def firsts(self) -> list[float]:
        return [float(arrays[0].reshape(-1)[0]) for arrays in self.calls]


@pytest.fixture
def hook() -> Iterator[Hook]:
    module = types.ModuleType("batch_test_hook")
    installed = Hook()
    module.hook = installed  # type: ignore[attr-defined]
    sys.modules["batch_test_hook"] = module
    try:
        yield installed
    finally:
        installed.release.set()
        sys.modules.pop("batch_test_hook", None)


async def started(repo: Path, graphs: Path | None = None) -> flowserve.Engine:
    engine = await flowserve.Engine.start(repo, graphs)
    failed = [s for s in engine.registry.index() if s.state.value != "READY"]
    assert not failed, failed
    return engine


def batcher_of(engine: flowserve.Engine, name: str, node: int = 0) -> Batcher:
    batcher = engine.registry.get(name).executor.nodes[node]
    assert isinstance(batcher, Batcher)
    return batcher


async def settle(done: Callable[[], bool], turns: int = 500) -> None:
    for _ in range(turns):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


async def hold_instance(engine: flowserve.Engine, name: str, hook: Hook) -> asyncio.Task[TensorMap]:
    """Send one 1-row request and wait until its execution is holding the only instance."""
    hook.hold_first = True
    task = asyncio.ensure_future(engine.infer(name, {"INPUT0": np.full((1, 3), -1, np.float32)}))
    assert await asyncio.to_thread(hook.entered.wait, 30)
    return task


def x(n: int, start: float, width: int = 3) -> np.ndarray:
    return (np.arange(n * width, dtype=np.float32) + start).reshape(n, width)


async def test_concurrent_requests_merge_and_each_gets_its_own_rows(tmp_path: Path, hook: Hook) -> None:
    write_model(tmp_path, "echo", "max_batch_size: 8\ndynamic_batching { }\n")
    engine = await started(tmp_path)
    try:
        first = await hold_instance(engine, "echo", hook)
        inputs = [x(1, 0), x(2, 100), x(3, 200), x(2, 300), x(1, 400)]
        tasks = [asyncio.ensure_future(engine.infer("echo", {"INPUT0": a})) for a in inputs]
        batcher = batcher_of(engine, "echo")
        await settle(lambda: batcher.queued == 5)
        hook.release.set()
        results = await asyncio.gather(first, *tasks)
        for result, a in zip(results[1:], inputs, strict=True):
            np.testing.assert_array_equal(result["OUTPUT0"], a * 2)
        assert [int(r["ROWS"][0, 0]) for r in results] == [1, 8, 8, 8, 8, 1]
        stats = engine.registry.get("echo").stats
        assert (stats.execution_count, stats.inference_count) == (3, 10)
        assert {size: b.compute_infer.count for size, b in stats.batches.items()} == {1: 2, 8: 1}
        assert stats.queue.count == stats.compute_infer.count == stats.success.count == 6
    finally:
        await engine.stop()


async def test_a_preferred_size_is_sent_before_the_delay(tmp_path: Path, hook: Hook) -> None:
    config = (
        "max_batch_size: 16\n"
        "dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }\n"
    )
    write_model(tmp_path, "echo", config)
    engine = await started(tmp_path)
    try:
        results = await asyncio.gather(*(engine.infer("echo", {"INPUT0": x(1, i)}) for i in range(4)))
        assert [int(r["ROWS"][0, 0]) for r in results] == [4, 4, 4, 4]
    finally:
        await engine.stop()


async def test_n_instances_really_execute_n_batches_at_once(tmp_path: Path, hook: Hook) -> None:
    config = "max_batch_size: 2\ndynamic_batching { }\ninstance_group [ { kind: KIND_CPU count: 3 } ]\n"
    write_model(tmp_path, "wide", config)
    hook.barrier = threading.Barrier(3, timeout=30)  # passes only with 3 executions inside at once
    engine = await started(tmp_path)
    try:
        results = await asyncio.gather(*(engine.infer("wide", {"INPUT0": x(2, 10 * i)}) for i in range(3)))
        assert [int(r["ROWS"][0, 0]) for r in results] == [2, 2, 2]
        assert engine.registry.get("wide").stats.execution_count == 3
    finally:
        await engine.stop()


async def test_priorities_reorder_the_queue(tmp_path: Path, hook: Hook) -> None:
    config = "max_batch_size: 1\ndynamic_batching { priority_levels: 2 default_priority_level: 2 }\n"
    write_model(tmp_path, "prio", config)
    engine = await started(tmp_path)
    try:
        first = await hold_instance(engine, "prio", hook)
        order = [(1.0, 2), (2.0, 1), (3.0, 0), (4.0, 1)]
        tasks = [
            asyncio.ensure_future(
                engine.infer("prio", {"INPUT0": np.full((1, 3), v, np.float32)}, parameters={"priority": p})
            )
            for v, p in order
        ]
        await settle(lambda: batcher_of(engine, "prio").queued == 4)
        hook.release.set()
        await asyncio.gather(first, *tasks)
        assert hook.firsts() == [-1, 2, 4, 1, 3]
    finally:
        await engine.stop()


async def test_a_full_queue_answers_unavailable_immediately(tmp_path: Path, hook: Hook) -> None:
    config = "max_batch_size: 1\ndynamic_batching { default_queue_policy { max_queue_size: 1 } }\n"
    write_model(tmp_path, "small", config)
    engine = await started(tmp_path)
    try:
        first = await hold_instance(engine, "small", hook)
        queued = asyncio.ensure_future(engine.infer("small", {"INPUT0": x(1, 1)}))
        await settle(lambda: batcher_of(engine, "small").queued == 1)
        with pytest.raises(FlowserveError, match="exceeds maximum queue size") as info:
            await engine.infer("small", {"INPUT0": x(1, 2)})
        assert info.value.code is ErrorCode.UNAVAILABLE
        hook.release.set()
        await asyncio.gather(first, queued)
        assert engine.registry.get("small").stats.fail.count == 1
    finally:
        await engine.stop()


async def test_a_queue_timeout_rejects_with_unavailable(tmp_path: Path, hook: Hook) -> None:
    policy = "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 1000 }"
    write_model(tmp_path, "hurry", f"max_batch_size: 1\ndynamic_batching {{ {policy} }}\n")
    engine = await started(tmp_path)
    try:
        first = await hold_instance(engine, "hurry", hook)
        # the batcher wakes at the timeout by itself: no test-side sleep, no release first
        with pytest.raises(FlowserveError, match="Request timeout expired") as info:
            await engine.infer("hurry", {"INPUT0": x(1, 1)})
        assert info.value.code is ErrorCode.UNAVAILABLE
        hook.release.set()
        await first
    finally:
        await engine.stop()


async def test_unequal_shapes_never_share_a_batch(tmp_path: Path, hook: Hook) -> None:
    write_model(tmp_path, "shapes", "max_batch_size: 8\ndynamic_batching { }\n")
    engine = await started(tmp_path)
    try:
        first = await hold_instance(engine, "shapes", hook)
        inputs = [x(1, 0, 3), x(1, 0, 4), x(1, 0, 4), x(1, 0, 3)]
        tasks = [asyncio.ensure_future(engine.infer("shapes", {"INPUT0": a})) for a in inputs]
        await settle(lambda: batcher_of(engine, "shapes").queued == 4)
        hook.release.set()
        results = await asyncio.gather(first, *tasks)
        assert [int(r["ROWS"][0, 0]) for r in results[1:]] == [1, 2, 2, 1]
        for call in hook.calls:
            assert len({a.shape[1:] for a in call}) == 1
    finally:
        await engine.stop()


async def test_ragged_inputs_share_a_batch(tmp_path: Path, hook: Hook) -> None:
    write_model(tmp_path, "ragged", "max_batch_size: 8\ndynamic_batching { }\n", ragged=True)
    engine = await started(tmp_path)
    try:
        first = await hold_instance(engine, "ragged", hook)
        inputs = [x(1, 0, 3), x(1, 0, 5), x(1, 0, 2)]
        tasks = [asyncio.ensure_future(engine.infer("ragged", {"INPUT0": a})) for a in inputs]
        await settle(lambda: batcher_of(engine, "ragged").queued == 3)
        hook.release.set()
        results = await asyncio.gather(first, *tasks)
        assert [int(r["ROWS"][0, 0]) for r in results[1:]] == [3, 3, 3]
        for result, a in zip(results[1:], inputs, strict=True):
            np.testing.assert_array_equal(result["OUTPUT0"], a * 2)
    finally:
        await engine.stop()


def write_graph(root: Path, body: str) -> Path:
    graphs = root / "graphs"
    graphs.mkdir()
    (root / "flowserve_batch_test_nodes.py").write_text(NODES_PY)
    (graphs / "batched.yaml").write_text(body)
    return graphs


async def test_a_yaml_batching_node_merges_rows_for_a_python_node(tmp_path: Path) -> None:
    graphs = write_graph(
        tmp_path,
        """
name: batched
max_batch_size: 8
inputs:
  x: {datatype: FP32, dims: [4]}
outputs:
  y: double.y
  rows: double.rows
nodes:
  double:
    python: flowserve_batch_test_nodes:Double
    inputs: {x: $x}
    batching: {max_batch_size: 8, preferred_batch_size: [8], max_queue_delay_us: 30000000}
""",
    )
    (tmp_path / "repo").mkdir()
    engine = await started(tmp_path / "repo", graphs)
    try:
        inputs = [x(2, 10 * i, 4) for i in range(4)]
        results = await asyncio.gather(*(engine.infer("batched", {"x": a}) for a in inputs))
        for result, a in zip(results, inputs, strict=True):
            np.testing.assert_array_equal(result["y"], a * 2)
            assert result["rows"].tolist() == [[8], [8]]
        node_stats = batcher_of(engine, "batched").node_stats
        assert (node_stats.execution_count, node_stats.inference_count, node_stats.queue.count) == (1, 8, 4)
    finally:
        await engine.stop()


async def test_a_yaml_batching_node_merges_rows_for_a_model_step(tmp_path: Path, hook: Hook) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "plain", "max_batch_size: 8\n")  # no batcher of its own
    graphs = write_graph(
        tmp_path,
        """
name: batched
max_batch_size: 8
inputs:
  x: {datatype: FP32, dims: [3]}
outputs:
  y: step.OUTPUT0
  rows: step.ROWS
nodes:
  step:
    model: plain
    inputs: {INPUT0: $x}
    batching: {max_batch_size: 8, preferred_batch_size: [6], max_queue_delay_us: 30000000}
""",
    )
    engine = await started(repo, graphs)
    try:
        inputs = [x(2, 10 * i) for i in range(3)]
        results = await asyncio.gather(*(engine.infer("batched", {"x": a}) for a in inputs))
        for result, a in zip(results, inputs, strict=True):
            np.testing.assert_array_equal(result["y"], a * 2)
            assert result["rows"].tolist() == [[6], [6]]
        assert engine.registry.get("plain").stats.execution_count == 1
    finally:
        await engine.stop()


async def test_a_step_cannot_batch_past_its_models_max_batch_size(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "plain", "max_batch_size: 4\n")
    graphs = write_graph(
        tmp_path,
        """
name: batched
max_batch_size: 4
inputs:
  x: {datatype: FP32, dims: [3]}
outputs:
  y: step.OUTPUT0
nodes:
  step:
    model: plain
    inputs: {INPUT0: $x}
    batching: {max_batch_size: 8}
""",
    )
    engine = await flowserve.Engine.start(repo, graphs)
    try:
        [status] = [s for s in engine.registry.index() if s.name == "batched"]
        assert status.state.value == "UNAVAILABLE"
        assert "batching.max_batch_size 8 exceeds the max_batch_size 4 of 'plain'" in status.reason
    finally:
        await engine.stop()


async def test_a_switch_node_cannot_batch(tmp_path: Path) -> None:
    graphs = write_graph(
        tmp_path,
        """
name: batched
inputs:
  x: {datatype: FP32, dims: [-1]}
outputs:
  y: [gate.low, gate.high]
nodes:
  gate:
    switch: {input: $x, default: low, cases: [{branch: high, op: gt, value: 0}]}
    batching: {max_batch_size: 8}
""",
    )
    (tmp_path / "repo").mkdir()
    engine = await flowserve.Engine.start(tmp_path / "repo", graphs)
    try:
        [status] = [s for s in engine.registry.index() if s.name == "batched"]
        assert status.state.value == "UNAVAILABLE"
        assert "node 'gate': a switch node cannot batch" in status.reason
    finally:
        await engine.stop()


async def test_results_that_do_not_match_the_rows_fail_naming_the_node(tmp_path: Path, hook: Hook) -> None:
    write_model(tmp_path, "liar", "max_batch_size: 8\ndynamic_batching { }\n")
    model_py = tmp_path / "liar" / "1" / "model.py"
    model_py.write_text(
        model_py.read_text().replace('pb_utils.Tensor("OUTPUT0", a * 2)', 'pb_utils.Tensor("OUTPUT0", a[:1])')
    )
    engine = await started(tmp_path)
    try:
        with pytest.raises(FlowserveError, match="node 'liar': output 'OUTPUT0' of request 0") as info:
            await engine.infer("liar", {"INPUT0": x(2, 0)})
        assert info.value.code is ErrorCode.INTERNAL
    finally:
        await engine.stop()
