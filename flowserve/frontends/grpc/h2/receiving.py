"""The receive side of a connection: request DATA frames, the flow-control windows this side
gives back as request bytes are delivered, and request messages: a small unary request parsed
from the frame as it lies, a large message read into a buffer of its own (straight from the
socket while a long frame arrives: ``Connection.get_buffer`` hands out ``stream.into``), a
streaming call's messages split into its queue, inflation and parsing on the loop or in a
thread, the server's request budget each large message holds until it is parsed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, cast

import grpc
from google.protobuf.message import DecodeError

from flowserve.core.errors import ResourceExhausted
from flowserve.dataplane.guard import SMALL
from flowserve.dataplane.inflate import Corrupt, Inflater, inflate_inline
from flowserve.dataplane.memory import buffer
from flowserve.frontends.grpc.h2.calls import EOF, Later, Piece, Refused, Stream, retrieved
from flowserve.frontends.grpc.h2.compression import ENCODINGS, inflate_rest
from flowserve.frontends.grpc.h2.frames import (
    END_STREAM,
    FLOW_CONTROL_ERROR,
    PADDED,
    PROTOCOL_ERROR,
    STREAM_CLOSED,
    WINDOW,
    WINDOW_UPDATE,
    H2Error,
    frame,
)
from flowserve.frontends.grpc.h2.limits import (
    CONNECTION_WINDOW,
    INFLATE_INLINE,
    PARSE_INLINE,
    QUEUE_AHEAD,
    STREAM_WINDOW,
)
from flowserve.frontends.grpc.h2.sending import Sender

ONE_MESSAGE = "a unary call needs exactly one request message"


class Receiver(Sender):
    """The receive side of :class:`~flowserve.frontends.grpc.h2.connection.Connection` (a base
    of it, above :class:`~flowserve.frontends.grpc.h2.sending.Sender`)."""

    buffered: int  # request bytes received, not yet delivered to a call
    recv_unacked: int  # request bytes received since the connection's window was last given back
    expect: Stream | None
    frame_stream: Stream | None
    frame_left: int
    frame_flags: int
    recent_resets: list[int]

    def _reset_sid(self, sid: int, code: int) -> None:
        raise NotImplementedError

    def _start_unary(self, stream: Stream, request: Any) -> None:
        raise NotImplementedError

    def _sunk(self, nbytes: int) -> None:
        """``nbytes`` of a DATA frame's payload were read straight into its stream's message."""
        stream = self.frame_stream
        assert stream is not None
        stream.filled += nbytes
        stream.unacked += nbytes
        stream.stamp = self.server.tick
        self.buffered += nbytes
        self.frame_left -= nbytes
        # its frames are long: the next frame's head is read alone, so its payload comes here too
        into = stream.into
        self.expect = stream if into is not None and stream.filled < len(into) else None
        self._ack_connection()
        if into is not None and stream.queue is not None and stream.filled == len(into):
            self._into_done(stream)  # a streaming call's message: queued (the frame may go on)
        if not self.frame_left:
            self.frame_stream = None
            self._data_end(stream, self.frame_flags, 0)

    def _reserve(self, stream: Stream, size: int) -> bool:
        """Take a message's declared ``size`` from the server's budget; False: refused (answered)."""
        budget = self.server.budget
        if budget is None:
            return True
        if not budget.take(size):
            self._finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED, budget.refusal(size))
            return False
        stream.held = size
        return True

    def _give(self, stream: Stream) -> None:
        budget = self.server.budget
        if budget is not None:
            budget.give(stream.held)
        stream.held = 0

    def _data(self, flags: int, sid: int, payload: Piece) -> None:
        """A whole DATA frame (one that arrives in pieces: ``_frames``)."""
        size = len(payload)
        if flags == END_STREAM and 5 <= size < SMALL:
            # the common small unary request: its one message whole in its one frame, the
            # stream waiting for it. Parsed from the frame as it lies in the read (no copy into
            # the stream's buffer, no budget: under SMALL), the call started at once
            stream = self.streams.get(sid)
            if (
                stream is not None
                and stream.declared < 0
                and stream.queue is None
                and not stream.remote_closed
                and not stream.data
                and stream.task is None
                and stream.trailers is None
                and self.recv_unacked + size <= CONNECTION_WINDOW
                and stream.unacked + size <= STREAM_WINDOW
                and int.from_bytes(payload[1:5], "big") == size - 5
                and size - 5 <= self.server.max_message
            ):
                self.recv_unacked += size
                stream.unacked += size
                stream.declared = size - 5
                stream.remote_closed = True
                if self.recv_unacked >= CONNECTION_WINDOW // 2:
                    self._ack_connection()
                self._start_unary(stream, self._message(stream, payload[0], cast(memoryview, payload)[5:]))
                return
        if sid == 0:
            raise H2Error(PROTOCOL_ERROR, "DATA on stream 0")
        if flags & PADDED and (not size or payload[0] >= size):
            raise H2Error(PROTOCOL_ERROR, "bad padding")
        stream = self._data_begin(sid, size)
        if stream is None:
            return
        if flags & PADDED:
            payload = payload[1 : size - payload[0]]
        elif not size and not flags & END_STREAM:
            self._control()
        if payload:
            if not self._data_piece(stream, payload):
                return
        else:
            self._ack_connection()
        self._data_end(stream, flags, size - len(payload))

    def _data_begin(self, sid: int, size: int) -> Stream | None:
        """A DATA frame of ``size`` bytes begins: flow control, and the stream its payload goes
        to (None: it is dropped, and the stream reset where RFC 9113 says so)."""
        if sid == 0:
            raise H2Error(PROTOCOL_ERROR, "DATA on stream 0")
        self.recv_unacked += size
        if self.recv_unacked > CONNECTION_WINDOW:  # past the window this side gave (RFC 9113 6.9.1)
            raise H2Error(FLOW_CONTROL_ERROR, "DATA past the connection's flow-control window")
        stream = self.streams.get(sid)
        if stream is None or stream.remote_closed:
            self._ack_connection()
            if stream is not None:  # half-closed (remote): the client already ended it
                self._reset(stream, STREAM_CLOSED)
            elif sid > self.last_sid or sid % 2 == 0:
                raise H2Error(PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            elif sid not in self.recent_resets:  # closed, not by a reset of this side's
                self._control()
                self._reset_sid(sid, STREAM_CLOSED)
            return None  # a stream this side reset: its data is dropped
        if stream.unacked + size > STREAM_WINDOW:  # a peer ignoring the stream's window
            self._ack_connection()
            self._reset(stream, FLOW_CONTROL_ERROR)
            return None
        return stream

    def _data_piece(self, stream: Stream, piece: Piece) -> bool:
        """Payload bytes of a DATA frame for ``stream``: into its request message. False: the
        call was answered instead (or is gone), the rest of the frame is dropped."""
        if self.streams.get(stream.sid) is not stream:
            return False
        n = len(piece)
        stream.unacked += n
        stream.stamp = self.server.tick  # progress (see Http2GrpcServer.body_timeout_s)
        self.buffered += n
        into = stream.into
        if into is not None:  # a large message, into the buffer made for it
            filled = stream.filled
            room = len(into) - filled
            if n <= room:
                into[filled : filled + n] = piece
                stream.filled = filled + n
                self._ack_connection()
                if n == room and stream.queue is not None:
                    self._into_done(stream)
                    return self.streams.get(stream.sid) is stream
                return True
            if stream.queue is None:  # a unary call: more than one message
                self._ack_connection()
                self._finish(stream, grpc.StatusCode.INTERNAL, ONE_MESSAGE)
                return False
            # a streaming call: the message ends in this piece, the next one begins
            into[filled:] = piece[:room]
            stream.filled = len(into)
            self._ack_connection()
            if not self._into_done(stream) and self.streams.get(stream.sid) is not stream:
                return False
            piece = piece[room:]
        elif (
            stream.queue is None
            and stream.declared < 0
            and len(stream.data) + n >= 5
            and self._unary_prefix(stream, piece)
        ):
            return self.streams.get(stream.sid) is stream
        stream.data += piece
        self._ack_connection()
        if stream.queue is not None:
            self._split_messages(stream)
            return self.streams.get(stream.sid) is stream
        data = stream.data
        if len(data) > self.server.max_message + 5:
            self._too_large(stream, len(data) - 5)
            return False
        return True

    def _unary_prefix(self, stream: Stream, piece: Piece) -> bool:
        """The piece that completes a unary call's length prefix. True: it was taken: a large
        message's buffer made, this piece already in it (not through ``stream.data``: a copy
        less), or the call refused; False: go on with it as with any other piece."""
        data = stream.data  # (under 5 bytes: the prefix was not complete)
        declared = stream.declared = int.from_bytes((bytes(data) + bytes(piece[:5]))[1:5], "big")
        if declared > self.server.max_message:
            self._ack_connection()
            self._too_large(stream, declared)  # refused from the prefix
            return True
        if declared < SMALL or len(data) + len(piece) - 5 >= declared:
            return False
        self._ack_connection()
        return not self._reserve(stream, declared) or self._receive_into(stream, declared, piece)

    def _receive_into(self, stream: Stream, declared: int, piece: Piece = b"") -> bool:
        """A large message (its size taken from the budget): what came of it (``stream.data``
        and ``piece``) and the rest of it go into a buffer of its size (``get_buffer`` lets the
        socket write there), which it is parsed from. False: not made (``piece`` not taken)."""
        data = stream.data
        have = len(data) + len(piece)
        if have > 5 + declared:
            return False  # more than one message: refused when the call's request ends
        try:
            into = buffer(5 + declared)  # (its pages are touched as it fills)
        except MemoryError:
            return False  # read as any other message (the budget is what bounds it)
        into[: len(data)] = data
        into[len(data) : have] = piece
        stream.into = into
        stream.filled = have
        stream.data = bytearray()
        return True

    def _into_done(self, stream: Stream) -> bool:
        """A streaming call's large message is all in its own buffer: parsed from it (its raw
        contents views of it) and queued for the servicer, as ``_split_messages`` queues one.
        False: the call was answered instead (or is gone)."""
        into = stream.into
        assert into is not None and stream.queue is not None
        size = len(into)
        # parsed while still held as ``into``: a call that this ends gives its bytes back (_drop)
        message = self._message(stream, into[0], into[5:])
        if self.streams.get(stream.sid) is not stream:
            return False
        stream.into = None
        stream.filled = 0
        if self.expect is stream:
            self.expect = None
        if stream.held:
            self._give(stream)
        if message is None:  # answered (its trailers wait behind what it sent)
            self._take_data(size)
            return False
        stream.queue.put_nowait(message)
        stream.sizes.append(size)
        stream.queued += size
        return True

    def _data_end(self, stream: Stream, flags: int, padding: int) -> None:
        """The DATA frame for ``stream`` ended (``padding``: its bytes not delivered)."""
        if self.streams.get(stream.sid) is not stream:
            return
        stream.unacked += padding
        if stream.into is not None and stream.filled == len(stream.into) and self.expect is stream:
            self.expect = None  # all of it is here
        if flags & END_STREAM:
            self._remote_end(stream)
        elif stream.unacked >= STREAM_WINDOW // 4 and self._reader_keeps_up(stream):
            self._ack_stream(stream)

    def _forget_into(self, stream: Stream) -> None:
        stream.into = None
        stream.filled = 0
        if self.expect is stream:
            self.expect = None
        if self.frame_stream is stream:
            self.frame_stream = None  # the rest of a frame for it is dropped

    def _ack_connection(self) -> None:
        """Give the connection's window back, unless too much request data waits here
        undelivered (the client then stops sending until calls take their requests)."""
        if self.recv_unacked >= CONNECTION_WINDOW // 2 and self.buffered < self.server.max_buffered:
            self._write(frame(WINDOW_UPDATE, 0, 0, WINDOW.pack(self.recv_unacked)))
            self.recv_unacked = 0

    def _take_data(self, count: int) -> None:
        """``count`` request bytes held here were delivered (or dropped)."""
        self.buffered -= count
        if self.recv_unacked:
            self._ack_connection()

    @staticmethod
    def _reader_keeps_up(stream: Stream) -> bool:
        return stream.queue is None or (stream.queue.qsize() < QUEUE_AHEAD and stream.queued < STREAM_WINDOW)

    def _ack_stream(self, stream: Stream) -> None:
        self._write(frame(WINDOW_UPDATE, 0, stream.sid, WINDOW.pack(stream.unacked)))
        stream.unacked = 0

    def _split_messages(self, stream: Stream) -> None:
        """Complete messages of a streaming call into its queue."""
        data = stream.data
        queue = stream.queue
        assert queue is not None
        pos = 0
        while len(data) - pos >= 5:
            length = int.from_bytes(data[pos + 1 : pos + 5], "big")
            if length > self.server.max_message:
                self._queued(stream, pos)
                self._too_large(stream, length)  # refused from the prefix
                return
            if len(data) - pos - 5 < length:
                if length >= SMALL and not stream.held and not self._reserve(stream, length):
                    self._queued(stream, pos)
                    return
                if length >= SMALL:  # the rest of it straight into its own buffer
                    self._queued(stream, pos)
                    self._receive_into(stream, length)
                    return
                break
            message = self._message(stream, data[pos], bytes(memoryview(data)[pos + 5 : pos + 5 + length]))
            if stream.held:
                self._give(stream)
            if message is None:  # answered instead (a stream it forgot has given back its bytes)
                if stream.sid in self.streams:
                    self._take_data(5 + length)
                    del data[pos : pos + 5 + length]
                    self._queued(stream, pos)
                return
            queue.put_nowait(message)
            stream.sizes.append(5 + length)
            pos += 5 + length
        self._queued(stream, pos)

    @staticmethod
    def _queued(stream: Stream, count: int) -> None:
        """The first ``count`` bytes of ``stream.data`` went into its queue as messages: they stay
        counted in the connection's undelivered bytes until the servicer reads them."""
        if count:
            del stream.data[:count]
            stream.queued += count

    def _message(self, stream: Stream, compressed: int, body: bytes | memoryview) -> Any | None:
        """A request message parsed (a :class:`Later` when it inflates past ``INFLATE_INLINE``
        bytes: the rest in a thread), or None when the call was answered instead. A compressed
        one inflates within ``flowserve.dataplane.inflate``'s bounds (the message limit,
        ``RATIO`` times its size, the server's budget: RESOURCE_EXHAUSTED naming the bound)."""
        inflater = None
        try:
            if compressed:
                wbits = ENCODINGS[stream.encoding]
                if wbits is not None:
                    server = self.server
                    limit, budget = server.max_message, server.budget
                    inflater = Inflater(bytes(body), wbits, limit, budget, "request message")
                    out = inflate_inline(inflater, INFLATE_INLINE)
                    if out is None:
                        later, inflater = self._inflate_later(stream, inflater), None
                        return later
                    body = out
            if len(body) > PARSE_INLINE:
                inline = stream.method.inline
                if inline is None or not inline(body):
                    return self._parse_later(stream, body)
            return stream.method.parse(body)
        except ResourceExhausted as exc:  # too large, over budget, too many fields (fields.py)
            self._finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message)
            return None
        except (DecodeError, Corrupt) as exc:
            self._finish(stream, grpc.StatusCode.INTERNAL, f"Failed to parse the request message: {exc}")
            return None
        finally:
            if inflater is not None:
                inflater.release()

    def _inflate_later(self, stream: Stream, inflater: Inflater) -> Later:
        """Inflate the rest of a message in a thread."""
        parse = stream.method.parse
        return self._later(stream, lambda: inflate_rest(inflater, parse), inflater.release)

    def _parse_later(self, stream: Stream, body: bytes | memoryview) -> Later:
        """Parse a large message in a thread. protobuf holds the GIL while it parses (tens of
        nanoseconds a field), so what keeps the loop free is the bound on fields that an
        inference method's parse checks first, in Python, which lets the GIL go (fields.py)."""
        parse = stream.method.parse

        async def parsed() -> Any:
            try:
                return await asyncio.to_thread(parse, body)
            except ResourceExhausted as exc:  # e.g. fields.TooManyFields
                raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message) from None
            except DecodeError as exc:
                message = f"Failed to parse the request message: {exc}"
                raise Refused(grpc.StatusCode.INTERNAL, message) from None

        return self._later(stream, parsed)

    def _later(
        self, stream: Stream, work: Callable[[], Awaitable[Any]], release: Callable[[], None] | None = None
    ) -> Later:
        """The call's request, made off the loop by ``work``; ``release`` and the request budget
        the message holds go back when it ends, however (also when cancelled before it began)."""
        held, stream.held = stream.held, 0

        async def run() -> Any:
            try:
                return await work()
            finally:
                if release is not None:
                    release()
                if held:
                    budget = self.server.budget
                    assert budget is not None
                    budget.give(held)

        task = self.loop.create_task(run())
        task.add_done_callback(retrieved)
        return Later(task)

    def _too_large(self, stream: Stream, size: int | None) -> None:
        """Refuse a message over the limit (``size`` None: it inflates past it)."""
        limit = self.server.max_message
        detail = f"{size} vs. {limit}" if size is not None else f"more than {limit} bytes inflated"
        message = f"Received message larger than max ({detail})"
        self._finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    def _remote_end(self, stream: Stream) -> None:
        if stream.remote_closed:
            return
        stream.remote_closed = True
        if stream.queue is not None:
            if stream.data or stream.into is not None:
                self._finish(stream, grpc.StatusCode.INTERNAL, "truncated request message")
            stream.queue.put_nowait(EOF)
            return
        if stream.task is not None or stream.trailers is not None:
            return  # already running or answered: its end is this side's to send
        into = stream.into
        if into is not None:  # a large message, read into its own buffer
            if stream.filled != len(into):
                self._finish(stream, grpc.StatusCode.INTERNAL, ONE_MESSAGE)
                return
            self._forget_into(stream)
            self._take_data(len(into))
            request = self._message(stream, into[0], into[5:])
        else:
            data = stream.data
            if len(data) < 5 or stream.declared != len(data) - 5:
                self._finish(stream, grpc.StatusCode.INTERNAL, ONE_MESSAGE)
                return
            stream.data = bytearray()
            self._take_data(len(data))
            # the message parsed from the stream's own buffer (a view: the stream has a new one)
            request = self._message(stream, data[0], memoryview(data)[5:])
        if stream.held:
            self._give(stream)
        self._start_unary(stream, request)
