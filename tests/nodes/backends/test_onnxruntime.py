"""ONNX Runtime backend: same outputs as onnxruntime called directly, config auto-complete,
session options, clear load errors, and one bad model not disturbing another."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from flowserve.core.errors import Unsupported
from flowserve.nodes.backends import BACKENDS, autocompletions
from flowserve.nodes.backends._support import has_gpu
from flowserve.runtime.registry import State
from flowserve.spec.repository import scan_model

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

CLASSIFIER = "model_repository/onnx_classifier/1/model.onnx"


def direct(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return list(session.run(None, feed))


async def test_bundled_classifier_matches_onnxruntime(bk) -> None:
    x = np.random.RandomState(1).rand(3, 3, 8, 8).astype(np.float32)
    expected = direct(bk.ROOT / CLASSIFIER, {"input": x})[0]
    async with bk.engine_for(bk.BUNDLED) as engine:
        batched = await engine.infer("onnx_classifier", {"input": x})
        single = await engine.infer("onnx_classifier", {"input": x[:1]})
    np.testing.assert_allclose(batched["probs"], expected, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(single["probs"], expected[:1], rtol=1e-6, atol=1e-7)
    assert batched["probs"].dtype == np.float32


async def test_execute_batch_merges_rows(bk, tmp_path: Path) -> None:
    bk.copy_bundled(tmp_path, "onnx_classifier")
    x = np.random.RandomState(2).rand(5, 3, 8, 8).astype(np.float32)
    expected = direct(tmp_path / "onnx_classifier/1/model.onnx", {"input": x})[0]
    async with bk.engine_for(tmp_path) as engine:
        node = bk.backend_node(engine, "onnx_classifier")
        instance = node.pool.instances[0]
        parts = node.execute_batch(instance, [{"input": x[:2]}, {"input": x[2:]}])
    assert [p["probs"].shape for p in parts] == [(2, 4), (3, 4)]
    np.testing.assert_allclose(np.concatenate([p["probs"] for p in parts]), expected, rtol=1e-6)


async def test_no_config_at_all_is_auto_completed(bk) -> None:
    """model_repository/onnx_add_sub has only 1/model.onnx: names, dtypes, dims and batching
    come from the model, by Triton's rules (leading dynamic dim -> max_batch_size 4)."""
    scan = scan_model(bk.BUNDLED / "onnx_add_sub", autocompletions())
    spec = scan.models["onnx_add_sub"]
    assert spec.backend == "onnxruntime" and spec.platform == "onnxruntime_onnx"
    assert spec.max_batch_size == 4
    assert spec.batching is not None
    assert [(t.name, t.datatype, t.dims) for t in spec.inputs] == [
        ("INPUT0", "FP32", (16,)),
        ("INPUT1", "FP32", (16,)),
    ]
    assert [t.name for t in spec.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert [t.name for t in spec.config.input] == ["INPUT0", "INPUT1"]  # the served config says so too
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    async with bk.engine_for(bk.BUNDLED) as engine:
        out = await engine.infer("onnx_add_sub", {"INPUT0": a, "INPUT1": a * 3})
    np.testing.assert_array_equal(out["OUTPUT0"], a * 4)
    np.testing.assert_array_equal(out["OUTPUT1"], -2 * a)


def test_auto_complete_fixed_first_dim_does_not_batch(bk, make_models, tmp_path: Path) -> None:
    model_dir = bk.write_model(tmp_path, "fixed", None)
    make_models.make_onnx_add_sub(model_dir / "1" / "model.onnx", dims=(2, 16))
    spec = scan_model(model_dir, autocompletions()).models["fixed"]
    assert spec.max_batch_size == 0 and spec.batching is None
    assert spec.inputs[0].dims == (2, 16)


def test_auto_complete_respects_configured_max_batch_size(bk, make_models, tmp_path: Path) -> None:
    config = 'platform: "onnxruntime_onnx"\nmax_batch_size: 16\n'
    model_dir = bk.write_model(tmp_path, "mb16", config)
    make_models.make_onnx_add_sub(model_dir / "1" / "model.onnx")
    spec = scan_model(model_dir, autocompletions()).models["mb16"]
    assert spec.max_batch_size == 16
    assert spec.inputs[0].dims == (16,)
    assert spec.batching is None  # the config chose no dynamic batcher


def test_auto_complete_completes_only_what_is_missing(bk, make_models, tmp_path: Path) -> None:
    config = (
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
        ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
    )
    model_dir = bk.write_model(tmp_path, "partial", config)
    make_models.make_onnx_add_sub(model_dir / "1" / "model.onnx")
    spec = scan_model(model_dir, autocompletions()).models["partial"]
    assert [t.name for t in spec.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert spec.outputs[0].dims == (16,)


def test_auto_complete_batching_mismatch_is_a_clear_error(bk, make_models, tmp_path: Path) -> None:
    model_dir = bk.write_model(tmp_path, "nobatch", 'platform: "onnxruntime_onnx"\nmax_batch_size: 4\n')
    make_models.make_onnx_add_sub(model_dir / "1" / "model.onnx", dims=(2, 16))
    scan = scan_model(model_dir, autocompletions())
    assert "nobatch" in scan.failed
    text = "; ".join(str(i) for i in scan.issues)
    assert "model 'nobatch'" in text and "first dimension" in text and "INPUT0" in text


def test_auto_complete_without_onnx_package_names_it(bk, make_models, tmp_path, monkeypatch) -> None:
    model_dir = bk.write_model(tmp_path, "needs_onnx", None)
    make_models.make_onnx_add_sub(model_dir / "1" / "model.onnx")
    monkeypatch.setitem(sys.modules, "onnx", None)
    scan = scan_model(model_dir, autocompletions())
    text = "; ".join(str(i) for i in scan.issues)
    assert "model 'needs_onnx'" in text and "'onnx' package" in text and "flowserve[onnx]" in text


async def test_string_tensors_round_trip(bk, tmp_path: Path) -> None:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("TEXT", TensorProto.STRING, [-1])
    y = helper.make_tensor_value_info("SAME", TensorProto.STRING, [-1])
    graph = helper.make_graph([helper.make_node("Identity", ["TEXT"], ["SAME"])], "strings", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    model_dir = bk.write_model(tmp_path, "strings", None, {"1/model.onnx": model.SerializeToString()})
    assert scan_model(model_dir, autocompletions()).models["strings"].inputs[0].datatype == "BYTES"
    words = np.array([b"hello", "wörld".encode()], dtype=object)
    async with bk.engine_for(tmp_path) as engine:
        out = await engine.infer("strings", {"TEXT": words})
    assert list(out["SAME"]) == list(words)


async def test_session_options_from_parameters(bk, tmp_path: Path) -> None:
    bk.copy_bundled(tmp_path, "onnx_classifier")
    config = (tmp_path / "onnx_classifier" / "config.pbtxt").read_text()
    config += (
        'parameters { key: "inter_op_thread_count" value: { string_value: "2" } }\n'
        'parameters { key: "execution_mode" value: { string_value: "1" } }\n'
        "optimization { graph { level: -1 } }\n"
    )
    (tmp_path / "onnx_classifier" / "config.pbtxt").write_text(config)
    async with bk.engine_for(tmp_path) as engine:
        instance = bk.instance_of(engine, "onnx_classifier")
        opts = instance.session.get_session_options()
        assert opts.intra_op_num_threads == 1
        assert opts.inter_op_num_threads == 2
        assert opts.execution_mode == ort.ExecutionMode.ORT_PARALLEL
        assert opts.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        assert instance.session.get_providers() == ["CPUExecutionProvider"] or has_gpu()


async def test_spinning_can_be_turned_off(bk, tmp_path: Path) -> None:
    bk.copy_bundled(tmp_path, "onnx_classifier")
    config = (tmp_path / "onnx_classifier" / "config.pbtxt").read_text()
    config += 'parameters { key: "session.intra_op.allow_spinning" value: { string_value: "0" } }\n'
    (tmp_path / "onnx_classifier" / "config.pbtxt").write_text(config)
    async with bk.engine_for(tmp_path) as engine:
        opts = bk.instance_of(engine, "onnx_classifier").session.get_session_options()
        assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"


async def test_bad_model_file_fails_alone(bk, tmp_path: Path) -> None:
    bk.copy_bundled(tmp_path, "onnx_classifier", "simple")
    config = 'platform: "onnxruntime_onnx"\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    config += 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    bk.write_model(tmp_path, "garbage", config, {"1/model.onnx": b"not an onnx file"})
    x = np.zeros((1, 3, 8, 8), np.float32)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "garbage")
        assert state is State.UNAVAILABLE
        assert "model 'garbage'" in reason and "onnxruntime cannot load" in reason
        assert (await engine.infer("onnx_classifier", {"input": x}))["probs"].shape == (1, 4)


async def test_config_names_not_in_model_are_a_clear_error(bk, make_models, tmp_path: Path) -> None:
    config = 'platform: "onnxruntime_onnx"\ninput [ { name: "WRONG" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    config += 'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    model_dir = bk.write_model(tmp_path, "misnamed", config)
    make_models.make_onnx_add_sub(model_dir / "1" / "model.onnx", dims=(-1,))
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "misnamed")
    assert state is State.UNAVAILABLE
    assert "'WRONG'" in reason and "INPUT0" in reason


async def test_missing_onnxruntime_fails_only_that_model(bk, tmp_path, monkeypatch) -> None:
    bk.copy_bundled(tmp_path, "onnx_classifier", "simple")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    a = np.ones((1, 16), np.int32)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "onnx_classifier")
        assert state is State.UNAVAILABLE
        assert "model 'onnx_classifier'" in reason and "'onnxruntime'" in reason
        assert "pip install 'flowserve[onnx]'" in reason
        out = await engine.infer("simple", {"INPUT0": a, "INPUT1": a})
        np.testing.assert_array_equal(out["OUTPUT0"], a * 2)


async def test_backend_module_that_fails_to_import(bk, tmp_path, monkeypatch) -> None:
    bk.copy_bundled(tmp_path, "onnx_classifier", "simple")
    monkeypatch.setitem(BACKENDS, "onnxruntime", "flowserve_no_such_module:Nothing")
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "onnx_classifier")
        assert state is State.UNAVAILABLE
        assert "model 'onnx_classifier'" in reason and "backend 'onnxruntime' cannot be used here" in reason
        assert engine.registry.has("simple")


async def test_kind_gpu_without_gpu_is_a_clear_error(bk, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLOWSERVE_NO_GPU", "1")
    bk.copy_bundled(tmp_path, "onnx_classifier")
    path = tmp_path / "onnx_classifier" / "config.pbtxt"
    path.write_text(path.read_text().replace("KIND_AUTO", "KIND_GPU"))
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "onnx_classifier")
    assert state is State.UNAVAILABLE
    assert "model 'onnx_classifier'" in reason and "KIND_GPU" in reason and "no GPU" in reason


def test_providers_for_cpu_never_asks_for_cuda() -> None:
    from flowserve.nodes.backends._support import Placement
    from flowserve.nodes.backends.onnxruntime import providers_for

    class Model:
        name = "m"
        config = None

    assert providers_for(ort, Model(), Placement("CPU")) == ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert providers_for(ort, Model(), Placement("GPU", 0)) == ["CPUExecutionProvider"]
        with pytest.raises(Unsupported, match="onnxruntime-gpu"):
            providers_for(ort, Model(), Placement("GPU", 0, required=True))


def test_both_gpu_providers_run_on_the_instances_stream() -> None:
    from types import SimpleNamespace

    from flowserve.nodes.backends._support import Placement
    from flowserve.nodes.backends.onnxruntime import providers_for
    from flowserve.spec.triton import parse_config_text

    config = parse_config_text(
        'name: "m" optimization { execution_accelerators { gpu_execution_accelerator [ { name: "tensorrt" } ] } }'
    )
    gpu_ort = SimpleNamespace(
        get_available_providers=lambda: [
            "TensorrtExecutionProvider",
            "CUDAExecutionProvider",
            "CPUExecutionProvider",
        ]
    )
    on_stream = {"device_id": 1, "has_user_compute_stream": "1", "user_compute_stream": "4096"}
    assert providers_for(gpu_ort, SimpleNamespace(name="m", config=config), Placement("GPU", 1), 4096) == [
        ("TensorrtExecutionProvider", on_stream),
        ("CUDAExecutionProvider", on_stream),
        "CPUExecutionProvider",
    ]


def test_an_onnxruntime_without_dlpack_copies_through_the_host(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A GPU instance binds device tensors through OrtValue.from_dlpack (onnxruntime 1.26+); an
    older onnxruntime-gpu gets no stream of its own, so its outputs are copied back as before."""
    from types import SimpleNamespace

    from flowserve.nodes.backends import cuda
    from flowserve.nodes.backends._support import Placement
    from flowserve.nodes.backends.onnxruntime import OnnxRuntimeBackend

    ops = SimpleNamespace(stream=lambda device: ("stream", device.index))
    monkeypatch.setattr(cuda, "cuda_ops", lambda: ops)

    class Old:  # an OrtValue of onnxruntime 1.25
        pass

    class New(Old):
        def from_dlpack(self) -> None: ...

        def __dlpack__(self) -> None: ...

    for value, expected in ((Old, (None, None)), (New, (ops, ("stream", 1)))):
        node = SimpleNamespace(
            model=SimpleNamespace(name="m"), _ort=lambda v=value: SimpleNamespace(OrtValue=v)
        )
        assert OnnxRuntimeBackend._stream(node, Placement("GPU", 1)) == expected  # type: ignore[arg-type]
    assert "model 'm': onnxruntime ? has no OrtValue.from_dlpack" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(
    not has_gpu() or "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="needs an NVIDIA GPU and onnxruntime-gpu",
)
async def test_gpu_io_binding_matches_cpu(bk, tmp_path: Path) -> None:
    bk.copy_bundled(tmp_path, "onnx_classifier")
    path = tmp_path / "onnx_classifier" / "config.pbtxt"
    path.write_text(path.read_text().replace("KIND_AUTO", "KIND_GPU"))
    x = np.random.RandomState(3).rand(4, 3, 8, 8).astype(np.float32)
    expected = direct(tmp_path / "onnx_classifier/1/model.onnx", {"input": x})[0]
    async with bk.engine_for(tmp_path) as engine:
        instance = bk.instance_of(engine, "onnx_classifier")
        assert instance.io_binding and "CUDAExecutionProvider" in instance.session.get_providers()
        out = await engine.infer("onnx_classifier", {"input": x})
    np.testing.assert_allclose(out["probs"], expected, rtol=1e-4, atol=1e-5)
