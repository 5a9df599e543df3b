"""Model control modes: explicit (with dependencies), poll (add / change / remove), none."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import InvalidArgument, Unavailable, Unsupported
from flowserve.dataplane.plane import DataPlane
from flowserve.repository.settings import RepositorySettings

ROOT = Path(__file__).resolve().parents[2]


def copy_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "model_repository", repo)
    return repo


def states(engine: flowserve.Engine) -> dict[str, str]:
    return {s.name: s.state.value for s in engine.registry.index() if s.version in ("1", "")}


async def test_explicit_loads_only_what_is_named_plus_dependencies(tmp_path: Path) -> None:
    engine = await flowserve.Engine.start(
        copy_repo(tmp_path),
        ROOT / "graphs",
        settings=RepositorySettings(control_mode="explicit", load_models=("simple_ensemble",)),
    )
    try:
        assert engine.model_ready("simple_ensemble")
        assert engine.model_ready("simple")  # loaded because the ensemble uses it
        assert not engine.model_ready("fanout") and not engine.model_ready("route")
        assert states(engine)["route"] == "UNAVAILABLE"
        await engine.load_model("route")
        assert engine.model_ready("route")
    finally:
        await engine.stop()


async def test_none_mode_refuses_the_load_api(tmp_path: Path) -> None:
    engine = await flowserve.Engine.start(
        copy_repo(tmp_path), settings=RepositorySettings(control_mode="none")
    )
    plane = DataPlane(engine)
    try:
        assert engine.model_ready("simple")
        with pytest.raises(Unsupported, match="not allowed in model control mode 'none'"):
            await plane.load("simple")
        with pytest.raises(Unsupported, match="explicit model unload is not allowed"):
            await plane.unload("simple")
    finally:
        await engine.stop()


async def test_poll_picks_up_added_changed_and_removed_models(tmp_path: Path) -> None:
    repo = copy_repo(tmp_path)
    engine = await flowserve.Engine.start(
        repo, settings=RepositorySettings(control_mode="poll", poll_secs=3600)
    )
    try:
        assert await engine.poll_once() == ([], [])  # nothing changed
        # add a model: a copy of simple under a new name
        shutil.copytree(repo / "simple", repo / "simple2")
        config = repo / "simple2" / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "simple"', 'name: "simple2"'))
        loaded, unloaded = await engine.poll_once()
        assert loaded == ["simple2"] and unloaded == []
        a = np.ones((1, 16), np.int32)
        out = await engine.infer("simple2", {"INPUT0": a, "INPUT1": a})
        np.testing.assert_array_equal(out["OUTPUT0"], 2 * a)
        # change it: a new version directory appears and becomes the served (latest) version
        shutil.copytree(repo / "simple2" / "1", repo / "simple2" / "2")
        model = repo / "simple2" / "2" / "model.py"
        model.write_text(model.read_text().replace("(in0 + in1)", "(in0 + in1 + 100)"))
        os.utime(repo / "simple2")
        loaded, _ = await engine.poll_once()
        assert loaded == ["simple2"]
        out = await engine.infer("simple2", {"INPUT0": a, "INPUT1": a})
        assert engine.registry.versions("simple2") == [2]
        np.testing.assert_array_equal(out["OUTPUT0"], 2 * a + 100)
        # remove it
        shutil.rmtree(repo / "simple2")
        assert await engine.poll_once() == ([], ["simple2"])
        assert not engine.model_ready("simple2")
        assert engine.model_ready("simple")
    finally:
        await engine.stop()


async def test_graph_turns_unready_when_a_model_it_uses_is_unloaded(tmp_path: Path) -> None:
    engine = await flowserve.Engine.start(copy_repo(tmp_path), ROOT / "graphs")
    try:
        await engine.unload_model("simple")
        assert not engine.model_ready("fanout")
        status = {s.name: s for s in engine.registry.index() if s.version == "1"}
        assert status["fanout"].state.value == "UNAVAILABLE"
        assert status["fanout"].reason == "node 'addsub' uses 'simple', which is not loaded"
        assert status["simple_ensemble"].reason == "node 'simple' uses 'simple', which is not loaded"
        a = np.ones((1, 16), np.int32)
        with pytest.raises(Unavailable, match="model 'fanout' is not ready: node 'addsub' uses 'simple'"):
            await engine.infer("fanout", {"a": a, "b": a})
        assert engine.model_ready("route")  # uses no model
        await engine.load_model("simple")
        assert engine.model_ready("fanout")
        out = await engine.infer("fanout", {"a": a, "b": a})
        np.testing.assert_array_equal(out["total"], 4 * a)
    finally:
        await engine.stop()


async def test_failed_reload_keeps_the_loaded_version_serving(tmp_path: Path) -> None:
    repo = copy_repo(tmp_path)
    engine = await flowserve.Engine.start(repo)
    try:
        model = repo / "simple" / "1" / "model.py"
        model.write_text(
            model.read_text().replace(
                "def initialize(self, args):",
                "def initialize(self, args):\n        raise RuntimeError('bad release')",
            )
        )
        with pytest.raises(InvalidArgument, match=r"bad release.*the loaded version keeps serving"):
            await engine.load_model("simple")
        assert engine.model_ready("simple")
        a = np.ones((1, 16), np.int32)
        out = await engine.infer("simple", {"INPUT0": a, "INPUT1": a})
        np.testing.assert_array_equal(out["OUTPUT0"], 2 * a)
    finally:
        await engine.stop()
