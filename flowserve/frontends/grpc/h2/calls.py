"""A call on the HTTP/2 transport: the method table's entries, a stream's state, and the
markers of a request message still inflating or parsing in a thread."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from flowserve.frontends.grpc.h2.headers import CallContext

Unary = Callable[[Any, CallContext], Awaitable[Any]]
Streaming = Callable[[AsyncIterator[Any], CallContext], AsyncIterator[Any]]


@dataclass(frozen=True)
class Method:
    parse: Callable[[bytes | memoryview], Any]  # a message's bytes, or a view of them
    unary: Unary | None = None
    streaming: Streaming | None = None


# the servicer refuses a call before running it: (method path, metadata header) -> message or None
Gate = Callable[[str, Callable[[str], str | None]], str | None]


class Eof:
    pass


EOF = Eof()


class Stream:
    __slots__ = (
        "charged", "context", "data", "declared", "drained", "encoding", "header_size", "headers_sent",
        "held", "method", "out", "queue", "queued", "remote_closed", "reply_encoding", "send_window",
        "sid", "sizes", "stamp", "task", "trailers", "unacked",
    )  # fmt: skip

    def __init__(self, sid: int, method: Method, headers: list[tuple[bytes, bytes]], window: int) -> None:
        self.sid = sid
        self.method = method
        self.data = bytearray()
        self.send_window = window
        self.out = bytearray()  # response bytes (gRPC-framed) waiting for the peer's window
        self.trailers: bytes | None = None  # sent once ``out`` is empty
        self.headers_sent = False
        self.task: asyncio.Task[None] | None = None
        self.queue: asyncio.Queue[Any] | None = None
        # a streaming call's parsed requests not yet read by its servicer: their wire sizes, in
        # order, and their sum (counted in the connection's undelivered bytes until read)
        self.sizes: deque[int] = deque()
        self.queued = 0
        self.remote_closed = False
        self.unacked = 0
        self.encoding = b"identity"
        self.reply_encoding: bytes | None = None  # responses compressed with it (ResponseCompression)
        self.context = CallContext(headers)
        self.drained: asyncio.Future[None] | None = None
        self.declared = -1  # a unary request's size from its prefix (-1: not seen yet)
        self.held = 0  # bytes of the message being received taken from the server's ByteBudget
        self.header_size = 0  # decoded header bytes counted against MAX_HEADERS_HELD
        self.charged = 0  # bytes of ``out`` taken from the server's budget of unsent bytes
        self.stamp = 0  # the server's body tick when its request last made progress (or it opened)


class Refused(Exception):
    """A request message answered with ``code`` instead of being delivered."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Later:
    """A request message still inflating or parsing (in a thread): its task gives the parsed
    message."""

    __slots__ = ("task",)

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task


def retrieved(task: asyncio.Task[Any]) -> None:
    """A done callback: the task's exception is seen (a message nobody waited for any more)."""
    if not task.cancelled():
        task.exception()


async def unknown(request: Any, context: CallContext) -> Any:  # pragma: no cover - never called
    raise AssertionError


UNKNOWN = Method(parse=bytes, unary=unknown)
