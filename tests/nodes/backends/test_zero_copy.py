"""Zero-copy edges with the real frameworks on the CPU: a torch -> ONNX Runtime -> torch graph
(benchmarks/zero_copy_cpu.py's) hands tensors on without copying them, torch outputs stay
torch tensors, ONNX Runtime binds a torch tensor's own memory, a Python node asking for
``tensors: dlpack`` gets the torch tensor itself, and the copies that remain (a read-only
front-end buffer, a numpy node after a device-aware one) are counted per node and exported."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from flowserve.core.device import DeviceTensor
from flowserve.dataplane.engine import Engine
from flowserve.dataplane.plane import DataPlane
from flowserve.observability.metrics import EngineCollector
from flowserve.observability.snapshot import node_summary
from tests.benchmark_module import load_benchmark

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")


PROBE = """
import numpy as np
import torch

SEEN = []

class Probe:
    tensors = "dlpack"
    outputs = {"y": {"datatype": "FP32", "dims": [-1]}}

    def execute(self, inputs):
        x = inputs["x"]
        SEEN.append((type(x), x.data_ptr() if isinstance(x, torch.Tensor) else None))
        return {"y": x + 0 if isinstance(x, torch.Tensor) else np.asarray(x)}

class Plain:
    outputs = {"y": {"datatype": "FP32", "dims": [-1]}}

    def execute(self, inputs):
        SEEN.append((type(inputs["x"]), None))
        return {"y": inputs["x"] * 1}
"""

PROBED = """
name: zc_probed
inputs:
  x: {datatype: FP32, dims: [-1]}
outputs:
  y: post.y
  plain: plain.y
nodes:
  pre: {model: zc_pre, inputs: {x: $x}}
  probe: {python: "zc_probe:Probe", inputs: {x: pre.y}}
  post: {model: zc_post, inputs: {x: probe.y}}
  plain: {python: "zc_probe:Plain", inputs: {x: pre.y}}
"""


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, Path, Path]:
    bench = load_benchmark("zero_copy_cpu")
    repo, graphs = bench.write_pipeline(tmp_path_factory.mktemp("zc"))
    (graphs / "zc_probed.yaml").write_text(PROBED)
    (graphs.parent / "zc_probe.py").write_text(PROBE)
    return bench, repo, graphs


async def test_torch_ort_torch_hands_tensors_on_without_copies(pipeline) -> None:
    bench, repo, graphs = pipeline
    x = np.random.default_rng(0).random(1 << 16, dtype=np.float32)
    async with serving(repo, graphs) as engine:
        out = await engine.infer("zc_pipeline", {"x": x})
        assert type(out["y"]) is np.ndarray  # numpy for the front end
        np.testing.assert_allclose(out["y"], bench.expected(x), rtol=1e-6)
        # writeable numpy in, CPU all the way: no node copied a byte
        assert bench.bytes_copied(engine) == 0
        # a front end's read-only buffer: torch cannot take it as is, one copy at the graph's edge
        readonly = np.frombuffer(x.tobytes(), np.float32)
        await engine.infer("zc_pipeline", {"x": readonly})
        assert bench.bytes_copied(engine) == x.nbytes
        assert engine.registry.get("zc_pre").stats.bytes_copied == x.nbytes
        # the copying path of the benchmark: one owned host copy per model input
        bench.set_copying(engine, True)
        try:
            await engine.infer("zc_pipeline", {"x": x})
        finally:
            bench.set_copying(engine, False)
        assert bench.bytes_copied(engine) == 4 * x.nbytes


async def test_torch_outputs_stay_torch_and_ort_binds_their_memory(pipeline, monkeypatch) -> None:
    _, repo, graphs = pipeline
    x = np.arange(8, dtype=np.float32)
    async with serving(repo, graphs) as engine:
        pre = engine.registry.get("zc_pre")
        out = await pre.infer({"x": x}, _ctx(), host=False)  # as a graph step gets it
        y = out["y"]
        assert isinstance(y, DeviceTensor) and isinstance(y.value, torch.Tensor)
        assert y.device.is_cpu and y.shape == (8,) and y.dtype == np.float32
        bound: list[Any] = []
        real = ort.OrtValue.from_dlpack

        def spy(value: Any) -> Any:
            made = real(value)
            bound.append((made.data_ptr(), value.data_ptr()))
            return made

        monkeypatch.setattr(ort.OrtValue, "from_dlpack", staticmethod(spy))
        mid = engine.registry.get("zc_mid")
        result = await mid.infer({"x": y}, _ctx(), host=False)
        np.testing.assert_array_equal(result["y"], x * 2 + 1)
        assert len(bound) == 1 and bound[0][0] == bound[0][1]  # ORT read the torch tensor's memory
        assert mid.stats.bytes_copied == 0


async def test_a_dlpack_python_node_gets_the_torch_tensor(pipeline, monkeypatch) -> None:
    _, repo, graphs = pipeline
    monkeypatch.syspath_prepend(str(graphs.parent))
    sys.modules.pop("zc_probe", None)
    x = np.arange(16, dtype=np.float32)
    async with serving(repo, graphs) as engine:
        out = await engine.infer("zc_probed", {"x": x})
        probe = sys.modules["zc_probe"]
        np.testing.assert_allclose(out["y"], x * 2 - 3)
        np.testing.assert_allclose(out["plain"], x * 2)
        kinds = dict(probe.SEEN)
        assert torch.Tensor in kinds and kinds[torch.Tensor] is not None  # as torch made it
        assert np.ndarray in kinds  # the default node got numpy (a view: host memory)
        servable = engine.registry.get("zc_probed")
        stats = {p.name: s for p, s in zip(servable.plan.nodes, servable.executor.stats, strict=True)}
        assert all(s.bytes_copied == 0 for s in stats.values())
        summary = node_summary(lambda n, v: None, servable, servable.plan.node("plain"), stats["plain"])
        assert summary["bytes_copied"] == 0


async def test_bytes_copied_is_exported_per_node(pipeline) -> None:
    _, repo, graphs = pipeline
    readonly = np.frombuffer(np.ones(64, np.float32).tobytes(), np.float32)
    async with serving(repo, graphs) as engine:
        await engine.infer("zc_pipeline", {"x": readonly})
        families = {m.name: m for m in EngineCollector(DataPlane(engine)).collect()}
    samples = {s.labels["model"]: s.value for s in families["flowserve_node_bytes_copied"].samples}
    assert samples["zc_pre"] == readonly.nbytes
    assert samples["zc_mid"] == 0 and samples["zc_post"] == 0 and samples["zc_pipeline"] == 0


@asynccontextmanager
async def serving(repo: Path, graphs: Path) -> AsyncIterator[Engine]:
    engine = await Engine.start([repo], [graphs])
    try:
        yield engine
    finally:
        await engine.stop()


def _ctx() -> Any:
    from flowserve.core.node import Context

    return Context()
