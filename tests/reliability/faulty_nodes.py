"""Python nodes that misbehave on request, for the fault tests (imported by the server from
tests/reliability, the folder that holds graphs/)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


class Check:
    """y = x; raises on a negative value (a node that raises)."""

    inputs = ["x"]
    outputs = {"y": {"datatype": "FP32", "dims": [-1]}}

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        if (x < 0).any():
            raise ValueError("negative values are not allowed")
        return {"y": x}


class Nap:
    """y = x, after sleeping x[0] - 100 seconds when x[0] >= 100 (a node that hangs on request).
    It may block, so it never runs on the event loop (``inline = False``)."""

    inputs = ["x"]
    outputs = {"y": {"datatype": "FP32", "dims": [-1]}}
    inline = False

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        x = inputs["x"]
        if x[0] >= 100:
            time.sleep(float(x[0]) - 100)
        return {"y": x}


class Misshape:
    """Returns the wrong dtype when x[0] is 1, a wrong rank when it is 2, else y = x."""

    inputs = ["x"]
    outputs = {"y": {"datatype": "FP32", "dims": [-1]}}

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        x = inputs["x"]
        if x[0] == 1:
            return {"y": x.astype(np.int64)}
        if x[0] == 2:
            return {"y": x.reshape(1, -1)}
        return {"y": x}


class Crash:
    """Takes its process down on request: x[0] == 3 exits with code 3 (``os._exit``), x[0] == 11
    segfaults (reads address 0), x[0] >= 100 hangs for x[0] - 100 seconds; else y = x and ``pid``
    says which process answered. Run isolated (graphs/crash.yaml), the server survives all of it."""

    inputs = ["x"]
    outputs = {"y": {"datatype": "FP32", "dims": [-1]}, "pid": {"datatype": "INT64", "dims": [1]}}
    isolated = True

    def execute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import ctypes
        import os

        x = inputs["x"]
        if x[0] == 3:
            os._exit(3)
        if x[0] == 11:
            ctypes.string_at(0)
        if x[0] >= 100:
            time.sleep(float(x[0]) - 100)
        return {"y": x, "pid": np.array([os.getpid()], np.int64)}
