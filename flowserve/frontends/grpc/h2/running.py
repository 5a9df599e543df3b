"""Running a connection's calls: a unary call started on its parsed request (or once a
message parsed or inflated in a thread is ready), a streaming call fed its requests from the
stream's queue as its servicer reads them, each answer sent as it comes, deadlines
(``grpc-timeout``) and the status a call that raised ends with."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from flowserve.frontends.grpc.h2.calls import EOF, Later, Refused, Scattered, Stream, Streaming, Unary
from flowserve.frontends.grpc.h2.headers import TRAILERS_OK, grpc_timeout_s, shown
from flowserve.frontends.grpc.h2.limits import CONN_SEND_AHEAD, SEND_AHEAD
from flowserve.frontends.grpc.h2.receiving import Receiver

log = logging.getLogger("flowserve.grpc")


class CallRunner(Receiver):
    """The calls of :class:`~flowserve.frontends.grpc.h2.connection.Connection` (a base of it,
    above :class:`~flowserve.frontends.grpc.h2.receiving.Receiver`)."""

    paused: asyncio.Future[None] | None

    def _start_unary(self, stream: Stream, request: Any) -> None:
        """Run a unary call on its parsed request (None: it was answered instead)."""
        if request is None:
            return
        unary = stream.method.unary
        assert unary is not None
        if request.__class__ is Later:
            stream.task = self.loop.create_task(self._run_unary_later(stream, unary, request))
            return
        stream.task = self.loop.create_task(self._run_unary(stream, unary, request))

    async def _run_unary_later(self, stream: Stream, call: Unary, later: Later) -> None:
        try:
            request = await later.task
        except asyncio.CancelledError:
            return
        except Refused as refused:
            self._finish(stream, refused.code, refused.message)
            return
        except Exception as exc:
            self._failed(stream, exc, None)
            return
        await self._run_unary(stream, call, request)

    def _timeout_s(self, stream: Stream) -> float | None:
        """The call's ``grpc-timeout`` in seconds (None: none); a malformed one ends the call
        with INTERNAL and gives -1."""
        header = stream.context.header("grpc-timeout")
        if header is None:
            return None
        seconds = grpc_timeout_s(header)
        if seconds is None:
            message = f"malformed grpc-timeout '{shown(header.encode('latin-1'))}'"
            self._finish(stream, grpc.StatusCode.INTERNAL, message)
            return -1.0
        return seconds

    async def _run_unary(self, stream: Stream, call: Unary, request: Any) -> None:
        seconds = self._timeout_s(stream)
        if seconds is not None and seconds < 0:
            return
        deadline = asyncio.timeout(seconds) if seconds is not None else None
        try:
            if deadline is None:  # most calls: no timeout to enter on the hot path
                response = await call(request, stream.context)
            else:
                async with deadline:
                    response = await call(request, stream.context)
            if stream.sid in self.streams:
                if isinstance(response, Scattered):  # large tensors: written from their buffers
                    self._send_parts(stream, response, TRAILERS_OK)
                else:
                    self._send(stream, response.SerializeToString(), TRAILERS_OK)
        except asyncio.CancelledError:
            return
        except Exception as exc:
            self._failed(stream, exc, deadline)

    async def _run_streaming(self, stream: Stream, call: Streaming) -> None:
        context = stream.context
        seconds = self._timeout_s(stream)
        if seconds is not None and seconds < 0:
            return
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                async for response in call(self._requests(stream), context):
                    if stream.sid not in self.streams:
                        return
                    if isinstance(response, Scattered):  # large tensors: written from their buffers
                        self._send_parts(stream, response, None)
                    else:
                        self._send(stream, response.SerializeToString(), None)
                    if (
                        len(stream.out) > SEND_AHEAD
                        or self.out_blocked > CONN_SEND_AHEAD
                        or (self.paused is not None and not self.paused.done())
                        or (stream.charged and self.server.unsent_tight())
                    ):
                        await self._drain(stream)
            self._finish(stream, context.code, context.details)  # OK unless set_code said otherwise
        except asyncio.CancelledError:
            return
        except Exception as exc:
            self._failed(stream, exc, deadline)

    def _failed(self, stream: Stream, exc: Exception, deadline: asyncio.Timeout | None) -> None:
        """A call that raised: DEADLINE_EXCEEDED past its deadline, the status
        ``context.abort`` set, else UNKNOWN (a bug: logged)."""
        if deadline is not None and isinstance(exc, TimeoutError) and deadline.expired():
            self._finish(stream, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            return
        if isinstance(exc, grpc.aio.AbortError):
            self._finish(stream, stream.context.code, stream.context.details)
            return
        log.error("gRPC call %s failed", stream.context.header(":path"), exc_info=exc)
        self._finish(stream, grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")

    async def _requests(self, stream: Stream) -> AsyncIterator[Any]:
        queue = stream.queue
        assert queue is not None
        while True:
            message = await queue.get()
            if message is EOF:
                return
            size = stream.sizes.popleft()
            stream.queued -= size
            self._take_data(size)
            if message.__class__ is Later:
                try:
                    message = await message.task
                except Refused as refused:
                    stream.context.code = refused.code
                    stream.context.details = refused.message
                    raise grpc.aio.AbortError() from None
            if stream.unacked and not stream.remote_closed and self._reader_keeps_up(stream):
                self._ack_stream(stream)
            yield message

    async def _drain(self, stream: Stream) -> None:
        while stream.sid in self.streams:
            if len(stream.out) > SEND_AHEAD or (stream.out and self.server.unsent_tight()):
                stream.drained = self.loop.create_future()
                await stream.drained
            elif self.out_blocked > CONN_SEND_AHEAD:
                if self.unblocked is None or self.unblocked.done():
                    self.unblocked = self.loop.create_future()
                await self.unblocked
            else:
                break
        if self.paused is not None and not self.paused.done():
            await self.paused
