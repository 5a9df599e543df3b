"""``KIND_RAY``: a node's or a model's instances placed on a Ray cluster, as declared.

A YAML python node says it in its ``instances``::

    instances: {count: 4, kind: KIND_RAY, resources: {num_cpus: 1, num_gpus: 0, accel: 1},
                max_restarts: -1}

(``resources``: ``num_cpus`` (default 1) and ``num_gpus`` (default 0), any other key a custom
Ray resource; ``max_restarts``: how often Ray restarts a dead actor, -1 always, the default).

A repository model cannot say ``KIND_RAY`` in ``instance_group`` (Triton's enum has no such
kind), so it uses model ``parameters`` (string values, as Triton's parameters are)::

    parameters { key: "flowserve.ray.count"        value: { string_value: "2" } }   # turns it on
    parameters { key: "flowserve.ray.num_cpus"     value: { string_value: "1" } }
    parameters { key: "flowserve.ray.num_gpus"     value: { string_value: "0" } }
    parameters { key: "flowserve.ray.resources"    value: { string_value: "{\\"accel\\": 1}" } }
    parameters { key: "flowserve.ray.max_restarts" value: { string_value: "-1" } }

The model's ``instance_group`` then only says what each actor loads (one instance; a GPU one
when ``num_gpus`` > 0). Pure parsing: where the actors run is nodes/rayinstances.py.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from flowserve.core.errors import InvalidArgument
from flowserve.spec.bounds import out_of_bounds
from flowserve.spec.schema import InstanceSpec, ModelSpec, RaySpec

KIND_RAY: Final = "KIND_RAY"
PARAMETER_PREFIX = "flowserve.ray."
PARAMETERS = ("count", "num_cpus", "num_gpus", "resources", "max_restarts")


def ray_from_yaml(raw: Mapping[str, Any], report: Callable[[str, str], None]) -> RaySpec:
    """The Ray part of a YAML ``instances`` mapping (``resources``, ``max_restarts``);
    ``report(message, field)`` gets each problem (the defaults stand in for a bad value)."""
    resources = raw.get("resources", {})
    if resources is None:
        resources = {}
    if not isinstance(resources, dict):
        report("must be a mapping {num_cpus, num_gpus, <custom resource>: amount}", "instances.resources")
        resources = {}
    amounts: dict[str, float] = {}
    for name, value in resources.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            report(f"must be a number >= 0, got {value!r}", f"instances.resources.{name}")
            continue
        amounts[str(name)] = float(value)
    restarts = raw.get("max_restarts", -1)
    if isinstance(restarts, bool) or not isinstance(restarts, int) or restarts < -1:
        report(f"must be an integer >= -1 (-1: always), got {restarts!r}", "instances.max_restarts")
        restarts = -1
    return _spec(amounts, restarts)


def _spec(amounts: dict[str, float], restarts: int) -> RaySpec:
    cpus = amounts.pop("num_cpus", 1.0)
    gpus = amounts.pop("num_gpus", 0.0)
    return RaySpec(cpus, gpus, tuple(sorted(amounts.items())), restarts)


def ray_from_parameters(model: ModelSpec) -> InstanceSpec | None:
    """A repository model's ``flowserve.ray.*`` parameters as its instances (None: it has
    none); InvalidArgument naming the parameter for a bad value."""
    params = {
        k[len(PARAMETER_PREFIX) :]: v for k, v in model.parameters.items() if k.startswith(PARAMETER_PREFIX)
    }
    if not params:
        return None
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise InvalidArgument(
            f"unknown parameter '{PARAMETER_PREFIX}{unknown[0]}' (expected "
            + ", ".join(PARAMETER_PREFIX + p for p in PARAMETERS)
            + ")"
        )
    if "count" not in params:
        raise InvalidArgument(f"'{PARAMETER_PREFIX}count' is needed to place the model's instances on Ray")
    count = _number(params, "count", int)
    problem = out_of_bounds("instances", count)
    if problem is not None:
        raise InvalidArgument(f"model '{model.name}': '{PARAMETER_PREFIX}count' {problem}")
    amounts: dict[str, float] = {}
    for name in ("num_cpus", "num_gpus"):
        if name in params:
            amounts[name] = _number(params, name, float)
            if amounts[name] < 0:
                raise InvalidArgument(f"'{PARAMETER_PREFIX}{name}' must be >= 0")
    if "resources" in params:
        amounts.update(_custom(params["resources"]))
    restarts = _number(params, "max_restarts", int) if "max_restarts" in params else -1
    if restarts < -1:
        raise InvalidArgument(f"'{PARAMETER_PREFIX}max_restarts' must be >= -1 (-1: always)")
    return InstanceSpec(count=count, kind=KIND_RAY, ray=_spec(amounts, restarts))


def _number(params: Mapping[str, str], name: str, kind: type[int] | type[float]) -> Any:
    text = params[name].strip()
    try:
        value = kind(text)
    except ValueError:
        raise InvalidArgument(
            f"'{PARAMETER_PREFIX}{name}' must be {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None
    if not math.isfinite(value):
        raise InvalidArgument(f"'{PARAMETER_PREFIX}{name}' must be finite, got {text!r}")
    return value


def _custom(text: str) -> dict[str, float]:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"'{PARAMETER_PREFIX}resources' must be a JSON object: {exc}") from None
    if not isinstance(raw, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in raw.values()
    ):
        raise InvalidArgument(
            f"'{PARAMETER_PREFIX}resources' must be a JSON object of resource name -> amount >= 0, "
            f"got {text!r}"
        )
    return {str(k): float(v) for k, v in raw.items()}


def ray_instances(model: ModelSpec) -> ModelSpec:
    """``model`` with its instances as its ``flowserve.ray.*`` parameters say (unchanged when
    it has none)."""
    group = ray_from_parameters(model)
    if group is None:
        return model
    return dataclasses.replace(model, instances=(group,))


def local_instance(model: ModelSpec) -> ModelSpec:
    """What one Ray actor loads of ``model``: one instance (a GPU one, on the GPU Ray gave the
    actor, when the model asks Ray for GPUs), no warmup of its own (the server warms each actor
    up through the hop) and no ``flowserve.ray.*`` parameters (the actor does not place again)."""
    ray = next((g.ray for g in model.instances if g.ray is not None), None)
    gpu = ray is not None and ray.num_gpus > 0
    group = InstanceSpec(count=1, kind="KIND_GPU" if gpu else "KIND_CPU", gpus=(0,) if gpu else ())
    params = {k: v for k, v in model.parameters.items() if not k.startswith(PARAMETER_PREFIX)}
    return dataclasses.replace(model, instances=(group,), warmup=(), parameters=params)


__all__ = [
    "KIND_RAY",
    "PARAMETERS",
    "PARAMETER_PREFIX",
    "local_instance",
    "ray_from_parameters",
    "ray_from_yaml",
    "ray_instances",
]
