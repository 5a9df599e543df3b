"""The backend extension API: the example plugin (examples/flowserve-example-backend) installed
into this environment, found through its entry point, served through the engine and over HTTP
and gRPC; the three lifecycle levels; attributes (batching, parallel loading, preferred
instances); broken plugins failing only their own models, with the plugin named."""

from __future__ import annotations

import asyncio
import importlib
import site
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from flowserve.core.errors import ErrorCode, FlowserveError, InvalidArgument
from flowserve.dataplane.engine import Engine
from flowserve.nodes.backends import AUTOCOMPLETE, BACKENDS, api, plugins, refresh_plugins
from flowserve.repository.settings import RepositorySettings
from flowserve.runtime.registry import State

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "flowserve-example-backend"
DIST = "flowserve-example-backend"


def pip_install_example() -> None:
    """``pip install -e`` the example unless it is installed: without build isolation first (no
    index needed, a few seconds), else with it (older setuptools without ``wheel``)."""
    try:
        metadata.distribution(DIST)
        return
    except metadata.PackageNotFoundError:
        pass
    base = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
    first = subprocess.run(
        [*base, "--no-build-isolation", "-e", str(EXAMPLE)], capture_output=True, text=True
    )
    if first.returncode != 0:
        second = subprocess.run([*base, "-e", str(EXAMPLE)], capture_output=True, text=True)
        assert second.returncode == 0, f"cannot install {EXAMPLE}:\n{first.stderr}\n{second.stderr}"


def install_example() -> ModuleType:
    """The example installed into this environment and importable in this running process."""
    pip_install_example()
    site.addsitedir(sysconfig.get_paths()["purelib"])  # runs the editable install's .pth hook
    importlib.invalidate_caches()
    refresh_plugins()
    return importlib.import_module("flowserve_example_backend")


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return install_example()


@pytest.fixture
def stats(example: ModuleType) -> dict[str, Any]:
    example.reset_stats()
    return example.STATS  # type: ignore[no-any-return]


@pytest.fixture
def restore_backends() -> Iterator[None]:
    saved, hooks = dict(BACKENDS), dict(AUTOCOMPLETE)
    try:
        yield
    finally:
        BACKENDS.clear()
        BACKENDS.update(saved)
        AUTOCOMPLETE.clear()
        AUTOCOMPLETE.update(hooks)


AFFINE = """backend: "example_affine"
dynamic_batching { max_queue_delay_microseconds: 20000 }
parameters { key: "scale" value { string_value: "2.0" } }
parameters { key: "offset" value { string_value: "0.5" } }
"""
FIXED = """backend: "example_affine"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "offset" value { string_value: "-1" } }
"""


def test_entry_point_found_and_code_imported_lazily(example: ModuleType) -> None:
    assert BACKENDS["example_affine"] == "plugin:flowserve_example_backend:AffineBackend"
    assert plugins.SOURCES["example_affine"].distribution == f"{DIST} 0.1.0"
    probe = (
        "import sys, flowserve.nodes.backends as b; "
        "print(b.BACKENDS.get('example_affine'), 'flowserve_example_backend' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["plugin:flowserve_example_backend:AffineBackend", "False"]


async def test_serves_through_the_engine_with_three_levels(bk, stats, tmp_path: Path) -> None:
    bk.write_model(tmp_path, "affine", AFFINE)
    bk.write_model(tmp_path, "affine_fixed", FIXED)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    engine = await Engine.start([tmp_path])
    try:
        spec = engine.registry.get("affine").spec
        # auto-completed by the plugin; two instances by its preferred instance group
        assert spec.max_batch_size == 8 and [t.name for t in spec.inputs] == ["INPUT0"]
        assert len(bk.backend_node(engine, "affine").pool.instances) == 2
        assert stats["backend_initialize"] == 1 and stats["models"] == 2 and stats["instances"] == 3
        batched = await engine.infer("affine", {"INPUT0": x})
        single = await engine.infer("affine", {"INPUT0": x[:1]})
        fixed = await engine.infer("affine_fixed", {"X": x[0]})
        parts = await asyncio.gather(*(engine.infer("affine", {"INPUT0": x[i : i + 1]}) for i in range(4)))
        model_stats = engine.registry.get("affine").stats
    finally:
        await engine.stop()
    np.testing.assert_allclose(batched["OUTPUT0"], x * 2 + 0.5)
    np.testing.assert_allclose(single["OUTPUT0"], x[:1] * 2 + 0.5)
    np.testing.assert_allclose(fixed["Y"], x[0] - 1)
    np.testing.assert_allclose(np.concatenate([p["OUTPUT0"] for p in parts]), x * 2 + 0.5)
    assert max(stats["batches"]) > 1  # dynamic batching handed several requests at once
    assert model_stats.inference_count == 4 + 1 + 4 and model_stats.execution_count < 2 + 4
    # finalized bottom-up at shutdown: instances, models, then the backend once
    assert (stats["instance_finalize"], stats["model_finalize"], stats["backend_finalize"]) == (3, 2, 1)


@pytest.mark.parametrize(("threads", "expect_parallel"), [(4, True), (1, False)])
async def test_parallel_instance_and_model_loading(bk, stats, tmp_path, threads, expect_parallel) -> None:
    slow = AFFINE + 'parameters { key: "load_delay_ms" value { string_value: "150" } }\n'
    bk.write_model(tmp_path, "slow", slow + "instance_group [ { kind: KIND_CPU count: 3 } ]\n")
    bk.write_model(tmp_path, "slow_b", slow + "instance_group [ { kind: KIND_CPU count: 1 } ]\n")
    engine = await Engine.start([tmp_path], settings=RepositorySettings(model_load_threads=threads))
    try:
        assert engine.registry.has("slow") and engine.registry.has("slow_b")
    finally:
        await engine.stop()
    assert stats["instances"] == 4
    assert (stats["max_loading"] > 1) is expect_parallel


async def test_plugin_errors_keep_their_code_and_name_the_backend(bk, stats, tmp_path: Path) -> None:
    bk.write_model(
        tmp_path, "refuses", AFFINE + 'parameters { key: "fail_on" value { string_value: "7" } }\n'
    )
    bk.write_model(tmp_path, "bad_param", AFFINE.replace('"2.0"', '"two"'))
    engine = await Engine.start([tmp_path])
    try:
        with pytest.raises(FlowserveError) as info:
            await engine.infer("refuses", {"INPUT0": np.array([[7.0]], np.float32)})
        assert info.value.code is ErrorCode.INVALID_ARG  # the plugin's error class decides
        assert info.value.message == (
            "in model 'refuses': backend 'example_affine' execute: input INPUT0 contains 7.0, "
            "which this model refuses"
        )
        ok = await engine.infer("refuses", {"INPUT0": np.array([[1.0]], np.float32)})
        np.testing.assert_allclose(ok["OUTPUT0"], [[2.5]])
        state, reason = bk.status(engine, "bad_param")
        assert state is State.UNAVAILABLE
        assert "backend 'example_affine' create_model" in reason and "'scale' must be a number" in reason
    finally:
        await engine.stop()
    assert stats["backend_finalize"] == 1  # the failed model released the backend too


async def test_a_backend_that_does_not_batch(bk, example, tmp_path, restore_backends, monkeypatch) -> None:
    class NoBatch(example.AffineBackend):  # type: ignore[misc,name-defined]
        attributes = api.BackendAttributes(batching=False)

    module = ModuleType("flowserve_test_nobatch")
    module.NoBatch = NoBatch  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flowserve_test_nobatch", module)
    BACKENDS["nobatch"] = "plugin:flowserve_test_nobatch:NoBatch"  # a plugin registered in code
    bk.write_model(
        tmp_path,
        "batching",
        FIXED.replace("example_affine", "nobatch").replace("max_batch_size: 0", "max_batch_size: 4"),
    )
    bk.write_model(tmp_path, "plain", FIXED.replace("example_affine", "nobatch"))
    async with bk.engine_for(tmp_path) as engine:
        state, reason = bk.status(engine, "batching")
        assert state is State.UNAVAILABLE and "backend 'nobatch' does not batch" in reason
        out = await engine.infer("plain", {"X": np.ones(3, np.float32)})
        np.testing.assert_allclose(out["Y"], np.zeros(3))


def fake_distribution(root: Path, name: str, entry_points: str, modules: dict[str, str]) -> Path:
    """An installed-looking distribution (dist-info + modules) in ``root``, for sys.path."""
    info = root / f"{name.replace('-', '_')}-0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(f"[flowserve.backends]\n{entry_points}")
    for module, text in modules.items():
        (root / f"{module}.py").write_text(text)
    return root


OLD_API = """
class OldBackend:
    api_version = (2, 0)
    def create_model(self, info): ...
"""


async def test_broken_plugins_fail_only_their_models(
    bk, example, tmp_path, restore_backends, monkeypatch
) -> None:
    entry_points = (
        "broken = flowserve_no_such_plugin_module:Backend\n"
        "old_api = old_api_plugin:OldBackend\n"
        "onnxruntime = old_api_plugin:OldBackend\n"
    )
    site_dir = fake_distribution(
        tmp_path / "site", "broken-backends", entry_points, {"old_api_plugin": OLD_API}
    )
    monkeypatch.syspath_prepend(str(site_dir))
    assert "broken" in refresh_plugins()
    assert not BACKENDS["onnxruntime"].startswith("plugin:")  # a built-in's name is not taken over
    repo = tmp_path / "repo"
    bk.write_model(repo, "uses_broken", FIXED.replace("example_affine", "broken"))
    bk.write_model(repo, "uses_old", FIXED.replace("example_affine", "old_api"))
    bk.write_model(repo, "affine", AFFINE)
    bk.copy_bundled(repo, "simple")
    async with bk.engine_for(repo) as engine:
        state, reason = bk.status(engine, "uses_broken")
        assert state is State.UNAVAILABLE
        assert "plugin broken-backends 0.3" in reason and "flowserve_no_such_plugin_module" in reason
        state, reason = bk.status(engine, "uses_old")
        assert state is State.UNAVAILABLE
        assert (
            "plugin broken-backends 0.3" in reason
            and "backend API 2.0" in reason
            and "implements 1.0" in reason
        )
        assert engine.registry.has("affine") and engine.registry.has("simple")


def test_api_version_rule() -> None:
    assert api.compatible(api.API_VERSION) == ""
    assert api.compatible((1, 0)) == ""
    assert "implements" in api.compatible((1, api.API_VERSION[1] + 1))
    assert "implements" in api.compatible((0, 9))
    assert "tuple" in api.compatible("1.0")


def test_plugin_auto_complete_result_is_checked() -> None:
    done = plugins.completion_from(
        {"max_batch_size": 2, "input": [{"name": "A", "data_type": "TYPE_INT32", "dims": [2]}]}, "m", "b"
    )
    assert done.max_batch_size == 2 and done.inputs[0].datatype == "INT32" and not done.outputs
    with pytest.raises(InvalidArgument, match="invalid entry"):
        plugins.completion_from({"input": [{"dims": [1]}]}, "m", "b")
    with pytest.raises(InvalidArgument, match="dict or None"):
        plugins.completion_from([1], "m", "b")


def _write_repo(bk: Any, repo: Path) -> None:
    bk.write_model(repo, "affine", AFFINE)
    warm = FIXED + (
        'model_warmup [ { name: "zeros" batch_size: 1 inputs { key: "X" value: '
        "{ data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } } ]\n"
    )
    bk.write_model(repo, "affine_fixed", warm)


@pytest.mark.slow
def test_example_backend_over_http(bk, example, tmp_path, server_factory) -> None:
    import tritonclient.http as httpclient

    _write_repo(bk, tmp_path)
    server = server_factory.start(repositories=(tmp_path,), graphs=(), listeners="http")
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.is_model_ready("affine") and client.is_model_ready("affine_fixed")
        assert client.get_model_config("affine")["backend"] == "example_affine"
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        inp = httpclient.InferInput("INPUT0", [2, 3], "FP32")
        inp.set_data_from_numpy(x, binary_data=True)
        result = client.infer("affine", [inp])
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), x * 2 + 0.5)
        stats = client.get_inference_statistics("affine")["model_stats"][0]
        assert int(stats["inference_count"]) == 2
    finally:
        client.close()


@pytest.mark.slow
def test_example_backend_over_grpc(bk, example, tmp_path, server_factory) -> None:
    pytest.importorskip("flowserve.frontends.grpc")
    import tritonclient.grpc as grpcclient

    _write_repo(bk, tmp_path)
    server = server_factory.start(repositories=(tmp_path,), graphs=(), listeners="grpc")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_model_ready("affine")
        x = np.arange(3, dtype=np.float32)
        inp = grpcclient.InferInput("X", [3], "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("affine_fixed", [inp])
        np.testing.assert_allclose(result.as_numpy("Y"), x - 1)
    finally:
        client.close()
