"""An example flowserve backend (``example_affine``): ``OUTPUT0 = INPUT0 * scale + offset``.

It shows every part of the backend extension API (``flowserve.nodes.backends.api``): the three
levels (backend, model, instance), the attributes, auto-complete, parameters, errors.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.nodes.backends.api import (
    Backend,
    BackendAttributes,
    InstanceInfo,
    InvalidArgument,
    Model,
    ModelInfo,
    ModelInstance,
    TensorMap,
)

__version__ = "0.1.0"

# What happened in this process (the tests read it): counters and the batch sizes seen.
STATS: dict[str, Any] = {
    "backend_initialize": 0,
    "backend_finalize": 0,
    "models": 0,
    "model_finalize": 0,
    "instances": 0,
    "instance_finalize": 0,
    "executions": 0,
    "loading": 0,
    "max_loading": 0,
    "batches": [],
}
_lock = threading.Lock()


def _count(key: str, delta: int = 1) -> None:
    with _lock:
        STATS[key] += delta


def reset_stats() -> None:
    with _lock:
        for key in STATS:
            STATS[key] = [] if key == "batches" else 0


def _number(info: ModelInfo, key: str, default: float) -> float:
    raw = info.parameters.get(key, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise InvalidArgument(f"parameter '{key}' must be a number, got '{raw}'") from None


class AffineInstance(ModelInstance):
    """One instance: executes on its own thread, one batch at a time."""

    def __init__(self, model: AffineModel, info: InstanceInfo) -> None:
        self.model = model
        self.name = info.name
        self.kind = info.kind
        self.executions = 0

    def execute(self, requests: list[TensorMap]) -> list[TensorMap]:
        m = self.model
        self.executions += 1
        with _lock:
            STATS["executions"] += 1
            STATS["batches"].append(len(requests))
        responses = []
        for request in requests:
            x = request[m.input]
            if m.fail_on is not None and np.any(x == m.fail_on):
                raise InvalidArgument(f"input {m.input} contains {m.fail_on}, which this model refuses")
            responses.append({m.output: (x * m.scale + m.offset).astype(x.dtype)})
        return responses

    def finalize(self) -> None:
        _count("instance_finalize")


class AffineModel(Model):
    """One loaded model version: reads its parameters once."""

    def __init__(self, info: ModelInfo) -> None:
        if not info.inputs or not info.outputs:
            raise InvalidArgument("the config must name one input and one output")
        self.info = info
        self.input = info.inputs[0].name
        self.output = info.outputs[0].name
        self.scale = _number(info, "scale", 1.0)
        self.offset = _number(info, "offset", 0.0)
        self.load_delay_s = _number(info, "load_delay_ms", 0.0) / 1000.0
        fail_on = info.parameters.get("fail_on", "").strip()
        self.fail_on = float(fail_on) if fail_on else None
        _count("models")

    def create_instance(self, info: InstanceInfo) -> AffineInstance:
        with _lock:
            STATS["loading"] += 1
            STATS["max_loading"] = max(STATS["max_loading"], STATS["loading"])
        try:
            if self.load_delay_s > 0:
                time.sleep(self.load_delay_s)  # a slow model load (compiling, reading weights)
            return AffineInstance(self, info)
        finally:
            with _lock:
                STATS["loading"] -= 1
                STATS["instances"] += 1

    def finalize(self) -> None:
        _count("model_finalize")


class AffineBackend(Backend):
    """The backend: one object per process, shared by every ``example_affine`` model."""

    api_version = (1, 0)
    attributes = BackendAttributes(
        batching=True,
        merge_requests=False,  # execute() sees the batched requests one by one (Triton's way)
        parallel_instance_loading=True,
        preferred_instance_kind="KIND_CPU",
        preferred_instance_count=2,
    )

    def initialize(self) -> None:
        _count("backend_initialize")

    def finalize(self) -> None:
        _count("backend_finalize")

    def create_model(self, info: ModelInfo) -> AffineModel:
        return AffineModel(info)

    @classmethod
    def auto_complete(cls, config: dict[str, Any], version_dirs: list[Path]) -> dict[str, Any] | None:
        if config.get("input") or config.get("output"):
            return None
        tensor = {"data_type": "TYPE_FP32", "dims": [-1]}
        return {
            "max_batch_size": 8,
            "dynamic_batching": True,
            "input": [{"name": "INPUT0", **tensor}],
            "output": [{"name": "OUTPUT0", **tensor}],
        }
