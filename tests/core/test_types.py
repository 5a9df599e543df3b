"""The transport-neutral request and response (flowserve/core/types.py): they cross the link
between worker processes pickled, as a call of their class with their fields."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np

from flowserve.core.types import InferRequest, InferResponse, RequestedOutput
from flowserve.nodes.forward import Forwarded


def _same(a: object, b: object) -> None:
    assert type(a) is type(b)
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, dict) and any(isinstance(v, np.ndarray) for v in x.values()):
            assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        else:
            assert x == y, f.name


def test_every_field_survives_pickling_and_copies() -> None:
    request = InferRequest(
        "m", {"x": np.arange(3, dtype=np.int8)}, "2", "id-1", {"p": 1, "s": "v"},
        [RequestedOutput("y", 3), RequestedOutput("z")], frozenset({"y"}), "10.0.0.1",
    )  # fmt: skip
    response = InferResponse("m", "2", {"y": np.ones((2, 2), np.float32)}, "id-1", {"q": True})
    forwarded = Forwarded("m", "2", {"x": np.zeros(1)}, "id-1", {"p": 1}, 2, 5_000, True, "10.0.0.1")
    for value in (request, response, forwarded):
        for protocol in (2, 4, 5):
            _same(value, pickle.loads(pickle.dumps(value, protocol)))
        _same(value, copy.copy(value))
        _same(value, copy.deepcopy(value))
    deep = copy.deepcopy(request)
    assert deep.inputs["x"] is not request.inputs["x"] and deep.outputs is not request.outputs
