"""The engine end to end, in-process: bundled content, concurrency, switches, errors, loading."""

from __future__ import annotations

import asyncio
import importlib
import itertools
import shutil
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import ErrorCode, FlowserveError, InvalidArgument, NotFound, Unavailable
from flowserve.core.types import InferRequest, RequestedOutput

ROOT = Path(__file__).resolve().parents[2]
_counter = itertools.count()


@pytest.fixture
async def bundled() -> AsyncIterator[flowserve.Engine]:
    engine = await flowserve.Engine.start(ROOT / "model_repository", ROOT / "graphs")
    try:
        yield engine
    finally:
        await engine.stop()


@pytest.fixture
def node_module(tmp_path: Path) -> Iterator[object]:
    """Write a Python node module under a fresh name; yields a function (source) -> module name."""
    sys.path.insert(0, str(tmp_path))

    def make(source: str) -> str:
        name = f"test_nodes_{next(_counter)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    try:
        yield make
    finally:
        sys.path.remove(str(tmp_path))


def pair() -> dict[str, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    return {"INPUT0": a, "INPUT1": np.full((1, 16), 3, dtype=np.int32)}


async def test_simple_model(bundled: flowserve.Engine) -> None:
    out = await bundled.infer("simple", pair())
    a = pair()["INPUT0"]
    np.testing.assert_array_equal(out["OUTPUT0"], a + 3)
    np.testing.assert_array_equal(out["OUTPUT1"], a - 3)


async def test_triton_ensemble_runs_unchanged(bundled: flowserve.Engine) -> None:
    out = await bundled.infer("simple_ensemble", pair())
    np.testing.assert_array_equal(out["OUTPUT0"], 2 * pair()["INPUT0"])
    np.testing.assert_array_equal(out["OUTPUT1"], np.full((1, 16), 6, np.int32))
    # composing model counted its two executions
    assert bundled.registry.get("simple").stats.execution_count == 2


async def test_fanout_fanin_graph(bundled: flowserve.Engine) -> None:
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    out = await bundled.infer("fanout", {"a": a, "b": b})
    np.testing.assert_array_equal(out["total"], 5 * a - b)
    np.testing.assert_array_equal(out["sum"], a + b)


async def test_switch_routes_and_skips(bundled: flowserve.Engine) -> None:
    big = await bundled.infer("route", {"x": np.array([1, 500], np.float32)})
    np.testing.assert_allclose(big["y"], [0.01, 5.0])
    small = await bundled.infer("route", {"x": np.array([1, 2], np.float32)})
    np.testing.assert_array_equal(small["y"], [1, 2])
    executor = bundled.registry.get("route").executor
    by_name = {n.name: executor.stats[n.index] for n in executor.plan.nodes}
    assert by_name["shrink"].calls == 1 and by_name["shrink"].skipped == 1
    assert by_name["keep"].calls == 1 and by_name["keep"].skipped == 1


async def test_independent_branches_run_concurrently(tmp_path: Path, node_module: object) -> None:
    module = node_module(  # type: ignore[operator]
        """
        import asyncio, threading
        import numpy as np

        BARRIER = threading.Barrier(2, timeout=10)
        EVENTS = {}

        class SyncBranch:
            outputs = {"y": ("FP32", [-1])}
            def execute(self, inputs):
                BARRIER.wait()  # both sync branches must be inside execute at once
                return {"y": inputs["x"] + 1}

        class AsyncBranch:
            outputs = {"y": ("FP32", [-1])}
            def initialize(self, config):
                self.me, self.other = config["parameters"]["me"], config["parameters"]["other"]
            async def execute(self, inputs):
                for key in (self.me, self.other):
                    EVENTS.setdefault(key, asyncio.Event())
                EVENTS[self.me].set()
                await asyncio.wait_for(EVENTS[self.other].wait(), 10)
                EVENTS.pop(self.other, None)
                return {"y": inputs["x"] * 2}

        class Add:
            outputs = {"y": ("FP32", [-1])}
            def execute(self, inputs):
                return {"y": inputs["a"] + inputs["b"] + inputs["c"] + inputs["d"]}
        """
    )
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    (graphs / "par.yaml").write_text(
        f"""
inputs: {{x: {{datatype: FP32, dims: [-1]}}}}
outputs: {{y: join.y}}
nodes:
  s1: {{python: {module}:SyncBranch, inputs: {{x: $x}}}}
  s2: {{python: {module}:SyncBranch, inputs: {{x: $x}}}}
  a1: {{python: {module}:AsyncBranch, parameters: {{me: a1, other: a2}}, inputs: {{x: $x}}}}
  a2: {{python: {module}:AsyncBranch, parameters: {{me: a2, other: a1}}, inputs: {{x: $x}}}}
  join: {{python: {module}:Add, inputs: {{a: s1.y, b: s2.y, c: a1.y, d: a2.y}}}}
"""
    )
    engine = await flowserve.Engine.start(graphs=graphs)
    try:
        out = await asyncio.wait_for(engine.infer("par", {"x": np.array([1.0], np.float32)}), 20)
        np.testing.assert_array_equal(out["y"], [2 + 2 + 2 + 2])
    finally:
        await engine.stop()


async def test_failing_node_is_named_and_next_request_succeeds(tmp_path: Path, node_module: object) -> None:
    module = node_module(  # type: ignore[operator]
        """
        class Picky:
            outputs = {"y": ("INT32", [-1])}
            def execute(self, inputs):
                if (inputs["x"] < 0).any():
                    raise ValueError("negative values are not allowed")
                return {"y": inputs["x"]}
        """
    )
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    (graphs / "picky.yaml").write_text(
        f"inputs: {{x: {{datatype: INT32, dims: [-1]}}}}\noutputs: {{y: check.y}}\n"
        f"nodes:\n  check: {{python: {module}:Picky, inputs: {{x: $x}}}}\n"
    )
    engine = await flowserve.Engine.start(ROOT / "model_repository", graphs)
    try:
        with pytest.raises(flowserve.NodeError) as info:
            await engine.infer("picky", {"x": np.array([-1], np.int32)})
        assert (
            str(info.value) == "in graph 'picky', node 'check': ValueError: negative values are not allowed"
        )
        assert info.value.code is ErrorCode.INTERNAL
        out = await engine.infer("picky", {"x": np.array([4], np.int32)})
        np.testing.assert_array_equal(out["y"], [4])
        stats = engine.registry.get("picky").stats
        assert (stats.success.count, stats.fail.count) == (1, 1)
    finally:
        await engine.stop()


async def test_error_inside_ensemble_step_names_the_path(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "tests" / "models" / "failing", repo / "failing")
    (repo / "wrap" / "1").mkdir(parents=True)
    (repo / "wrap" / "config.pbtxt").write_text(
        """
platform: "ensemble"
input [{name: "X" data_type: TYPE_INT32 dims: [-1]}]
output [{name: "Y" data_type: TYPE_INT32 dims: [-1]}]
ensemble_scheduling { step [ { model_name: "failing" model_version: -1
  input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "Y" } } ] }
"""
    )
    engine = await flowserve.Engine.start(repo)
    try:
        with pytest.raises(FlowserveError) as info:
            await engine.infer("wrap", {"X": np.array([-3], np.int32)})
        # the step's model words its error as Triton's python backend does (naming it)
        assert (
            "in graph 'wrap', node 'failing': Failed to process the request(s) for model 'failing_0_0'"
            in str(info.value)
        )
        assert "negative input" in str(info.value)
    finally:
        await engine.stop()


async def test_bad_model_next_to_good_ones(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository" / "simple", repo / "simple")
    shutil.copytree(ROOT / "tests" / "models" / "broken", repo / "broken")
    (repo / "garbled").mkdir()
    (repo / "garbled" / "config.pbtxt").write_text("not { valid")
    (repo / "nobackend" / "1").mkdir(parents=True)
    (repo / "nobackend" / "config.pbtxt").write_text('backend: "nosuchbackend"')
    engine = await flowserve.Engine.start(repo)
    try:
        out = await engine.infer("simple", pair())
        assert out["OUTPUT0"].shape == (1, 16)
        index = {(s.name, s.version): s for s in engine.registry.index()}
        assert index[("simple", "1")].state.value == "READY"
        assert index[("broken", "1")].state.value == "UNAVAILABLE"
        assert "this model is broken on purpose" in index[("broken", "1")].reason
        assert "cannot parse config.pbtxt" in index[("garbled", "")].reason
        assert "backend 'nosuchbackend' is not supported" in index[("nobackend", "1")].reason
        with pytest.raises(Unavailable, match="model 'broken' is not ready"):
            await engine.infer("broken", {"INPUT0": np.array([1], np.int32)})
        with pytest.raises(NotFound, match="unknown model: 'nothere'"):
            await engine.infer("nothere", {})
    finally:
        await engine.stop()


async def test_request_validation_messages(bundled: flowserve.Engine) -> None:
    a = pair()["INPUT0"]
    cases = [
        (
            {"INPUT0": a},
            "expected 2 inputs but got 1 inputs for model 'simple'. Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']",
        ),
        ({**pair(), "EXTRA": a}, "unexpected inference input 'EXTRA' for model 'simple'"),
        (
            {"INPUT0": a.astype(np.float32), "INPUT1": a},
            "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'",
        ),
        (
            {"INPUT0": a[:, :8], "INPUT1": a},
            "unexpected shape for input 'INPUT0' for model 'simple'. Expected [16], got [8]",
        ),
        (
            {"INPUT0": np.zeros((9, 16), np.int32), "INPUT1": np.zeros((9, 16), np.int32)},
            "batch-size must be <= 8 for 'simple'",
        ),
        ({"INPUT0": np.zeros((2, 16), np.int32), "INPUT1": a}, "disagree on the batch size"),
    ]
    for inputs, message in cases:
        with pytest.raises(InvalidArgument) as info:
            await bundled.infer("simple", inputs)
        assert message in str(info.value)
    assert bundled.registry.get("simple").stats.fail.count == len(cases)


async def test_requested_outputs_and_classification(bundled: flowserve.Engine) -> None:
    inputs = {"INPUT0": np.array([[5, 1, 9, 3] + [0] * 12], np.int32), "INPUT1": np.zeros((1, 16), np.int32)}
    response = await bundled.infer_request(
        InferRequest("simple", inputs, outputs=[RequestedOutput("OUTPUT0", class_count=2)], id="r1")
    )
    assert list(response.outputs) == ["OUTPUT0"]
    assert response.id == "r1" and response.version == "1"
    assert response.outputs["OUTPUT0"].tolist() == [[b"9.000000:2", b"5.000000:0"]]
    with pytest.raises(InvalidArgument, match="unexpected inference output 'NOPE' for model 'simple'"):
        await bundled.infer_request(InferRequest("simple", inputs, outputs=[RequestedOutput("NOPE")]))


async def test_reload_with_config_override_and_unload_dependents(bundled: flowserve.Engine) -> None:
    # a model loaded from files sent with the request (Triton's load API with file: overrides)
    config = '{"backend": "python", "max_batch_size": 0, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [-1]}], "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [-1]}]}'
    code = b"""
import triton_python_backend_utils as pb_utils
class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 10)]) for r in requests]
"""
    await bundled.load_model("times10", config, {"1/model.py": code})
    out = await bundled.infer("times10", {"X": np.array([1.5], np.float32)})
    np.testing.assert_array_equal(out["Y"], [15.0])
    with pytest.raises(InvalidArgument, match="must stay inside the model directory"):
        await bundled.load_model("evil", config, {"../../x.py": b""})
    # unloading simple with its dependents takes the ensemble and the fanout graph along
    unloaded = await bundled.unload_model("simple", unload_dependents=True)
    assert set(unloaded) == {"simple", "simple_ensemble", "fanout"}
    assert not bundled.model_ready("simple_ensemble")
    assert bundled.model_ready("route")
    # and loading brings simple back
    await bundled.load_model("simple")
    assert bundled.model_ready("simple")
    out = await bundled.infer("simple", pair())
    assert out["OUTPUT0"].shape == (1, 16)


async def test_unload_waits_for_in_flight_requests_without_polling(
    tmp_path: Path, node_module: object
) -> None:
    """A retired version is stopped when its last in-flight request ends (signalled, not polled),
    and a request running during the unload completes."""
    module = node_module(  # type: ignore[operator]
        """
        import asyncio

        GATE = {}

        class Slow:
            outputs = {"y": ("FP32", [-1])}
            async def execute(self, inputs):
                GATE["entered"].set()
                await GATE["release"].wait()
                return {"y": inputs["x"] + 1}
        """
    )
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    (graphs / "slow.yaml").write_text(
        f"""
inputs: {{x: {{datatype: FP32, dims: [-1]}}}}
outputs: {{y: s.y}}
nodes:
  s: {{python: {module}:Slow, inputs: {{x: $x}}}}
"""
    )
    gate = importlib.import_module(module).GATE
    gate["entered"], gate["release"] = asyncio.Event(), asyncio.Event()
    engine = await flowserve.Engine.start(graphs=graphs)
    try:
        servable = engine.registry.get("slow", "")
        request = asyncio.create_task(engine.infer("slow", {"x": np.array([1.0], np.float32)}))
        await asyncio.wait_for(gate["entered"].wait(), 10)
        unload = asyncio.create_task(engine.unload_model("slow"))
        await asyncio.sleep(0.05)
        assert not unload.done() and servable.stats.pending == 1
        gate["release"].set()
        np.testing.assert_array_equal((await asyncio.wait_for(request, 10))["y"], [2.0])
        assert await asyncio.wait_for(unload, 10) == ["slow"]
        assert not engine.model_ready("slow")
        # nothing in flight: drained at once; a request that never ends: False after the timeout
        assert await servable.drained(0.0)
        servable.stats.pending = 1
        assert not await servable.drained(0.02)
        servable.stats.pending = 0
    finally:
        gate["release"].set()
        await engine.stop()
