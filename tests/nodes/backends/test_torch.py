"""PyTorch backend: TorchScript and torch.export models give what torch gives, Triton's input and
output naming, no deprecation warning escapes, clear load errors."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from flowserve.nodes.backends._support import has_gpu
from flowserve.nodes.backends.torch import indexed_order, input_positions
from flowserve.runtime.registry import State

torch = pytest.importorskip("torch")

PT2_CONFIG = """
platform: "pytorch_libtorch"
default_model_filename: "model.pt2"
max_batch_size: 16
input [ { name: "features" data_type: TYPE_FP32 dims: [ 6 ] } ]
output [ { name: "scores" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""


def jit_load(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.jit.load(str(path))


def test_naming_rules() -> None:
    assert indexed_order(["INPUT__1", "INPUT__0"]) == [1, 0]
    assert indexed_order(["a", "INPUT__0"]) is None
    assert input_positions(["y", "x"], ["x", "y"]) == [1, 0]  # by forward()'s argument names
    assert input_positions(["INPUT__1", "INPUT__0"], ["x", "y"]) == [1, 0]  # by __index
    assert input_positions(["first", "second"], ["x", "y"]) == [0, 1]  # by config order


async def test_torchscript_matches_torch(bk) -> None:
    a = np.random.RandomState(0).rand(3, 16).astype(np.float32)
    b = np.random.RandomState(1).rand(3, 16).astype(np.float32)
    module = jit_load(bk.BUNDLED / "torch_add_sub/1/model.pt")
    want0, want1 = (t.numpy() for t in module(torch.from_numpy(a), torch.from_numpy(b)))
    async with bk.engine_for(bk.BUNDLED) as engine:
        out = await engine.infer("torch_add_sub", {"INPUT__0": a, "INPUT__1": b})
        one = await engine.infer("torch_add_sub", {"INPUT__0": a[:1], "INPUT__1": b[:1]})
    np.testing.assert_array_equal(out["OUTPUT__0"], want0)
    np.testing.assert_array_equal(out["OUTPUT__1"], want1)
    np.testing.assert_array_equal(one["OUTPUT__1"], want1[:1])


async def test_inputs_named_as_forward_arguments(bk, make_models, tmp_path: Path) -> None:
    config = """
platform: "pytorch_libtorch"
max_batch_size: 4
input [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "sum" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "diff" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
    model_dir = bk.write_model(tmp_path, "named", config)
    make_models.make_torch_add_sub(model_dir / "1" / "model.pt")
    x = np.array([[5.0, 7.0]], np.float32)
    y = np.array([[1.0, 2.0]], np.float32)
    async with bk.engine_for(tmp_path) as engine:
        out = await engine.infer("named", {"x": x, "y": y})
    np.testing.assert_array_equal(out["sum"], x + y)
    np.testing.assert_array_equal(out["diff"], x - y)  # x went to forward's x, not by position


async def test_torch_export_program(bk, make_models, tmp_path: Path) -> None:
    model_dir = bk.write_model(tmp_path, "exported", PT2_CONFIG)
    make_models.make_torch_export_linear(model_dir / "1" / "model.pt2")
    x = np.random.RandomState(2).rand(5, 6).astype(np.float32)
    want = (
        torch.export.load(str(model_dir / "1" / "model.pt2")).module()(torch.from_numpy(x)).detach().numpy()
    )
    async with bk.engine_for(tmp_path) as engine:
        out = await engine.infer("exported", {"features": x})
    np.testing.assert_allclose(out["scores"], want, rtol=1e-6)


async def test_read_only_inputs_are_accepted(bk) -> None:
    a = np.frombuffer(np.arange(16, dtype=np.float32).tobytes(), dtype=np.float32).reshape(1, 16)
    assert not a.flags.writeable
    async with bk.engine_for(bk.BUNDLED) as engine:
        out = await engine.infer("torch_add_sub", {"INPUT__0": a, "INPUT__1": a})
    np.testing.assert_array_equal(out["OUTPUT__0"], a * 2)


async def test_missing_torch_fails_only_that_model(bk, tmp_path: Path, monkeypatch) -> None:
    bk.copy_bundled(tmp_path, "torch_add_sub", "simple")
    monkeypatch.setitem(sys.modules, "torch", None)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "torch_add_sub")
        assert state is State.UNAVAILABLE
        assert "model 'torch_add_sub'" in reason and "'torch'" in reason and "flowserve[torch]" in reason
        assert engine.registry.has("simple")


async def test_bad_file_is_a_clear_error(bk, tmp_path: Path) -> None:
    config = (bk.BUNDLED / "torch_add_sub" / "config.pbtxt").read_text().replace("torch_add_sub", "bad_pt")
    bk.write_model(tmp_path, "bad_pt", config, {"1/model.pt": b"nope"})
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "bad_pt")
    assert state is State.UNAVAILABLE and "model 'bad_pt'" in reason and "torch cannot load" in reason


@pytest.mark.gpu
@pytest.mark.skipif(
    not has_gpu() or not torch.cuda.is_available(), reason="needs an NVIDIA GPU and CUDA torch"
)
async def test_gpu_instance_owns_device_and_stream(bk, tmp_path: Path) -> None:
    bk.copy_bundled(tmp_path, "torch_add_sub")
    path = tmp_path / "torch_add_sub" / "config.pbtxt"
    path.write_text(path.read_text().replace("KIND_AUTO", "KIND_GPU"))
    a = np.random.RandomState(0).rand(2, 16).astype(np.float32)
    async with bk.engine_for(tmp_path) as engine:
        instance = bk.instance_of(engine, "torch_add_sub")
        assert instance.device.type == "cuda" and instance.stream is not None
        out = await engine.infer("torch_add_sub", {"INPUT__0": a, "INPUT__1": a})
    np.testing.assert_allclose(out["OUTPUT__0"], a * 2)
