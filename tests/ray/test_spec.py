"""KIND_RAY as declared (no Ray needed): YAML instances, a model's flowserve.ray.* parameters,
settings, and the load error of a model that asks for Ray on a server without a Ray address."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import InvalidArgument, SpecError
from flowserve.repository.settings import RepositorySettings
from flowserve.runtime.registry import State
from flowserve.settings import Settings
from flowserve.spec.graph_yaml import load_graph_file
from flowserve.spec.rayspec import ray_from_parameters
from flowserve.spec.schema import InstanceSpec, ModelSpec, RaySpec

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"


def _graph(tmp_path: Path, instances: str, kind: str = "python: tests.ray.ray_nodes:Double") -> Path:
    path = tmp_path / "g.yaml"
    path.write_text(
        f"""
name: g
inputs: {{x: {{datatype: FP32, dims: [-1]}}}}
outputs: {{y: n.y}}
nodes:
  n: {{{kind}, inputs: {{x: $x}}, instances: {instances}}}
"""
    )
    return path


def test_yaml_kind_ray_parses(tmp_path: Path) -> None:
    spec = load_graph_file(
        _graph(
            tmp_path,
            "{count: 4, kind: KIND_RAY, resources: {num_cpus: 1, num_gpus: 0, accel: 2}, max_restarts: 3}",
        )
    )
    assert spec.nodes["n"].instances == InstanceSpec(
        count=4,
        kind="KIND_RAY",
        ray=RaySpec(num_cpus=1.0, num_gpus=0.0, resources=(("accel", 2.0),), max_restarts=3),
    )
    defaults = load_graph_file(_graph(tmp_path, "{count: 2, kind: KIND_RAY}")).nodes["n"].instances
    assert defaults.ray == RaySpec(num_cpus=1.0, num_gpus=0.0, resources=(), max_restarts=-1)


def test_yaml_kind_ray_errors_name_node_and_field(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as bad:
        load_graph_file(_graph(tmp_path, "{kind: KIND_RAY, resources: {num_cpus: -1}, max_restarts: -5}"))
    text = str(bad.value)
    assert "instances.resources.num_cpus" in text and "instances.max_restarts" in text and "'n'" in text
    with pytest.raises(SpecError, match="only KIND_RAY instances take this"):
        load_graph_file(_graph(tmp_path, "{kind: KIND_CPU, resources: {num_cpus: 1}}"))
    with pytest.raises(SpecError, match="KIND_RAY places python nodes"):
        load_graph_file(_graph(tmp_path, "{kind: KIND_RAY}", kind="model: simple"))


def _model(**parameters: str) -> ModelSpec:
    return ModelSpec("m", "m/config.pbtxt", "python", "", 0, (), (), {1: "m/1"}, parameters=parameters)


def test_config_parameters() -> None:
    assert ray_from_parameters(_model(other="1")) is None
    group = ray_from_parameters(
        _model(
            **{
                "flowserve.ray.count": "3",
                "flowserve.ray.num_cpus": "0.5",
                "flowserve.ray.num_gpus": "1",
                "flowserve.ray.resources": '{"accel": 1}',
                "flowserve.ray.max_restarts": "2",
            }
        )
    )
    assert group == InstanceSpec(count=3, kind="KIND_RAY", ray=RaySpec(0.5, 1.0, (("accel", 1.0),), 2))
    for params, message in [
        ({"flowserve.ray.num_cpus": "1"}, "'flowserve.ray.count' is needed"),
        ({"flowserve.ray.count": "two"}, "must be an integer"),
        ({"flowserve.ray.count": "0"}, "must be between 1 and 1024"),
        ({"flowserve.ray.count": "100000"}, "must be between 1 and 1024 .instances of one model"),
        ({"flowserve.ray.count": "1", "flowserve.ray.cpus": "1"}, "unknown parameter 'flowserve.ray.cpus'"),
        ({"flowserve.ray.count": "1", "flowserve.ray.resources": "[1]"}, "JSON object"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            ray_from_parameters(_model(**params))


def test_settings_ray_address_from_env_and_into_repository() -> None:
    settings = Settings.from_env({"FLOWSERVE_RAY_ADDRESS": "10.0.0.1:6379"})
    assert settings.ray_address == "10.0.0.1:6379"
    assert settings.repository.ray_address == "10.0.0.1:6379"
    assert Settings(repository=RepositorySettings(ray_address="auto")).ray_address == "auto"


async def test_kind_ray_without_address_fails_load_naming_model(tmp_path: Path) -> None:
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    _graph(graphs, "{count: 2, kind: KIND_RAY}")
    engine = await flowserve.Engine.start(MODELS, graphs, RepositorySettings())
    try:
        states = {s.name: s for s in engine.registry.index()}
        for name, who in (("ray_double", "model 'ray_double'"), ("g", "node 'n' of graph 'g'")):
            assert states[name].state is State.UNAVAILABLE
            reason = states[name].reason
            assert f"{who} asks for KIND_RAY instances, but no Ray cluster is configured" in reason
            assert "--ray-address" in reason and "FLOWSERVE_RAY_ADDRESS" in reason
        with pytest.raises(Exception, match="ray_double"):
            await engine.infer("ray_double", {"INPUT0": np.ones((1, 4), np.float32)})
    finally:
        await engine.stop()
