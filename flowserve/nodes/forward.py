"""A model served by another worker process: the node that stands in for it here.

With ``--workers N`` a model whose meaning needs one place (a sequence's state, a response
cache, rate limiter resources, or one its config pins: ``repository/placement.py``) is loaded by
one worker only, its *owner*. Every other worker builds this node in the model's place: the
model's servable is there as usual (metadata, config, readiness, input checks, requested outputs
all answer locally), and only the execution crosses to the owner, which runs the request through
its own servable (its batcher, its sequence state, its cache). What crosses is the request's
inputs and what a node may know of it (id, parameters, priority, time left), never the transport.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from flowserve.core.clock import MONOTONIC, Clock
from flowserve.core.errors import Unavailable
from flowserve.core.node import Context, Node, TensorMap
from flowserve.core.types import reduce_by_fields


@dataclass(frozen=True, slots=True)
class Forwarded:
    """One request as it crosses to the owner (picklable; arrays travel out of band)."""

    model: str
    version: str
    inputs: TensorMap
    request_id: str
    parameters: dict[str, Any]
    priority: int
    timeout_ns: int | None  # time left when it was sent (None: no deadline)
    stream: bool  # the owner answers with every response (a decoupled model), not one
    peer: str = ""  # the client that sent it (Context.peer)

    __reduce__ = reduce_by_fields


# run one forwarded request on the owner: one output map, or every response of a stream
Forwarder = Callable[[Forwarded], Awaitable[Any]]


class ForwardNode(Node):
    """Runs a model on the worker that owns it (see the module's docs)."""

    def __init__(
        self,
        name: str,
        model: str,
        version: int,
        forward: Forwarder,
        decoupled: bool,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.name = name
        self.model = model
        self.version = str(version)
        self.forward = forward
        self.decoupled = decoupled
        self.clock = clock

    def _request(self, inputs: TensorMap, ctx: Context, stream: bool) -> Forwarded:
        left = None
        if ctx.deadline_ns is not None:
            left = ctx.deadline_ns - self.clock.now_ns()
            if left <= 0:
                raise Unavailable(f"model '{self.model}': the request timed out before it was forwarded")
        return Forwarded(
            self.model,
            self.version,
            dict(inputs),
            ctx.request_id,
            dict(ctx.parameters),
            ctx.priority,
            left,
            stream,
            ctx.peer,
        )

    async def __call__(self, inputs: TensorMap, ctx: Context) -> TensorMap:
        result: TensorMap = await self.forward(self._request(inputs, ctx, False))
        return result

    async def stream(self, inputs: TensorMap, ctx: Context) -> AsyncGenerator[TensorMap, None]:
        if not self.decoupled:
            yield await self(inputs, ctx)
            return
        # the owner runs the whole stream and answers with every response at once
        responses: list[TensorMap] = await self.forward(self._request(inputs, ctx, True))
        for response in responses:
            yield response


__all__ = ["ForwardNode", "Forwarded", "Forwarder"]
