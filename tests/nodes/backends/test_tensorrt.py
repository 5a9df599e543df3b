"""TensorRT backend: GPU only. Here (no GPU) loading a plan is a clear error that names the model,
the backend and what is missing, and never touches TensorRT (its runtime crashes without CUDA).
Profile selection is pure and tested here; the engine path runs where a GPU and TensorRT exist."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from flowserve.nodes.backends import _support
from flowserve.nodes.backends._support import has_gpu
from flowserve.nodes.backends.tensorrt import fits, select_profile
from flowserve.runtime.registry import State

CONFIG = """
platform: "tensorrt_plan"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
"""


def _full_tensorrt() -> bool:
    try:
        import tensorrt
    except Exception:
        return False
    return hasattr(tensorrt, "Builder")


def test_profile_selection() -> None:
    profiles = [
        {"x": ((1, 16), (4, 16))},
        {"x": ((5, 16), (64, 16))},
    ]
    assert fits((3, 16), (1, 16), (4, 16))
    assert not fits((3, 8), (1, 16), (4, 16))
    assert select_profile({"x": (2, 16)}, profiles) == 0
    assert select_profile({"x": (32, 16)}, profiles) == 1
    assert select_profile({"x": (65, 16)}, profiles) == -1
    assert select_profile({"x": (2, 16)}, []) == -1


async def test_no_gpu_is_a_clear_error_and_others_keep_serving(bk, tmp_path: Path, monkeypatch) -> None:
    if has_gpu():
        monkeypatch.setenv("FLOWSERVE_NO_GPU", "1")
    bk.copy_bundled(tmp_path, "simple")
    bk.write_model(tmp_path, "trt_model", CONFIG, {"1/model.plan": b"an engine would be here"})
    a = np.ones((1, 16), np.int32)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "trt_model")
        assert state is State.UNAVAILABLE
        assert "model 'trt_model'" in reason and "backend 'tensorrt'" in reason and "GPU" in reason
        out = await engine.infer("simple", {"INPUT0": a, "INPUT1": a})
    np.testing.assert_array_equal(out["OUTPUT0"], a * 2)


async def test_gpu_without_tensorrt_names_the_package(bk, tmp_path: Path, monkeypatch) -> None:
    """A GPU is there (faked) but TensorRT is not: the message says what to install."""
    monkeypatch.delenv("FLOWSERVE_NO_GPU", raising=False)
    monkeypatch.setattr(_support, "_cuda_probe", lambda: (1, ""))
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    monkeypatch.setitem(sys.modules, "tensorrt_lean", None)
    bk.write_model(tmp_path, "trt_model", CONFIG, {"1/model.plan": b"x"})
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "trt_model")
    assert state is State.UNAVAILABLE
    assert "model 'trt_model'" in reason and "'tensorrt'" in reason and "'tensorrt_lean'" in reason


@pytest.mark.gpu
@pytest.mark.skipif(
    not has_gpu() or not _full_tensorrt(), reason="needs an NVIDIA GPU and TensorRT (with its builder)"
)
async def test_engine_matches_onnxruntime(bk, make_models, tmp_path: Path) -> None:
    """Build a plan from the ONNX add/sub model with TensorRT's builder (dynamic batch, one
    optimization profile), serve it, compare with onnxruntime."""
    import tensorrt as trt

    pytest.importorskip("onnx")  # the model is built from ONNX (make_onnx_add_sub)
    onnx_path = tmp_path / "add_sub.onnx"
    make_models.make_onnx_add_sub(onnx_path)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_path.read_bytes())
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name in ("INPUT0", "INPUT1"):
        profile.set_shape(name, (1, 16), (4, 16), (8, 16))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    bk.write_model(tmp_path, "trt_add_sub", CONFIG, {"1/model.plan": bytes(plan)})
    a = np.random.RandomState(0).rand(3, 16).astype(np.float32)
    b = np.random.RandomState(1).rand(3, 16).astype(np.float32)
    async with bk.engine_for(tmp_path) as engine:
        out = await engine.infer("trt_add_sub", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_allclose(out["OUTPUT0"], a + b, rtol=1e-6)
    np.testing.assert_allclose(out["OUTPUT1"], a - b, rtol=1e-6)
