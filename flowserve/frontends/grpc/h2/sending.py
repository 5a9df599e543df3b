"""The send side of a connection: response messages queued per stream, DATA frames sent as
the peer's flow-control windows allow, WINDOW_UPDATEs from the peer, frames batched into
one transport write per loop iteration, and the server-wide budget of unsent response bytes
(``Http2GrpcServer.unsent``)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc

from flowserve.frontends.grpc.h2.calls import Piece, Scattered, Stream
from flowserve.frontends.grpc.h2.compression import COMPRESS_FROM
from flowserve.frontends.grpc.h2.frames import (
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_HEAD,
    FRAME_SIZE_ERROR,
    HEADERS,
    MAX_WINDOW,
    PROTOCOL_ERROR,
    WINDOW,
    H2Error,
    frame,
)
from flowserve.frontends.grpc.h2.headers import RESPONSE_HEADERS, literal, status_block
from flowserve.frontends.grpc.h2.limits import (
    CONN_SEND_AHEAD,
    CONN_SEND_HARD,
    CREDITED_FLUSH,
    JOIN_BELOW,
    MAX_PENDING_OUT,
    MAX_WRITE_BUFFER,
    SCATTER_FROM,
)

if TYPE_CHECKING:
    from flowserve.frontends.grpc.h2.server import Http2GrpcServer


class Sender:
    """The send side of :class:`~flowserve.frontends.grpc.h2.connection.Connection` (its base)."""

    server: Http2GrpcServer
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport | None
    streams: dict[int, Stream]
    blocked: dict[int, Stream]
    send_window: int
    peer_max_frame: int
    out_blocked: int
    unblocked: asyncio.Future[None] | None
    pending: list[Piece]
    pending_size: int
    flush_scheduled: bool
    stalled: bool
    dead: bool
    last_sid: int
    flushes: int
    unsent_held: int
    socket_held: int

    def _abort_connection(self, code: int, message: str, detail: str = "") -> None:
        raise NotImplementedError

    def _close(self, stream: Stream) -> None:
        raise NotImplementedError

    def _reset(self, stream: Stream, code: int) -> None:
        raise NotImplementedError

    def _control(self) -> None:
        raise NotImplementedError

    def held_unsent(self) -> int:
        """Bytes of the server's budget of unsent response bytes this connection holds."""
        return self.unsent_held + self.socket_held

    def _charge(self, stream: Stream) -> bool:
        """Take from (or give back to) the server's budget of unsent response bytes what a
        stream's queue grew (or shrank) by. When it does not fit, the connections holding the
        most are shed (``Http2GrpcServer.shed``, this one included when it is the largest);
        when it still does not fit, the call ends RESOURCE_EXHAUSTED. False: the stream (or
        this connection) was ended."""
        budget = self.server.unsent
        if budget is None:
            return True
        more = len(stream.out) - stream.charged
        if more > 0 and not budget.take(more):
            if not self.server.shed(more) or self.dead or stream.sid not in self.streams:
                if not self.dead and stream.sid in self.streams:
                    self._end_unsent(stream, self.server.unsent_refusal(more))
                return False
            if not budget.take(more):  # pragma: no cover - shed() made room for it
                return False
        elif more < 0:
            budget.give(-more)
        stream.charged += more
        self.unsent_held += more
        return True

    def _end_unsent(self, stream: Stream, why: str) -> None:
        """End a call whose answers wait for its client now, RESOURCE_EXHAUSTED: what it had
        queued is dropped (its trailers, even OK ones, were waiting behind it)."""
        self._unqueue(stream)
        stream.trailers = None
        self._finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED, why)

    def _uncharge(self, stream: Stream) -> None:
        """A stream's queue is empty (sent, or forgotten): its share of the budget goes back."""
        budget = self.server.unsent
        if budget is not None:
            budget.give(stream.charged)
        self.unsent_held -= stream.charged
        stream.charged = 0

    def _socket_charge(self, size: int) -> bool:
        """The transport's buffer holds ``size`` bytes the peer has not read: the budget of unsent
        bytes holds as much for it (shedding as ``_charge`` does); False: it does not fit, and
        this connection is ended."""
        budget = self.server.unsent
        more = size - self.socket_held
        if budget is None or not more:
            return True
        if more > 0 and not budget.take(more):
            if not self.server.shed(more) or self.dead or not budget.take(more):
                if not self.dead:
                    self._abort_connection(ENHANCE_YOUR_CALM, self.server.unsent_refusal(more))
                return False
        elif more < 0:
            budget.give(-more)
        self.socket_held = size
        return True

    def shed(self, why: str) -> None:
        """End this connection to give back what it holds of the budget of unsent bytes: the
        calls whose answers wait for the peer's windows end RESOURCE_EXHAUSTED (trailers need
        no window), then GOAWAY ENHANCE_YOUR_CALM and close."""
        for stream in list(self.blocked.values()):
            if stream.sid in self.streams:
                self._end_unsent(stream, why)
        self._abort_connection(ENHANCE_YOUR_CALM, why)
        self._socket_charge(0)  # closed: its buffer goes when the transport does

    def _send(self, stream: Stream, message: bytes, trailers: bytes | None) -> None:
        """One response message, then (if given) the trailers ending the call."""
        n = len(message)
        size = n + 5
        if (
            size < SCATTER_FROM
            and not stream.out.size
            and stream.reply_encoding is None
            and size <= stream.send_window
            and size <= self.send_window
            and size <= self.peer_max_frame
        ):
            # the common small answer: nothing queued before it and the windows have room, so
            # it leaves at once as one DATA frame, in one write with its HEADERS and trailers
            sid = stream.sid
            stream.send_window -= size
            self.send_window -= size
            self.flushes += 1  # earns the WINDOW_UPDATEs that answer it
            data = FRAME_HEAD.pack(0, size, DATA, 0, sid) + b"\x00" + n.to_bytes(4, "big") + message
            if not stream.headers_sent:
                stream.headers_sent = True
                data = frame(HEADERS, END_HEADERS, sid, RESPONSE_HEADERS) + data
            if trailers is None:
                self._write(data)
                return
            stream.trailers = trailers
            self._write(data + frame(HEADERS, END_HEADERS | END_STREAM, sid, trailers))
            self._close(stream)
            return
        flag = b"\x00"
        coding = self._response_headers(stream)
        compression = self.server.compression
        if coding is not None and compression is not None and len(message) >= COMPRESS_FROM:
            message = compression.compress(message, coding)
            flag = b"\x01"
        n = len(message)
        if n < SCATTER_FROM:  # copied once, with its prefix: one piece
            stream.out.add(flag + n.to_bytes(4, "big") + message)
        else:  # queued as it is
            stream.out.add(flag + n.to_bytes(4, "big"))
            stream.out.add(message)
        self.out_blocked += n + 5
        if trailers is not None:
            stream.trailers = trailers
        self._flush(stream)

    def _send_parts(self, stream: Stream, response: Scattered, trailers: bytes | None) -> None:
        """:meth:`_send` for a message given as pieces (``Scattered``): queued and written as
        they are, never joined (unless the response is to be compressed)."""
        parts, n = response.wire_parts()
        coding = stream.reply_encoding
        if coding is not None and self.server.compression is not None and n >= COMPRESS_FROM:
            self._send(stream, b"".join(parts), trailers)
            return
        self._response_headers(stream)
        out = stream.out
        out.add(b"\x00" + n.to_bytes(4, "big"))
        for part in parts:
            out.add(part)
        self.out_blocked += n + 5
        if trailers is not None:
            stream.trailers = trailers
        self._flush(stream)

    def _response_headers(self, stream: Stream) -> bytes | None:
        """Write the response's HEADERS unless sent; the response's encoding (None: identity)."""
        coding = stream.reply_encoding
        if not stream.headers_sent:
            stream.headers_sent = True
            head = (
                RESPONSE_HEADERS if coding is None else RESPONSE_HEADERS + literal(b"grpc-encoding", coding)
            )
            self._write(frame(HEADERS, END_HEADERS, stream.sid, head))
        return coding

    def _finish(self, stream: Stream, code: grpc.StatusCode, message: str | None) -> None:
        """End the call with a status (trailers-only when nothing was sent yet)."""
        if stream.sid not in self.streams or stream.trailers is not None:
            return
        if stream.task is not None and stream.task is not asyncio.current_task():
            stream.task.cancel()
        block = status_block(code, message)
        if not stream.headers_sent:
            stream.headers_sent = True
            if stream.out.size:
                self._unqueue(stream)
            stream.trailers = b""
            self._write(frame(HEADERS, END_HEADERS | END_STREAM, stream.sid, RESPONSE_HEADERS + block))
            self._close(stream)
            return
        stream.trailers = block
        self._flush(stream)

    def _flush(self, stream: Stream) -> None:
        out = stream.out
        if out:
            room = min(stream.send_window, self.send_window, len(out))
            if room > 0:
                frames = _data_frames(out.take(room), room, self.peer_max_frame, stream.sid)
                stream.send_window -= room
                self.send_window -= room
                self.out_blocked -= room
                if room >= CREDITED_FLUSH or not out:
                    self.flushes += 1  # earns the WINDOW_UPDATEs that answer it
                if self.unblocked is not None:
                    self._less_blocked()
                self._write_all(frames, room + 9 * ((room - 1) // self.peer_max_frame + 1))
            if out:
                self.blocked[stream.sid] = stream
                if len(out) != stream.charged and not self._charge(stream):
                    return  # answered RESOURCE_EXHAUSTED, or the connection was ended
                if self.out_blocked > CONN_SEND_HARD and len(self.blocked) > 1:
                    self._abort_connection(
                        ENHANCE_YOUR_CALM, f"over {CONN_SEND_HARD} response bytes wait for the peer's windows"
                    )
                return
            self.blocked.pop(stream.sid, None)
            if stream.charged:
                self._uncharge(stream)
            self._wake(stream)
        if stream.trailers is not None:
            self._write(frame(HEADERS, END_HEADERS | END_STREAM, stream.sid, stream.trailers))
            self._close(stream)

    def _unqueue(self, stream: Stream) -> None:
        """Forget the responses a stream had waiting to be sent."""
        self.out_blocked -= len(stream.out)
        stream.out.clear()
        if stream.charged:
            self._uncharge(stream)
        if self.unblocked is not None:
            self._less_blocked()

    def _less_blocked(self) -> None:
        unblocked = self.unblocked
        if unblocked is not None and self.out_blocked <= CONN_SEND_AHEAD:
            self.unblocked = None
            if not unblocked.done():
                unblocked.set_result(None)

    def _wake(self, stream: Stream) -> None:
        if stream.drained is not None and not stream.drained.done():
            stream.drained.set_result(None)

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        self._control()
        increment = WINDOW.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if not increment:
                raise H2Error(PROTOCOL_ERROR, "WINDOW_UPDATE of 0 on the connection")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise H2Error(FLOW_CONTROL_ERROR, "connection window overflow")
            self._flush_blocked()
            return
        target = self.streams.get(sid)
        if target is None:
            if sid > self.last_sid:
                raise H2Error(PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
            return  # a closed stream: allowed, and nothing to do
        if not increment:
            self._reset(target, PROTOCOL_ERROR)
            return
        target.send_window += increment
        if target.send_window > MAX_WINDOW:
            self._reset(target, FLOW_CONTROL_ERROR)
            return
        if target.out:
            self._flush(target)

    def _flush_blocked(self) -> None:
        """Send what streams had waiting for the peer's windows, oldest first."""
        for stream in list(self.blocked.values()):
            self._flush(stream)
            if self.send_window <= 0 or self.dead:
                break

    def _write(self, data: Piece) -> None:
        """Queue bytes for the socket; everything queued in one loop iteration leaves in one
        write (or sooner, past ``MAX_PENDING_OUT``, so that the transport's high-water mark
        pauses reading)."""
        self.pending.append(data)
        self.pending_size += len(data)
        if self.pending_size > MAX_PENDING_OUT:
            self._write_pending()
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._write_pending)

    def _write_all(self, pieces: list[Piece], size: int) -> None:
        """:meth:`_write` for pieces of ``size`` bytes in all."""
        if len(pieces) == 1:
            self._write(pieces[0])
            return
        self.pending += pieces
        self.pending_size += size
        if self.pending_size > MAX_PENDING_OUT:
            self._write_pending()
        elif not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._write_pending)

    def _write_pending(self) -> None:
        """One write of what is pending: joined when it is small (one buffer, one copy of little),
        else a vectored write of the pieces as they are (``writelines``: uvloop's ``writev``)."""
        self.flush_scheduled = False
        transport = self.transport
        if self.pending and transport is not None and not transport.is_closing():
            pending = self.pending
            if len(pending) == 1:
                transport.write(pending[0])
            elif self.pending_size < JOIN_BELOW:
                transport.write(b"".join(pending))
            else:
                transport.writelines(pending)
            if self.stalled and not self.dead:
                size = transport.get_write_buffer_size()
                if size > MAX_WRITE_BUFFER:
                    self.pending.clear()
                    self.pending_size = 0
                    self._abort_connection(ENHANCE_YOUR_CALM, "the peer does not read")
                    return
                self.pending.clear()
                self.pending_size = 0
                self._socket_charge(size)
                return
        self.pending.clear()
        self.pending_size = 0


def _data_frames(pieces: list[Piece], room: int, max_frame: int, sid: int) -> list[Piece]:
    """``room`` bytes of response (``pieces``) as DATA frames of at most ``max_frame`` bytes: a
    frame's head, then the pieces (or views of them) it carries, never copied; a small single
    piece is framed in one ``bytes``."""
    if room <= max_frame and (len(pieces) == 1 and room < SCATTER_FROM):
        return [FRAME_HEAD.pack(room >> 16, room & 0xFFFF, DATA, 0, sid) + pieces[0]]
    frames: list[Piece] = []
    left = 0  # bytes the current frame still carries
    for piece in pieces:
        view: Piece = piece
        while len(view):
            if not left:
                left = min(max_frame, room)
                room -= left
                frames.append(FRAME_HEAD.pack(left >> 16, left & 0xFFFF, DATA, 0, sid))
            n = len(view)
            if n <= left:
                frames.append(view)
                left -= n
                break
            if not isinstance(view, memoryview):
                view = memoryview(view)
            frames.append(view[:left])
            view = view[left:]
            left = 0
    return frames
