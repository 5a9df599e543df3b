"""The one node contract every node kind implements.

A node takes named numpy tensors and returns named numpy tensors::

    class Node:
        async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap

Behaviour is added by wrapping a node (a batcher wraps a backend; a model step wraps the
model's compiled graph), never by patching one. ``start``/``stop`` bracket a node's life:
``start`` loads what it needs (sessions, user code), ``stop`` releases it.

Where a node's instances run (a thread, a CUDA stream, a worker process, later a remote actor)
is the node's own business: the executor only awaits ``__call__``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TensorMap = dict[str, np.ndarray]


@dataclass(slots=True)
class Span:
    """One step of a request's trace: a node, when it was queued/started/finished, how it ended."""

    graph: str
    node: str
    start_ns: int
    end_ns: int = 0
    error: str | None = None
    skipped: bool = False
    batch_size: int = 0
    # what the node tells about its step, e.g. a generation node's token counts and time to first
    # token (vLLM's span attribute names: gen_ai.usage.completion_tokens, ...); None: nothing
    attributes: dict[str, int | float | str] | None = None


@dataclass(slots=True)
class Context:
    """What a node may know about the request it serves (never the transport)."""

    request_id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    deadline_ns: int | None = None
    priority: int = 0
    trace: list[Span] | None = None
    # set when the caller went away or the deadline passed while a node worked on the request
    # (a python model's request.is_cancelled() reads it, from the model's thread)
    cancelled: bool = False
    # the client that sent the request (core.types.InferRequest.peer; "" when unknown)
    peer: str = ""


class Node:
    """Base class of every node kind. Subclasses override ``__call__`` and maybe start/stop.

    A *decoupled* node (``decoupled = True``) answers a request with zero, one or many
    responses: it implements ``stream`` instead of ``__call__``, and the executor runs the
    nodes behind it once per response.

    A node with *partial outputs* (``partial_outputs = True``, a switch) returns only some of
    the outputs it declares; the executor skips the nodes that wait on the others. Every other
    node returns all it declares. These two flags are all the executor knows of a node's kind.
    """

    name: str = ""
    decoupled: bool = False
    partial_outputs: bool = False

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        raise NotImplementedError

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncGenerator[TensorMap, None]:
        """The node's responses, in order (default: the one answer of ``__call__``)."""
        yield await self(inputs, ctx)

    async def start(self) -> None:
        """Load whatever the node needs. Raising here fails the load of its graph."""

    async def stop(self) -> None:
        """Release what ``start`` acquired. Must not raise."""
