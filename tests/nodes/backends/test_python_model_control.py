"""``pb_utils.load_model``/``unload_model`` from inside a model go through the server's own
load and unload API (its control mode decides), as in Triton."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import FlowserveError
from flowserve.core.types import InferRequest
from flowserve.dataplane.plane import DataPlane

ROOT = Path(__file__).resolve().parents[3]


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for name, source in (
        ("simple", ROOT / "model_repository"),
        ("python_model_control", ROOT / "tests" / "models"),
    ):
        shutil.copytree(source / name, repo / name)
    return repo


def _ask(load: int) -> InferRequest:
    return InferRequest("python_model_control", {"INPUT0": np.array([load], np.int32)})


async def test_a_model_loads_and_unloads_another_in_explicit_mode(tmp_path: Path) -> None:
    settings = flowserve.RepositorySettings(control_mode="explicit", load_models=("python_model_control",))
    engine = await flowserve.Engine.start(_repo(tmp_path), settings=settings)
    plane = DataPlane(engine)
    try:
        assert not plane.model_ready("simple")
        loaded = await plane.infer(_ask(1))
        assert loaded.outputs["OUTPUT0"].tolist() == [1] and plane.model_ready("simple")
        unloaded = await plane.infer(_ask(0))
        assert unloaded.outputs["OUTPUT0"].tolist() == [0] and not plane.model_ready("simple")
    finally:
        await engine.stop()


async def test_model_control_from_a_model_follows_the_control_mode(tmp_path: Path) -> None:
    engine = await flowserve.Engine.start(_repo(tmp_path))  # mode none: no load API
    plane = DataPlane(engine)
    try:
        with pytest.raises(
            FlowserveError, match=r"explicit model unload is not allowed in model control mode 'none'"
        ):
            await plane.infer(_ask(0))
        assert plane.model_ready("simple")
    finally:
        await engine.stop()


async def test_without_a_server_model_control_is_a_clear_error(tmp_path: Path) -> None:
    settings = flowserve.RepositorySettings(control_mode="explicit", load_models=("python_model_control",))
    engine = await flowserve.Engine.start(_repo(tmp_path), settings=settings)
    try:  # an engine with no data plane: nothing decides on loads
        with pytest.raises(FlowserveError, match="no server serves"):
            await engine.infer("python_model_control", {"INPUT0": np.array([1], np.int32)})
    finally:
        await engine.stop()
