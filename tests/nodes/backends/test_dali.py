"""DALI backend: the bundled CPU pipeline gives what DALI gives, batched and unbatched; the
image_classifier ensemble chains DALI -> ONNX Runtime -> python; clear load errors."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from flowserve.runtime.registry import State

dali = pytest.importorskip("nvidia.dali")

PIPELINE = "dali_preprocess/1/model.dali"


def images(n: int = 3) -> np.ndarray:
    return np.random.RandomState(5).randint(0, 256, (n, 10, 12, 3)).astype(np.uint8)


def run_direct(path: Path, batch: np.ndarray) -> np.ndarray:
    pipe = dali.Pipeline.deserialize(
        serialized_pipeline=path.read_bytes(), batch_size=8, num_threads=1, device_id=None
    )
    pipe.build()
    pipe.feed_input("IMAGE", batch)
    (out,) = pipe.run()
    return np.asarray(out.as_array())


async def test_pipeline_matches_dali(bk) -> None:
    x = images()
    want = run_direct(bk.BUNDLED / PIPELINE, x)
    async with bk.engine_for(bk.BUNDLED) as engine:
        out = await engine.infer("dali_preprocess", {"IMAGE": x})
        one = await engine.infer("dali_preprocess", {"IMAGE": x[:1]})
    assert out["PREPROCESSED"].shape == (3, 3, 8, 8) and out["PREPROCESSED"].dtype == np.float32
    np.testing.assert_allclose(out["PREPROCESSED"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(one["PREPROCESSED"], want[:1], rtol=1e-6, atol=1e-6)


async def test_unbatched_model(bk, tmp_path: Path) -> None:
    config = """
backend: "dali"
max_batch_size: 0
input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1, -1, 3 ] } ]
output [ { name: "PREPROCESSED" data_type: TYPE_FP32 dims: [ 3, 8, 8 ] } ]
"""
    bk.write_model(tmp_path, "dali_single", config, {"1/model.dali": (bk.BUNDLED / PIPELINE).read_bytes()})
    x = images(1)
    want = run_direct(bk.BUNDLED / PIPELINE, x)[0]
    async with bk.engine_for(tmp_path) as engine:
        out = await engine.infer("dali_single", {"IMAGE": x[0]})
    np.testing.assert_allclose(out["PREPROCESSED"], want, rtol=1e-6, atol=1e-6)


async def test_chain_dali_onnx_python(bk) -> None:
    ort = pytest.importorskip("onnxruntime")
    x = images(2)
    pre = run_direct(bk.BUNDLED / PIPELINE, x)
    session = ort.InferenceSession(
        str(bk.BUNDLED / "onnx_classifier/1/model.onnx"), providers=["CPUExecutionProvider"]
    )
    probs = session.run(None, {"input": pre})[0]
    async with bk.engine_for(bk.BUNDLED) as engine:
        out = await engine.infer("image_classifier", {"IMAGE": x})
    np.testing.assert_array_equal(out["label"][:, 0], np.argmax(probs, axis=1))
    np.testing.assert_allclose(out["score"][:, 0], probs.max(axis=1), rtol=1e-6)


async def test_garbage_pipeline_fails_alone(bk, tmp_path: Path) -> None:
    bk.copy_bundled(tmp_path, "dali_preprocess")
    config = (bk.BUNDLED / "dali_preprocess" / "config.pbtxt").read_text().replace("dali_preprocess", "bad")
    bk.write_model(tmp_path, "bad", config, {"1/model.dali": b"\x00\x01 not a pipeline"})
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "bad")
        assert state is State.UNAVAILABLE and "model 'bad'" in reason and "DALI cannot build" in reason
        out = await engine.infer("dali_preprocess", {"IMAGE": images(1)})
    assert out["PREPROCESSED"].shape == (1, 3, 8, 8)


async def test_gpu_pipeline_without_gpu_is_a_clear_error(bk, make_models, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLOWSERVE_NO_GPU", "1")
    config = """
backend: "dali"
max_batch_size: 2
input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ -1, -1, 3 ] } ]
output [ { name: "OUT" data_type: TYPE_UINT8 dims: [ 4, 4, 3 ] } ]
"""
    model_dir = bk.write_model(tmp_path, "dali_gpu", config)
    make_models.make_dali_gpu_resize(model_dir / "1" / "model.dali")
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "dali_gpu")
    assert state is State.UNAVAILABLE
    assert "model 'dali_gpu'" in reason and "no GPU here" in reason


async def test_missing_dali_fails_only_that_model(bk, tmp_path: Path, monkeypatch) -> None:
    bk.copy_bundled(tmp_path, "dali_preprocess", "simple")
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "dali_preprocess")
        assert state is State.UNAVAILABLE
        assert (
            "model 'dali_preprocess'" in reason and "'nvidia.dali'" in reason and "flowserve[dali]" in reason
        )
        assert engine.registry.has("simple")
