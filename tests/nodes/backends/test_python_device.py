"""Triton model.py with tensors where they are: ``FORCE_CPU_ONLY_INPUT_TENSORS`` "no" hands
model.py the inputs as their producers made them, ``pb_utils.Tensor.to_dlpack()`` gives them
back without a copy, ``pb_utils.Tensor.from_dlpack()`` outputs stay DLPack tensors and flow on.

On the CPU: the parameter parsed, a torch -> model.py -> torch graph (YAML and ensemble) whose
tensors pass through model.py without a copy, a GPU-like DLPack input (on the fake device)
ordered before model.py reads it, and the default unchanged. On a GPU (marked ``gpu``): the same
graph with torch GPU models, model.py sees ``is_cpu()`` False, nothing is copied in between."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from flowserve.core.device import CPU, Device, DeviceTensor, FakeBuffer, FakeDevice, OrderingError, produced
from flowserve.core.errors import FlowserveError
from flowserve.nodes.backends import pb_utils
from flowserve.nodes.backends._support import has_gpu
from tests.benchmark_module import load_benchmark

torch = pytest.importorskip("torch")


PROBE = """
import sys

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        sink = sys.modules["probe_sink"]
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x")
            if sink.mode == "fake":  # a fake GPU tensor: is_cpu, then its DLPack, as it is
                sink.seen.append({"is_cpu": x.is_cpu(), "capsule": x.to_dlpack()})
                out = pb_utils.Tensor.from_dlpack("y", x)
            else:
                t = torch.utils.dlpack.from_dlpack(x.to_dlpack())
                kept = type(x._edge()).__name__  # what the engine handed over: numpy or DeviceTensor
                sink.seen.append({"is_cpu": x.is_cpu(), "device": str(t.device), "kept": kept})
                out = pb_utils.Tensor.from_dlpack("y", t + 1)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""

PY_CONFIG = """
name: "dev_py"
backend: "python"
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: {kind} count: 1 }} ]
{parameters}
"""
NO = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "no" } }'

TORCH_CONFIG = """
name: "{name}"
platform: "pytorch_libtorch"
default_model_filename: "model.pt2"
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ kind: {kind} count: 1 }} ]
"""

ENSEMBLE = """
name: "dev_ensemble"
platform: "ensemble"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "dev_pre" model_version: -1 input_map { key: "x" value: "x" } output_map { key: "y" value: "a" } },
  { model_name: "dev_py" model_version: -1 input_map { key: "x" value: "a" } output_map { key: "y" value: "b" } },
  { model_name: "dev_post" model_version: -1 input_map { key: "x" value: "b" } output_map { key: "y" value: "y" } }
] }
"""

GRAPH = """
name: dev_graph
inputs:
  x: {datatype: FP32, dims: [-1]}
outputs:
  y: post.y
nodes:
  pre: {model: dev_pre, inputs: {x: $x}}
  mid: {model: dev_py, inputs: {x: pre.y}}
  post: {model: dev_post, inputs: {x: mid.y}}
"""


@pytest.fixture
def sink() -> Iterator[types.SimpleNamespace]:
    probe = types.SimpleNamespace(seen=[], mode="torch")
    sys.modules["probe_sink"] = probe  # type: ignore[assignment]
    try:
        yield probe
    finally:
        sys.modules.pop("probe_sink", None)


def _write(bk: Any, root: Path, kind: str, parameters: str = NO) -> tuple[Path, Path]:
    """dev_pre (torch, y = 2x) -> dev_py (model.py, y = x + 1) -> dev_post (torch, y = x - 3), as
    an ensemble and as a YAML graph."""
    repo, graphs = root / "models", root / "graphs"
    bench = load_benchmark("zero_copy_cpu")
    for name, scale, shift in (("dev_pre", 2.0, 0.0), ("dev_post", 1.0, -3.0)):
        bk.write_model(repo, name, TORCH_CONFIG.format(name=name, kind=kind))
        bench._torch_model(repo / name / "1" / "model.pt2", scale, shift)
    bk.write_model(
        repo, "dev_py", PY_CONFIG.format(kind=kind, parameters=parameters), {"1/model.py": PROBE.encode()}
    )
    bk.write_model(repo, "dev_ensemble", ENSEMBLE)
    graphs.mkdir(parents=True, exist_ok=True)
    (graphs / "dev_graph.yaml").write_text(GRAPH)
    return repo, graphs


def _copied(engine: Any, *names: str) -> dict[str, int]:
    """Bytes copied per servable: its own backend's and its executor's nodes'."""
    out = {}
    for name in names:
        servable = engine.registry.get(name)
        out[name] = servable.stats.bytes_copied + sum(s.bytes_copied for s in servable.executor.stats)
    return out


def _expected(x: np.ndarray) -> np.ndarray:
    return (x * 2.0 + 1.0) - 3.0


# ----------------------------------------------------------------------------- the parameter


@pytest.mark.parametrize(
    ("parameters", "device_tensors"),
    [
        ("", False),
        ('parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "yes" } }', False),
        (NO, True),
        ('parameters { key: "force_cpu_only_input_tensors" value { string_value: "No" } }', True),
    ],
)
async def test_the_parameter_decides_what_model_py_gets(
    bk, tmp_path: Path, parameters: str, device_tensors: bool
) -> None:
    bk.write_model(
        tmp_path,
        "dev_py",
        PY_CONFIG.format(kind="KIND_CPU", parameters=parameters),
        {"1/model.py": PROBE.encode()},
    )
    async with bk.engine_for(tmp_path) as engine:
        node = engine.registry.get("dev_py").executor.nodes[0]
        assert bool(getattr(node, "device_tensors", False)) is device_tensors


async def test_a_bad_value_fails_the_load_naming_the_parameter(bk, tmp_path: Path) -> None:
    bad = 'parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value { string_value: "maybe" } }'
    bk.write_model(
        tmp_path, "dev_py", PY_CONFIG.format(kind="KIND_CPU", parameters=bad), {"1/model.py": PROBE.encode()}
    )
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "dev_py")
    assert state.name == "UNAVAILABLE" and "FORCE_CPU_ONLY_INPUT_TENSORS" in reason and "maybe" in reason


# ----------------------------------------------------------------------------- pb_utils alone


def test_to_dlpack_of_a_host_dlpack_input_is_the_producers_memory() -> None:
    source = torch.arange(6, dtype=torch.float32)
    tensor = pb_utils.Tensor._of_device("x", DeviceTensor(source, np.dtype(np.float32), (6,), CPU))
    assert tensor.is_cpu() and tensor.shape() == [6] and tensor.triton_dtype() == 11
    back = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    assert back.data_ptr() == source.data_ptr()  # no copy
    assert tensor.as_numpy().ctypes.data == source.data_ptr()  # a view
    assert torch.from_dlpack(tensor).data_ptr() == source.data_ptr()


def test_from_dlpack_keeps_a_host_tensor_as_a_device_tensor_without_a_copy() -> None:
    source = torch.arange(4, dtype=torch.int64)
    for made in (
        pb_utils.Tensor.from_dlpack("y", source),
        pb_utils.Tensor.from_dlpack("y", torch.utils.dlpack.to_dlpack(source)),
    ):
        edge = made._edge()
        assert (
            isinstance(edge, DeviceTensor)
            and edge.device == CPU
            and edge.value.data_ptr() == source.data_ptr()
        )
        assert made.as_numpy().tolist() == [0, 1, 2, 3] and made.as_numpy().ctypes.data == source.data_ptr()
        assert made.is_cpu() and made.triton_dtype() == 9
    # a numpy producer stays numpy (a view)
    array = np.arange(3, dtype=np.float32)
    made = pb_utils.Tensor.from_dlpack("z", array)
    assert made._edge() is not None and made.as_numpy().ctypes.data == array.ctypes.data


def test_from_dlpack_refuses_what_is_not_dlpack() -> None:
    with pytest.raises(pb_utils.TritonModelException, match="expected a DLPack capsule"):
        pb_utils.Tensor.from_dlpack("y", [1, 2, 3])


class _FakeCuda(FakeBuffer):
    """Fake-device memory that speaks DLPack as CUDA memory would (never read on the host)."""

    def __dlpack__(self, **_: Any) -> tuple[str, FakeBuffer]:
        return ("capsule", self)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


def _fake_gpu_tensor() -> tuple[FakeDevice, DeviceTensor, _FakeCuda]:
    device = FakeDevice()
    producer = device.stream(device.device)
    device.launch(producer, "make", lambda: np.ones(4, np.float32))
    value = _FakeCuda(np.ones(4, np.float32), producer)
    tensor = produced(value, producer, device, np.dtype(np.float32), (4,), Device("cuda", 0))
    value.guard = tensor.event.number
    return device, tensor, value


def test_a_gpu_input_is_ordered_before_model_py_reads_it_and_never_copied() -> None:
    device, tensor, value = _fake_gpu_tensor()
    made = pb_utils.Tensor._of_device("x", tensor)
    assert not made.is_cpu() and made.shape() == [4] and made.__dlpack_device__() == (2, 0)
    assert "cuda:0" in repr(made)
    with pytest.raises(pb_utils.TritonModelException, match=r"GPU memory.*to_dlpack"):
        made.as_numpy()
    # the thread's current stream waits on the producer's event before the capsule is handed out
    with pytest.raises(OrderingError):
        device.use(value, device.current(device.device))
    capsule = made.to_dlpack()
    assert capsule == ("capsule", value)
    assert ("wait", device.current(device.device), tensor.event) in device.log
    assert device.ops("to_host") == [] and device.ops("host_wait") == []


async def test_model_py_hands_a_gpu_tensor_on_as_it_came(bk, tmp_path: Path, sink) -> None:
    """The python backend itself: a fake-GPU input reaches execute() as a GPU tensor, and the
    output model.py made of it with from_dlpack leaves as that same device tensor."""
    sink.mode = "fake"
    bk.write_model(
        tmp_path, "dev_py", PY_CONFIG.format(kind="KIND_CPU", parameters=NO), {"1/model.py": PROBE.encode()}
    )
    _device, tensor, value = _fake_gpu_tensor()
    async with bk.engine_for(tmp_path) as engine:
        node = bk.backend_node(engine, "dev_py")
        out = node.execute(node.pool.instances[0], {"x": tensor})
        assert node.stats.bytes_copied == 0
    assert sink.seen == [{"is_cpu": False, "capsule": ("capsule", value)}]
    y = out["y"]
    assert isinstance(y, DeviceTensor) and y is tensor and y.value is value


# ----------------------------------------------------------------------------- through the engine


@pytest.mark.parametrize("target", ["dev_graph", "dev_ensemble"])
async def test_torch_model_py_torch_on_the_cpu_copies_nothing(bk, tmp_path: Path, sink, target: str) -> None:
    from flowserve.dataplane.engine import Engine

    repo, graphs = _write(bk, tmp_path, "KIND_CPU")
    engine = await Engine.start([repo], [graphs])
    try:
        x = np.random.default_rng(0).random(1 << 16, dtype=np.float32)
        out = await engine.infer(target, {"x": x})
        np.testing.assert_allclose(out["y"], _expected(x), rtol=1e-6)
        copied = _copied(engine, target, "dev_pre", "dev_py", "dev_post")
    finally:
        await engine.stop()
    # model.py got the torch model's tensor as it was, in host memory
    assert sink.seen == [{"is_cpu": True, "device": "cpu", "kept": "DeviceTensor"}]
    assert copied == dict.fromkeys(copied, 0)


async def test_the_default_hands_model_py_numpy(bk, tmp_path: Path, sink) -> None:
    from flowserve.dataplane.engine import Engine

    repo, graphs = _write(bk, tmp_path, "KIND_CPU", parameters="")
    engine = await Engine.start([repo], [graphs])
    try:
        x = np.arange(8, dtype=np.float32)
        out = await engine.infer("dev_graph", {"x": x})
    finally:
        await engine.stop()
    np.testing.assert_allclose(out["y"], _expected(x))
    assert sink.seen == [{"is_cpu": True, "device": "cpu", "kept": "ndarray"}]


def test_a_dlpack_output_of_an_unknown_dtype_says_so() -> None:
    made = pb_utils.Tensor.from_dlpack("c", torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(FlowserveError):
        made.triton_dtype()


# ----------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.skipif(
    not has_gpu() or not torch.cuda.is_available(), reason="needs an NVIDIA GPU and CUDA torch"
)
@pytest.mark.parametrize("target", ["dev_graph", "dev_ensemble"])
async def test_torch_gpu_model_py_torch_gpu_keeps_tensors_on_the_gpu(
    bk, tmp_path: Path, sink, target: str
) -> None:
    from flowserve.dataplane.engine import Engine

    repo, graphs = _write(bk, tmp_path, "KIND_GPU")
    engine = await Engine.start([repo], [graphs])
    try:
        x = np.random.default_rng(0).random(1 << 20, dtype=np.float32)
        out = await engine.infer(target, {"x": x})
        np.testing.assert_allclose(out["y"], _expected(x), rtol=1e-5)
        copied = _copied(engine, target, "dev_pre", "dev_py", "dev_post")
    finally:
        await engine.stop()
    seen = sink.seen[0]
    assert seen["is_cpu"] is False and seen["device"].startswith("cuda")
    # model.py and the edges into and out of it copy nothing: the only copies are x to the GPU
    # (dev_pre) and, at most, y back to the host for the response (the graph's last node)
    assert copied["dev_py"] == 0 and copied["dev_post"] == 0
    assert copied["dev_pre"] == x.nbytes and copied[target] <= x.nbytes
