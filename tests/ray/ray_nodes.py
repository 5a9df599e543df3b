"""Python nodes for the Ray tests (tests/ray/): each reports the process it ran in."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

# how many times initialize() ran in this process (an actor loads its node once)
LOADS = 0


class Double:
    """y = 2x, with where it ran: pid, loads (initialize calls in that process) and whether x
    arrived as a read-only view of memory it does not own (Ray's object store, no copy)."""

    inputs = {"x": {"datatype": "FP32", "dims": [-1]}}
    outputs = {
        "y": {"datatype": "FP32", "dims": [-1]},
        "pid": {"datatype": "INT64", "dims": [1]},
        "loads": {"datatype": "INT64", "dims": [1]},
        "x_owned": {"datatype": "BOOL", "dims": [1]},
        "x_writeable": {"datatype": "BOOL", "dims": [1]},
    }

    def initialize(self, config: dict[str, Any]) -> None:
        global LOADS
        LOADS += 1

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        return {
            "y": x * 2,
            "pid": np.array([os.getpid()], np.int64),
            "loads": np.array([LOADS], np.int64),
            "x_owned": np.array([x.flags.owndata], np.bool_),
            "x_writeable": np.array([x.flags.writeable], np.bool_),
        }


class Fails:
    """Raises for negative input, else echoes it (the error must come back as raised)."""

    inputs = {"x": {"datatype": "FP32", "dims": [-1]}}
    outputs = {"y": {"datatype": "FP32", "dims": [-1]}}

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        if (x < 0).any():
            raise ValueError(f"negative input in process {os.getpid()}")
        return {"y": x}


class AsyncDouble:
    """An ``async`` execute on Ray: awaited on the actor's loop."""

    inputs = {"x": {"datatype": "FP32", "dims": [-1]}}
    outputs = {"y": {"datatype": "FP32", "dims": [-1]}, "pid": {"datatype": "INT64", "dims": [1]}}

    async def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"y": inputs["x"] * 2, "pid": np.array([os.getpid()], np.int64)}


class Where:
    """Sleeps ``seconds`` (an input), then answers the pid and the Ray node it ran on: a call
    to kill its process or its Ray node during."""

    inputs = {"seconds": {"datatype": "FP32", "dims": [1]}}
    outputs = {"pid": {"datatype": "INT64", "dims": [1]}, "node": {"datatype": "BYTES", "dims": [1]}}
    inline = False

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import ray

        time.sleep(float(inputs["seconds"][0]))
        node = ray.get_runtime_context().get_node_id()
        return {"pid": np.array([os.getpid()], np.int64), "node": np.array([node.encode()], np.object_)}
