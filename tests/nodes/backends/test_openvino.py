"""OpenVINO backend: IR and ONNX files, outputs equal to OpenVINO called directly (batched and
unbatched), a compiled model per instance, device and compile properties from parameters,
auto-complete, clear load errors."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from flowserve.nodes.backends import autocompletions
from flowserve.runtime.registry import State
from flowserve.spec.repository import scan_model

ov = pytest.importorskip("openvino")


def ir_model(
    bk: Any, make_models: ModuleType, repo: Path, name: str, config: str | None, batch: int = -1
) -> Path:
    model_dir = bk.write_model(repo, name, config)
    make_models.make_openvino_ir(model_dir / "1" / "model.xml", batch=batch)
    return model_dir


def direct(path: Path, feed: dict[str, np.ndarray], output: str, **props: str) -> np.ndarray:
    """OpenVINO itself, with its device defaults (on CPUs with bf16 the default inference
    precision is bf16) unless ``props`` say otherwise."""
    compiled = ov.Core().compile_model(str(path), "CPU", props)
    return np.asarray(compiled.create_infer_request().infer(feed)[compiled.output(output)])


F32 = 'parameters { key: "INFERENCE_PRECISION_HINT" value { string_value: "f32" } }\n'


def features(n: int, seed: int) -> np.ndarray:
    return np.random.RandomState(seed).randn(n, 4).astype(np.float32)


async def test_ir_auto_completes_and_matches_openvino(bk, make_models, tmp_path: Path) -> None:
    config = 'backend: "openvino"\ninstance_group [ { kind: KIND_CPU count: 2 } ]\n'
    model_dir = ir_model(bk, make_models, tmp_path, "ov_linear", config)
    spec = scan_model(model_dir, autocompletions()).models["ov_linear"]
    assert spec.max_batch_size == 4 and spec.batching is not None
    assert [(t.name, t.datatype, t.dims) for t in spec.inputs] == [("features", "FP32", (4,))]
    assert [(t.name, t.datatype, t.dims) for t in spec.outputs] == [("scores", "FP32", (3,))]
    x = features(4, 1)
    expected = direct(model_dir / "1" / "model.xml", {"features": x}, "scores")
    w, b = make_models.openvino_weights()
    exact = direct(model_dir / "1" / "model.xml", {"features": x}, "scores", INFERENCE_PRECISION_HINT="f32")
    np.testing.assert_allclose(exact, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)
    async with bk.engine_for(tmp_path) as engine:
        node = bk.backend_node(engine, "ov_linear")
        compiled = [i.compiled for i in node.pool.instances]
        assert len(compiled) == 2 and compiled[0] is not compiled[1]  # one compiled model each
        batched = await engine.infer("ov_linear", {"features": x})
        single = await engine.infer("ov_linear", {"features": x[:1]})
        merged = await asyncio.gather(
            *(engine.infer("ov_linear", {"features": x[i : i + 1]}) for i in range(4))
        )
    np.testing.assert_allclose(batched["scores"], expected, rtol=1e-6)
    np.testing.assert_allclose(single["scores"], expected[:1], rtol=1e-6)
    np.testing.assert_allclose(np.concatenate([m["scores"] for m in merged]), expected, rtol=1e-6)


async def test_compile_properties_from_parameters(bk, make_models, tmp_path: Path) -> None:
    config = (
        'backend: "openvino"\n'
        'parameters { key: "PERFORMANCE_HINT" value { string_value: "throughput" } }\n'
        'parameters { key: "NUM_STREAMS" value { string_value: "2" } }\n'
        'parameters { key: "INFERENCE_NUM_THREADS" value { string_value: "2" } }\n'
        'parameters { key: "INFERENCE_PRECISION_HINT" value { string_value: "f32" } }\n'
        'parameters { key: "unrelated_key" value { string_value: "ignored" } }\n'
    )
    ir_model(bk, make_models, tmp_path, "tuned", config)
    async with bk.engine_for(tmp_path) as engine:
        instance = bk.instance_of(engine, "tuned")
        compiled = instance.compiled
        assert instance.device == "CPU"
        assert str(compiled.get_property("PERFORMANCE_HINT")) == "THROUGHPUT"
        assert int(compiled.get_property("NUM_STREAMS")) == 2
        assert int(compiled.get_property("INFERENCE_NUM_THREADS")) == 2
        assert "32" in str(compiled.get_property("INFERENCE_PRECISION_HINT"))


async def test_triton_legacy_parameter_names(bk, make_models, tmp_path: Path) -> None:
    config = 'backend: "openvino"\nparameters { key: "CPU_THROUGHPUT_STREAMS" value { string_value: "1" } }\n'
    ir_model(bk, make_models, tmp_path, "legacy", config)
    async with bk.engine_for(tmp_path) as engine:
        assert int(bk.instance_of(engine, "legacy").compiled.get_property("NUM_STREAMS")) == 1


async def test_bf16_precision_on_cpus_that_have_it(bk, make_models, tmp_path: Path) -> None:
    config = (
        'backend: "openvino"\nparameters { key: "INFERENCE_PRECISION_HINT" value { string_value: "BF16" } }\n'
    )
    model_dir = ir_model(bk, make_models, tmp_path, "bf16", config)
    x = features(3, 2)
    has_bf16 = "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    async with bk.engine_for(tmp_path) as engine:
        if not has_bf16:
            state, reason = bk.status(engine, "bf16")
            assert state is State.UNAVAILABLE and "bf16" in reason
            return
        precision = str(bk.instance_of(engine, "bf16").compiled.get_property("INFERENCE_PRECISION_HINT"))
        out = await engine.infer("bf16", {"features": x})
    assert "bf16" in precision or "bfloat16" in precision
    expected = direct(model_dir / "1" / "model.xml", {"features": x}, "scores")
    np.testing.assert_allclose(out["scores"], expected, rtol=5e-2, atol=5e-2)


async def test_onnx_through_openvino(bk, make_models, tmp_path: Path) -> None:
    named = 'backend: "openvino"\ndefault_model_filename: "model.onnx"\n'
    found = 'backend: "openvino"\n'  # no model.xml: model.onnx is used
    for name, config in (("ov_onnx", named), ("ov_onnx_found", found)):
        model_dir = bk.write_model(tmp_path, name, config)
        make_models.make_onnx_add_sub(model_dir / "1" / "model.onnx")
    a = np.random.RandomState(3).rand(2, 16).astype(np.float32)
    b = np.random.RandomState(4).rand(2, 16).astype(np.float32)
    compiled = ov.Core().compile_model(str(tmp_path / "ov_onnx" / "1" / "model.onnx"), "CPU")
    expected = compiled.create_infer_request().infer({"INPUT0": a, "INPUT1": b})
    async with bk.engine_for(tmp_path) as engine:
        for name in ("ov_onnx", "ov_onnx_found"):
            assert engine.registry.get(name).spec.max_batch_size == 4
            out = await engine.infer(name, {"INPUT0": a, "INPUT1": b})
            np.testing.assert_allclose(out["OUTPUT0"], expected[compiled.output("OUTPUT0")], rtol=1e-6)
            np.testing.assert_allclose(out["OUTPUT1"], a - b, rtol=1e-6)


async def test_static_batch_is_made_dynamic(bk, make_models, tmp_path: Path) -> None:
    """An IR exported with batch 1, served with max_batch_size 4 (Triton's OpenVINO backend
    reshapes the batch dimension the same way)."""
    config = (
        'backend: "openvino"\nmax_batch_size: 4\n'
        + F32
        + 'input [ { name: "features" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "scores" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
    )
    ir_model(bk, make_models, tmp_path, "static1", config, batch=1)
    auto = ir_model(bk, make_models, tmp_path, "static_auto", None, batch=1)
    (auto / "config.pbtxt").write_text('backend: "openvino"\nmax_batch_size: 2\n' + F32)
    x = features(3, 5)
    w, b = make_models.openvino_weights()
    async with bk.engine_for(tmp_path) as engine:
        out = await engine.infer("static1", {"features": x})
        spec = engine.registry.get("static_auto").spec
        assert [t.dims for t in spec.inputs] == [(4,)] and spec.max_batch_size == 2
        two = await engine.infer("static_auto", {"features": x[:2]})
    np.testing.assert_allclose(out["scores"], np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two["scores"], np.maximum(x[:2] @ w + b, 0), rtol=1e-5, atol=1e-6)


async def test_devices_from_parameters(bk, make_models, tmp_path: Path) -> None:
    device = 'backend: "openvino"\nparameters { key: "TARGET_DEVICE" value { string_value: "%s" } }\n'
    ir_model(bk, make_models, tmp_path, "on_auto", device % "AUTO")
    ir_model(bk, make_models, tmp_path, "on_npu", device % "NPU")
    available = ov.Core().available_devices
    x = features(2, 6)
    async with bk.engine_for(tmp_path) as engine:
        assert bk.instance_of(engine, "on_auto").device == "AUTO"  # virtual devices pass through
        assert (await engine.infer("on_auto", {"features": x}))["scores"].shape == (2, 3)
        state, reason = bk.status(engine, "on_npu")
        if "NPU" not in available:
            assert state is State.UNAVAILABLE
            assert "'NPU' is not available" in reason and "CPU" in reason


async def test_config_names_not_in_model_are_a_clear_error(bk, make_models, tmp_path: Path) -> None:
    config = (
        'backend: "openvino"\nmax_batch_size: 4\n'
        'input [ { name: "WRONG" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "scores" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
    )
    ir_model(bk, make_models, tmp_path, "misnamed", config)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "misnamed")
    assert state is State.UNAVAILABLE and "'WRONG'" in reason and "features" in reason


async def test_missing_openvino_fails_only_that_model(bk, make_models, tmp_path, monkeypatch) -> None:
    config = (
        'backend: "openvino"\nmax_batch_size: 4\n'
        'input [ { name: "features" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "scores" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
    )
    ir_model(bk, make_models, tmp_path, "needs_ov", config)
    auto = ir_model(bk, make_models, tmp_path, "needs_ov_auto", 'backend: "openvino"\n')
    bk.copy_bundled(tmp_path, "simple")
    monkeypatch.setitem(sys.modules, "openvino", None)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "needs_ov")
        assert state is State.UNAVAILABLE
        assert "model 'needs_ov'" in reason and "pip install 'flowserve[openvino]'" in reason
        state, reason = bk.status(engine, "needs_ov_auto")
        assert state is State.UNAVAILABLE and "'openvino' package" in reason
        assert engine.registry.has("simple")
    assert auto.exists()
