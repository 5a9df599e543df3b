"""TensorFlow backend: SavedModel (signature chosen by TF_SIGNATURE_DEF, auto-complete from it)
and frozen GraphDef; outputs equal to TensorFlow called directly, batched and unbatched; clear
load errors."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from flowserve.nodes.backends import autocompletions
from flowserve.runtime.registry import State
from flowserve.spec.repository import scan_model

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
tf = pytest.importorskip("tensorflow")

SAVEDMODEL = "model.savedmodel"
GRAPHDEF = "model.graphdef"


@pytest.fixture(scope="module")
def tf_files(tmp_path_factory: pytest.TempPathFactory, make_models: ModuleType) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tf_models")
    make_models.make_tf_savedmodel(root / SAVEDMODEL)
    make_models.make_tf_graphdef(root / GRAPHDEF)
    return {"savedmodel": root / SAVEDMODEL, "graphdef": root / GRAPHDEF}


def add_model(repo: Path, name: str, config: str | None, source: Path, bk: Any) -> Path:
    model_dir = bk.write_model(repo, name, config)
    target = model_dir / "1" / source.name
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy(source, target)
    return model_dir


def signature(path: Path, name: str = "serving_default") -> Any:
    return tf.saved_model.load(str(path)).signatures[name]


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.RandomState(seed).randn(n, 4).astype(np.float32)


async def test_savedmodel_auto_completes_and_matches_tensorflow(bk, tf_files, tmp_path: Path) -> None:
    model_dir = add_model(tmp_path, "tf_add", None, tf_files["savedmodel"], bk)
    spec = scan_model(model_dir, autocompletions()).models["tf_add"]
    assert spec.backend == "tensorflow" and spec.max_batch_size == 4 and spec.batching is not None
    assert [(t.name, t.datatype, t.dims) for t in spec.inputs] == [("x", "FP32", (4,)), ("y", "FP32", (4,))]
    assert [t.name for t in spec.outputs] == ["diff", "sum"]  # the signature's output keys
    x, y = rows(3, 1), rows(3, 2)
    expected = {k: v.numpy() for k, v in signature(tf_files["savedmodel"])(x=x, y=y).items()}
    async with bk.engine_for(tmp_path) as engine:
        batched = await engine.infer("tf_add", {"x": x, "y": y})
        single = await engine.infer("tf_add", {"x": x[:1], "y": y[:1]})
        merged = await asyncio.gather(
            *(engine.infer("tf_add", {"x": x[i : i + 1], "y": y[i : i + 1]}) for i in range(3))
        )
    for name in ("sum", "diff"):
        np.testing.assert_allclose(batched[name], expected[name], rtol=1e-6)
        np.testing.assert_allclose(single[name], expected[name][:1], rtol=1e-6)
        np.testing.assert_allclose(np.concatenate([m[name] for m in merged]), expected[name], rtol=1e-6)
    assert batched["sum"].dtype == np.float32


async def test_signature_chosen_by_parameter(bk, tf_files, tmp_path: Path) -> None:
    strings = 'platform: "tensorflow_savedmodel"\nparameters { key: "TF_SIGNATURE_DEF" value { string_value: "strings" } }\n'
    double = (
        'platform: "tensorflow_savedmodel"\nmax_batch_size: 8\n'
        'parameters { key: "TF_SIGNATURE_DEF" value { string_value: "double" } }\n'
    )
    add_model(tmp_path, "tf_strings", strings, tf_files["savedmodel"], bk)
    add_model(tmp_path, "tf_double", double, tf_files["savedmodel"], bk)
    words = np.array([b"ab", "wörld".encode(), b""], dtype=object)
    expected = {k: v.numpy() for k, v in signature(tf_files["savedmodel"], "strings")(text=words).items()}
    x = rows(2, 3)
    async with bk.engine_for(tmp_path) as engine:
        spec = engine.registry.get("tf_strings").spec
        assert [(t.name, t.datatype) for t in spec.inputs] == [("text", "BYTES")]
        assert {(t.name, t.datatype) for t in spec.outputs} == {("length", "INT32"), ("upper", "BYTES")}
        out = await engine.infer("tf_strings", {"text": words})
        doubled = await engine.infer("tf_double", {"x": x})
    assert list(out["upper"]) == list(expected["upper"])
    np.testing.assert_array_equal(out["length"], expected["length"])
    np.testing.assert_allclose(doubled["doubled"], x * 2)
    assert engine.registry.index()  # both loaded from the same SavedModel, different signatures


async def test_unknown_signature_names_the_ones_there(bk, tf_files, tmp_path: Path) -> None:
    param = 'parameters { key: "TF_SIGNATURE_DEF" value { string_value: "nope" } }\n'
    add_model(tmp_path, "auto", 'platform: "tensorflow_savedmodel"\n' + param, tf_files["savedmodel"], bk)
    listed = (
        'platform: "tensorflow_savedmodel"\n'
        + param
        + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
        'output [ { name: "doubled" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
    )
    add_model(tmp_path, "listed", listed, tf_files["savedmodel"], bk)
    async with bk.engine_for(tmp_path) as engine:
        for name in ("auto", "listed"):
            state, reason = bk.status(engine, name)
            assert state is State.UNAVAILABLE
            assert f"model '{name}'" in reason and "'nope'" in reason
            assert "serving_default" in reason and "strings" in reason


async def test_config_may_list_a_subset_of_outputs(bk, tf_files, tmp_path: Path) -> None:
    config = (
        'platform: "tensorflow_savedmodel"\nmax_batch_size: 4\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "sum" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    )
    add_model(tmp_path, "only_sum", config, tf_files["savedmodel"], bk)
    x, y = rows(2, 4), rows(2, 5)
    async with bk.engine_for(tmp_path) as engine:
        out = await engine.infer("only_sum", {"x": x, "y": y})
    assert list(out) == ["sum"]
    np.testing.assert_allclose(out["sum"], signature(tf_files["savedmodel"])(x=x, y=y)["sum"].numpy())


async def test_wrong_config_names_are_a_clear_error(bk, tf_files, tmp_path: Path) -> None:
    config = (
        'platform: "tensorflow_savedmodel"\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] }, { name: "Y" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
        'output [ { name: "sum" data_type: TYPE_FP32 dims: [ -1, 4 ] } ]\n'
    )
    add_model(tmp_path, "misnamed", config, tf_files["savedmodel"], bk)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "misnamed")
    assert state is State.UNAVAILABLE
    assert "['Y']" in reason and "serving_default" in reason and "'x', 'y'" in reason


def graphdef_direct(path: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The frozen graph run in a TF1 session (a path independent of the backend's)."""
    graph_def = tf.compat.v1.GraphDef()
    graph_def.ParseFromString(path.read_bytes())
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as session:
        values = session.run(["sum:0", "diff:0"], {f"{k}:0": v for k, v in feed.items()})
    return dict(zip(["sum", "diff"], values, strict=True))


GRAPHDEF_CONFIG = """platform: "tensorflow_graphdef"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000 }
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "y:0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "sum" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "diff" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


async def test_graphdef_matches_tensorflow(bk, tf_files, tmp_path: Path) -> None:
    model_dir = add_model(tmp_path, "tf_graphdef", GRAPHDEF_CONFIG, tf_files["graphdef"], bk)
    assert scan_model(model_dir, autocompletions()).models["tf_graphdef"].default_model_filename == GRAPHDEF
    x, y = rows(5, 6), rows(5, 7)
    expected = graphdef_direct(tf_files["graphdef"], {"x": x, "y": y})
    async with bk.engine_for(tmp_path) as engine:
        batched = await engine.infer("tf_graphdef", {"x": x, "y:0": y})
        single = await engine.infer("tf_graphdef", {"x": x[:1], "y:0": y[:1]})
        merged = await asyncio.gather(
            *(engine.infer("tf_graphdef", {"x": x[i : i + 1], "y:0": y[i : i + 1]}) for i in range(5))
        )
    for name in ("sum", "diff"):
        np.testing.assert_allclose(batched[name], expected[name], rtol=1e-6)
        np.testing.assert_allclose(single[name], expected[name][:1], rtol=1e-6)
        np.testing.assert_allclose(np.concatenate([m[name] for m in merged]), expected[name], rtol=1e-6)


async def test_graphdef_needs_inputs_in_the_config(bk, tf_files, tmp_path: Path) -> None:
    add_model(tmp_path, "bare_graphdef", 'platform: "tensorflow_graphdef"\n', tf_files["graphdef"], bk)
    bad = GRAPHDEF_CONFIG.replace('name: "x"', 'name: "nowhere"')
    add_model(tmp_path, "bad_name", bad, tf_files["graphdef"], bk)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "bare_graphdef")
        assert state is State.UNAVAILABLE and "GraphDef" in reason and "listed in the config" in reason
        state, reason = bk.status(engine, "bad_name")
        assert state is State.UNAVAILABLE and "'nowhere'" in reason


async def test_warmup_runs_through_tensorflow(bk, tf_files, tmp_path: Path) -> None:
    config = (
        'platform: "tensorflow_savedmodel"\ninstance_group [ { kind: KIND_CPU count: 2 } ]\n'
        'model_warmup [ { name: "random" batch_size: 3 count: 2 inputs [\n'
        '  { key: "x" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } },\n'
        '  { key: "y" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } ] } ]\n'
    )
    add_model(tmp_path, "warm_tf", config, tf_files["savedmodel"], bk)
    async with bk.engine_for(tmp_path) as engine:
        assert engine.registry.has("warm_tf")
        assert bk.backend_node(engine, "warm_tf").warmup_runs == 4  # 2 runs x 2 instances


async def test_missing_tensorflow_fails_only_that_model(bk, tf_files, tmp_path, monkeypatch) -> None:
    add_model(tmp_path, "needs_tf", GRAPHDEF_CONFIG, tf_files["graphdef"], bk)
    bk.copy_bundled(tmp_path, "simple")
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "needs_tf")
        assert state is State.UNAVAILABLE
        assert "model 'needs_tf'" in reason and "'tensorflow'" in reason
        assert "pip install 'flowserve[tensorflow]'" in reason
        assert engine.registry.has("simple")


async def test_kind_gpu_without_gpu_is_a_clear_error(bk, tf_files, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("FLOWSERVE_NO_GPU", "1")
    config = GRAPHDEF_CONFIG + "instance_group [ { kind: KIND_GPU } ]\n"
    add_model(tmp_path, "gpu_tf", config, tf_files["graphdef"], bk)
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "gpu_tf")
    assert state is State.UNAVAILABLE and "KIND_GPU" in reason and "no GPU" in reason
