"""A decoupled request's responses, produced at the graph's pace and read at the client's.

A decoupled model or graph answers one request with many responses. If the front end pulled
them straight from the graph, a client that reads slowly (or not at all: a zero HTTP/2 window,
an SSE reader that stopped) would hold the graph's instance for as long as it likes, and every
other client of that graph would wait behind it. :func:`decouple` instead runs the graph's
stream in its own task, which never waits for the client: responses wait in a per-request
buffer bounded in bytes and in count. A client that falls so far behind that the bound is
reached costs only itself: its request ends with RESOURCE_EXHAUSTED naming the model, what it
left unread is dropped, and the graph's work for it is cancelled. A client that goes away
(the front end closes the iterator) cancels the graph's work at once.

The bound is generous for streaming use (tokens, frames) and applies only to decoupled
servables; a request with one response is passed through with no task and no buffer. The
unread bytes of all requests together are bounded too: they take their size from the
server's :class:`~flowserve.dataplane.guard.ByteBudget` (in at least doubling steps of
``guard.SMALL`` or more, a few calls per stream), and a request whose unread responses do
not fit ends the same way as one over its own bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator

from flowserve.core.errors import ResourceExhausted
from flowserve.core.types import InferResponse
from flowserve.dataplane.guard import SMALL, ByteBudget

# responses of one request produced and not yet taken by its client
MAX_UNREAD_BYTES = 16 * 1024 * 1024
MAX_UNREAD_RESPONSES = 16 * 1024
_END = object()


def response_bytes(response: InferResponse) -> int:
    """The bytes a response's tensors hold (an object array counts its pointers)."""
    return sum(int(a.nbytes) for a in response.outputs.values())


async def decouple(
    source: AsyncGenerator[InferResponse, None],
    model: str,
    budget: ByteBudget | None = None,
    max_bytes: int | None = None,
    max_responses: int | None = None,
) -> AsyncGenerator[InferResponse, None]:
    """``source``'s responses, pulled by a task of their own into a bounded buffer (see the
    module docstring; the bounds default to ``MAX_UNREAD_BYTES`` and ``MAX_UNREAD_RESPONSES``;
    ``budget``: the server's, which the unread bytes share with every other request).
    Closing the returned iterator cancels ``source``."""
    byte_bound = MAX_UNREAD_BYTES if max_bytes is None else max_bytes
    count_bound = MAX_UNREAD_RESPONSES if max_responses is None else max_responses
    # (a response and its bytes), or (the end or an error to raise, 0)
    buffer: deque[tuple[object, int]] = deque()
    ready = asyncio.Event()
    unread = 0
    reserved = 0  # bytes of ``budget`` the unread responses hold

    async def produce() -> None:
        nonlocal unread, reserved
        try:
            async for response in source:
                size = response_bytes(response)
                unread += size
                buffer.append((response, size))
                ready.set()
                over = ""
                if unread > byte_bound or len(buffer) > count_bound:
                    over = (
                        f"over the server's bound of {count_bound} responses or {byte_bound} bytes "
                        "per request"
                    )
                elif budget is not None and unread > reserved:
                    step = max(SMALL, reserved, unread - reserved)  # at least doubling
                    if budget.take(step):
                        reserved += step
                    else:
                        over = budget.refusal(step)
                if over:
                    overflow = ResourceExhausted(
                        f"model '{model}': the client read responses too slowly: {len(buffer)} responses "
                        f"({unread} bytes) waited for it, {over}; the request was ended"
                    )
                    buffer.clear()
                    buffer.append((overflow, 0))
                    unread = 0
                    return
            buffer.append((_END, 0))
        except Exception as exc:  # handed to the reader, raised there
            buffer.append((exc, 0))
        finally:
            ready.set()
            with contextlib.suppress(Exception):
                await source.aclose()

    task = asyncio.ensure_future(produce())
    try:
        while True:
            while not buffer:
                ready.clear()
                await ready.wait()
            item, size = buffer.popleft()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, InferResponse)
            unread -= size
            yield item
    finally:
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
        if reserved and budget is not None:
            budget.give(reserved)
