"""Transport-neutral inference request and response."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowserve.core.node import TensorMap


def reduce_by_fields(self: Any) -> tuple[type, tuple[Any, ...]]:
    """Pickled as a call of the class with its fields in order: a slots dataclass otherwise
    pickles through copyreg's generic state, twice the cost (requests and responses cross the
    link between worker processes on every hop)."""
    return type(self), tuple(getattr(self, name) for name in self.__slots__)


@dataclass(slots=True)
class RequestedOutput:
    """An output the caller asked for; ``class_count`` > 0 asks for Triton's top-k classification."""

    name: str
    class_count: int = 0

    __reduce__ = reduce_by_fields


@dataclass(slots=True)
class InferRequest:
    model: str
    inputs: TensorMap
    version: str = ""
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    outputs: list[RequestedOutput] | None = None
    # outputs the caller takes where the graph made them (written into CUDA shared memory
    # device to device); every other output is numpy
    keep_device: frozenset[str] = frozenset()
    # who sent it, as its front end knows it (the client's IP address; "" when unknown, as for
    # the in-process API): a stateful model shares its sequence slots fairly between clients
    peer: str = ""

    __reduce__ = reduce_by_fields


@dataclass(slots=True)
class InferResponse:
    model: str
    version: str
    outputs: TensorMap
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)

    __reduce__ = reduce_by_fields
