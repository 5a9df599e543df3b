"""normalize -> embed -> score: the embed step is CPU-bound, with a cost per call that hardly
grows with the rows of a batch (a stack of small matrix products)."""

from __future__ import annotations

from typing import Any

import numpy as np


class Normalize:
    inputs = {"x": {"datatype": "FP32", "dims": [-1, 64]}}
    outputs = {"y": {"datatype": "FP32", "dims": [-1, 64]}}

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        y = (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, keepdims=True) + 1e-6)
        return {"y": y.astype(np.float32)}


class Embed:
    inputs = {"x": {"datatype": "FP32", "dims": [-1, 64]}}
    outputs = {"y": {"datatype": "FP32", "dims": [-1, 64]}}

    def initialize(self, config: dict[str, Any]) -> None:
        layers = int(config["parameters"].get("layers", 192))
        rng = np.random.default_rng(0)
        self.weights = [(rng.standard_normal((64, 64)) / 8).astype(np.float32) for _ in range(layers)]

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        h = inputs["x"]
        for w in self.weights:
            h = np.tanh(h @ w)
        return {"y": h}


class Score:
    inputs = {"x": {"datatype": "FP32", "dims": [-1, 64]}}
    outputs = {"y": {"datatype": "FP32", "dims": [-1, 1]}}

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"].sum(axis=1, keepdims=True)}
