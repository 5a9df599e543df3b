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
    # a message's bytes, or a view of them: of the message's own buffer when it is large (the
    # parsed message may keep it), else possibly of the server's read buffer, which the next read
    # overwrites (a small message's parse must copy what it keeps, as protobuf's does)
    parse: Callable[[bytes | memoryview], Any]
    unary: Unary | None = None
    streaming: Streaming | None = None
    # whether a message over PARSE_INLINE bytes may still be parsed on the loop (its parse is
    # quick whatever its size: e.g. an inference request whose bytes are nearly all raw
    # contents, parsed as views); None: such messages are parsed in a thread
    inline: Callable[[bytes | memoryview], bool] | None = None


Piece = bytes | bytearray | memoryview  # bytes on their way out: a message's, or a view of them


class Scattered:
    """A response message that gives its serialized bytes as pieces (views of the buffers that
    hold them, e.g. a tensor's) instead of one joined ``bytes``: the transport frames and writes
    them as they are (``Outgoing``, vectored writes), never joining them. Subclasses say how."""

    def wire_parts(self) -> tuple[list[Piece], int]:
        """The serialized message as pieces (one-dimensional, contiguous) and their total size."""
        raise NotImplementedError


class Outgoing:
    """A stream's response bytes (gRPC-framed) waiting for the peer's windows, as the pieces
    they came in (never joined or copied: a large message's pieces are views of its buffers)."""

    __slots__ = ("pieces", "size")

    def __init__(self) -> None:
        self.pieces: deque[Piece] = deque()
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, piece: Piece) -> None:
        if len(piece):
            self.pieces.append(piece)
            self.size += len(piece)

    def clear(self) -> None:
        self.pieces.clear()
        self.size = 0

    def take(self, count: int) -> list[Piece]:
        """The first ``count`` bytes (at most ``len(self)``), as pieces; a piece that is cut
        leaves a view of its rest at the front."""
        pieces = self.pieces
        taken: list[Piece] = []
        self.size -= count
        while count:
            piece = pieces[0]
            n = len(piece)
            if n <= count:
                taken.append(pieces.popleft())
                count -= n
                continue
            view = piece if isinstance(piece, memoryview) else memoryview(piece)
            taken.append(view[:count])
            pieces[0] = view[count:]
            break
        return taken


# the servicer refuses a call before running it: (method path, metadata header) -> message or None
Gate = Callable[[str, Callable[[str], str | None]], str | None]


class Eof:
    pass


EOF = Eof()


class Stream:
    __slots__ = (
        "charged", "context", "data", "declared", "drained", "encoding", "filled", "header_size",
        "headers_sent", "held", "into", "method", "out", "queue", "queued", "remote_closed",
        "reply_encoding", "send_window", "sid", "sizes", "stamp", "task", "trailers", "unacked",
    )  # fmt: skip

    def __init__(self, sid: int, method: Method, headers: list[tuple[bytes, bytes]], window: int) -> None:
        self.sid = sid
        self.method = method
        self.data = bytearray()
        # a large unary message's own buffer (its 5-byte prefix included), once its size is known
        # and taken from the budget, and the bytes of it received
        self.into: memoryview | None = None
        self.filled = 0
        self.send_window = window
        self.out = Outgoing()  # response bytes (gRPC-framed) waiting for the peer's window
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
