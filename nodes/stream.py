"""A decoupled (streaming) node for the bundled "repeat" graph."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class Repeat:
    """Yields ``n`` responses: response i carries ``x`` and its index i.

    ``execute`` is a generator, which makes the node decoupled: every yielded dict is one
    response, and the nodes behind it run once per response.
    """

    inputs = ["x", "n"]
    outputs = {"y": {"datatype": "INT32", "dims": [-1]}, "index": {"datatype": "INT32", "dims": [1]}}

    def execute(self, inputs: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        for i in range(int(inputs["n"].reshape(-1)[0])):
            yield {"y": inputs["x"], "index": np.array([i], dtype=np.int32)}
