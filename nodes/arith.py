"""Small arithmetic nodes used by the bundled example graphs."""

from __future__ import annotations

from typing import Any

import numpy as np


class Scale:
    """y = x * factor (parameter ``factor``, default 1), keeping x's dtype."""

    inputs = ["x"]
    outputs = ["y"]

    def initialize(self, config: dict[str, Any]) -> None:
        self.factor = config["parameters"].get("factor", 1)

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        return {"y": np.asarray(x * self.factor).astype(x.dtype, copy=False)}


class Add:
    """sum = a + b."""

    inputs = ["a", "b"]
    outputs = ["sum"]

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"sum": inputs["a"] + inputs["b"]}


class Identity:
    """y = x."""

    inputs = ["x"]
    outputs = ["y"]

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"]}
