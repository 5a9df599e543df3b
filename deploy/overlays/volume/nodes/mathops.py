"""y = x * scale + offset (parameters ``scale`` and ``offset``), keeping x's dtype."""

from __future__ import annotations

from typing import Any

import numpy as np


class Affine:
    inputs = ["x"]
    outputs = ["y"]

    def initialize(self, config: dict[str, Any]) -> None:
        self.scale = config["parameters"].get("scale", 1)
        self.offset = config["parameters"].get("offset", 0)

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        return {"y": np.asarray(x * self.scale + self.offset).astype(x.dtype, copy=False)}
