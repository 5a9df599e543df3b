"""One HTTP/2 connection (``asyncio.BufferedProtocol``): the transport's callbacks and its
reads, frames in (dispatch, control frames, SETTINGS, stream resets), header blocks and the
calls they open or refuse, the per-connection budgets, timers, eviction, connection errors and
graceful stop. Its bases hold the other concerns, each over the one before:
:class:`~flowserve.frontends.grpc.h2.sending.Sender` (the send side),
:class:`~flowserve.frontends.grpc.h2.receiving.Receiver` (request data, its flow control and
the request messages) and :class:`~flowserve.frontends.grpc.h2.running.CallRunner` (the calls
run). One class at run time, so a method costs what it did when all of it was one module."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

import grpc
import hpack

from flowserve.frontends.grpc.h2.calls import (
    UNKNOWN,
    Method,
    Piece,
    Stream,
)
from flowserve.frontends.grpc.h2.compression import ENCODINGS
from flowserve.frontends.grpc.h2.frames import (
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    ERROR_NAMES,
    FLOW_CONTROL_ERROR,
    FRAME_HEAD,
    FRAME_SIZE_ERROR,
    GOAWAY,
    GOAWAY_BODY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    INTERNAL_ERROR,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    MAX_HEADER_LIST_SIZE,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTING,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW,
    WINDOW_UPDATE,
    H2Error,
    frame,
)
from flowserve.frontends.grpc.h2.headers import (
    STATUS_415,
    decode_headers,
    grpc_peer,
    header_fields,
    shown,
)
from flowserve.frontends.grpc.h2.limits import (
    CLOSE_GRACE_S,
    CONN_SEND_AHEAD,
    CONNECTION_WINDOW,
    CONTROL_BURST,
    CONTROL_RATE,
    CONTROLS_PER_FLUSH,
    CONTROLS_PER_STREAM,
    DEFAULT_WINDOW,
    FRAMES_PER_TURN,
    HEADER_BYTES_PER_FRAME,
    HEADER_BYTES_PER_TOKEN,
    HEADER_FIELDS_PER_TOKEN,
    MAX_CONTINUATIONS,
    MAX_FRAME_IN,
    MAX_HEADER_BLOCK,
    MAX_HEADER_FIELDS,
    MAX_HEADER_LIST,
    MAX_HEADERS_HELD,
    MAX_STALLED_IN,
    MAX_STREAMS,
    READ_BUFFER,
    RECENT_RESETS,
    RESET_BURST,
    RESET_RATE,
    SINK_FROM,
    STREAM_WINDOW,
    TokenBucket,
)
from flowserve.frontends.grpc.h2.running import CallRunner

if TYPE_CHECKING:
    from flowserve.frontends.grpc.h2.server import Http2GrpcServer

log = logging.getLogger("flowserve.grpc")


class Connection(CallRunner, asyncio.BufferedProtocol):
    def __init__(self, server: Http2GrpcServer) -> None:
        self.server = server
        self.methods = server.methods
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.client = ""  # the client's address, as CallContext.peer() gives it
        self.buf = bytearray()  # bytes read and not yet handled (a frame's start, when a read ends in it)
        # a DATA frame whose payload is still arriving (read in pieces, each handed on as it comes):
        # its payload bytes still to come, its flags, and its stream (None: the rest is dropped)
        self.frame_left = 0
        self.frame_flags = 0
        self.frame_stream: Stream | None = None
        # the stream whose request message is being read straight into its buffer (``get_buffer``
        # gives the socket a view of it) while more of it is to come (set once a long frame of it
        # was read so), and whether the last read went there
        self.expect: Stream | None = None
        self.sinking = False
        self.preface = False
        self.decoder = hpack.Decoder(max_header_list_size=2 * MAX_HEADER_LIST)
        self.streams: dict[int, Stream] = {}
        self.last_sid = 0
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16_384
        self.recv_unacked = 0
        self.buffered = 0  # request bytes received, not yet delivered to a call
        self.continuing: tuple[int, int, bytearray] | None = None  # (sid, flags, block so far)
        self.continuations = 0  # CONTINUATION frames of the block in ``continuing``
        self.blocked: dict[int, Stream] = {}
        self.out_blocked = 0  # response bytes of all streams waiting for the peer's windows
        self.unblocked: asyncio.Future[None] | None = None  # streaming senders waiting on it
        self.header_bytes = 0  # decoded header bytes of the open streams
        self.pending: list[Piece] = []
        self.pending_size = 0
        self.flush_scheduled = False
        self.paused: asyncio.Future[None] | None = None
        self.stalled = False  # reading paused until the peer reads what was written
        self.deferred = False  # frames read wait for the loop's next turn
        self.reading_paused = False
        self.closing = False  # GOAWAY sent: no new streams
        self.dead = False  # a connection error was sent: nothing more is read
        self.idle: asyncio.Future[None] | None = None
        self.admitted = False  # holds a slot of the server's ConnectionGuard
        # (the loop's clock) when it last had a call: opened, or the last one ended; frames that
        # carry no call (PING, WINDOW_UPDATE, SETTINGS...) do not count (see idle_since)
        self.idle_at = 0.0
        self.handshake_timer: asyncio.TimerHandle | None = None
        self.idle_timer: asyncio.TimerHandle | None = None
        self.controls = TokenBucket(CONTROL_BURST, CONTROL_RATE, "too many control frames")
        self.resets = TokenBucket(RESET_BURST, RESET_RATE, "too many streams reset")
        # control frames earned by calls (CONTROLS_PER_STREAM): streams opened and response
        # sends so far, the part of them already turned into ``free`` control frames, and the
        # SETTINGS frames of this side the peer has yet to acknowledge (its ACKs are free)
        self.opened = self.flushes = 0
        self.credited_opened = self.credited_flushes = 0
        self.free = 0
        self.settings_unacked = 0
        self.peer = "?"  # the client's address, for the log
        # bytes taken from the server's budget of unsent response bytes (Http2GrpcServer.unsent):
        # by the streams' queues waiting for windows, and by the transport's buffer while the
        # peer does not read it
        self.unsent_held = self.socket_held = 0
        self.recent_resets = [0] * RECENT_RESETS  # stream ids this side reset, a ring
        self.recent_pos = 0

    # ---------------------------------------------------------------- transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peername = self.transport.get_extra_info("peername")
        if isinstance(peername, tuple) and len(peername) >= 2:
            self.peer = f"{peername[0]}:{peername[1]}"
        self.idle_at = self.loop.time()
        guard = self.server.guard
        if guard is not None and not guard.admit(self, peername[0] if isinstance(peername, tuple) else None):
            self.transport.abort()  # counted and logged by the guard
            return
        self.admitted = guard is not None
        self.server.connections.add(self)
        self.client = grpc_peer(self.transport.get_extra_info("peername"))
        now = self.loop.time()
        self.controls.at = self.resets.at = now
        server = self.server
        if server.handshake_timeout_s:
            self.handshake_timer = self.loop.call_later(server.handshake_timeout_s, self._handshake_expired)
        if server.idle_timeout_s:
            self.idle_timer = self.loop.call_later(server.idle_timeout_s, self._idle_check)
        settings = b"".join(
            SETTING.pack(k, v)
            for k, v in (
                (ENABLE_PUSH, 0),
                (MAX_CONCURRENT_STREAMS, MAX_STREAMS),
                (INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (MAX_FRAME_SIZE, MAX_FRAME_IN),
                (MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
            )
        )
        self.settings_unacked = 1
        self.transport.write(
            frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, WINDOW.pack(CONNECTION_WINDOW - DEFAULT_WINDOW))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = True
        self.server.connections.discard(self)
        if self.admitted:
            self.admitted = False
            guard = self.server.guard
            assert guard is not None
            guard.release(self)  # (nothing when it was evicted)
        for timer in (self.handshake_timer, self.idle_timer):
            if timer is not None:
                timer.cancel()
        self.handshake_timer = self.idle_timer = None
        for stream in self.streams.values():
            if stream.task is not None:
                stream.task.cancel()
            if stream.held:
                self._give(stream)
            if stream.charged:
                self._uncharge(stream)
            self._wake(stream)
        self._socket_charge(0)
        self.streams.clear()
        self.frame_stream = self.expect = None
        self.frame_left = 0
        self.blocked.clear()
        self.out_blocked = self.header_bytes = 0
        self.buf.clear()
        self.pending.clear()
        for future in (self.paused, self.idle, self.unblocked):
            if future is not None and not future.done():
                future.set_result(None)

    def pause_writing(self) -> None:
        if self.paused is None or self.paused.done():
            self.paused = self.loop.create_future()
        if not self.stalled:
            self.stalled = True  # the peer does not keep up: read nothing more from it for now
            self._set_reading()

    def resume_writing(self) -> None:
        if self.paused is not None and not self.paused.done():
            self.paused.set_result(None)
        if self.socket_held:
            self._socket_charge(0)  # the peer read (the buffer is under its low-water mark)
        if self.stalled:
            self.stalled = False
            self._set_reading()
            if self.buf and not self.deferred:
                self.loop.call_soon(self._resume)

    def _set_reading(self) -> None:
        """Read from the socket unless the peer does not read (``stalled``) or frames already
        read wait for the loop's next turn (``deferred``)."""
        paused = self.stalled or self.deferred
        transport = self.transport
        if (
            paused != self.reading_paused
            and transport is not None
            and not transport.is_closing()
            and not self.dead
        ):
            self.reading_paused = paused
            if paused:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the transport reads the next bytes into: straight into the buffer of a large
        request message while a long DATA frame of it is arriving (no copy at all: the kernel
        writes the payload where the message is parsed from), else the server's read buffer
        (``buffer_updated`` hands it on before the next read). Between two long frames of such a
        message only the next frame's head is read, so that its payload goes to the message too."""
        stream = self.frame_stream
        left = self.frame_left
        # a frame being sunk is sunk to its end, however little of it is left (read through the
        # read buffer, its tail would bring the next frame's head and up to READ_BUFFER bytes of
        # that frame's payload with it, copied from there)
        if stream is not None and (left >= SINK_FROM or self.sinking) and not self.buf:
            into = stream.into
            if into is not None:
                room = min(left, len(into) - stream.filled)
                if room >= SINK_FROM or (self.sinking and room == left):
                    self.sinking = True
                    return into[stream.filled : stream.filled + room]
        self.sinking = False
        if self.expect is not None and not left:
            # no more than the next frame's head; or, a frame of another kind having come
            # between (a WINDOW_UPDATE, a PING), no more than the rest of it
            buf = self.buf
            if not buf:
                return self.server.read_head
            need = 9 - len(buf) if len(buf) < 9 else 9 + int.from_bytes(buf[:3], "big") - len(buf)
            if 0 < need <= READ_BUFFER:
                return self.server.read_buffer[:need]
        return self.server.read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self.dead:
            return
        if self.sinking:
            self._sunk(nbytes)
            return
        view = self.server.read_buffer[:nbytes]
        buf = self.buf
        if buf or not self.preface or self.stalled or self.deferred:
            buf += view  # (the rare case: a frame's head or a control frame cut by a read)
            if self.stalled or self.deferred:  # a TLS transport may deliver what it had decrypted
                if len(buf) > MAX_STALLED_IN:
                    self._abort_connection(ENHANCE_YOUR_CALM, "the peer sends and does not read")
                return
            self._process()
            return
        try:
            pos = self._frames(view, 0, nbytes, False)
        except H2Error as exc:
            self._abort_connection(exc.code, str(exc))
            return
        except Exception as exc:  # a bug: one line, and the connection ends cleanly
            self._abort_connection(
                INTERNAL_ERROR, "internal error", f"{type(exc).__name__} handling a frame: {exc}"
            )
            return
        if pos < nbytes and not self.dead:
            buf += view[pos:]  # the start of a frame, or what waits for the next turn

    def _resume(self) -> None:
        if not (self.dead or self.stalled or self.deferred):
            self._process()

    def _next_turn(self) -> None:
        """Go on with the frames left in ``buf`` (other connections had their turn)."""
        self.deferred = False
        if not (self.dead or self.stalled):
            self._process()
        if not self.deferred:
            self._set_reading()

    def _process(self) -> None:
        """Handle the complete frames in ``buf`` (until reading is paused)."""
        buf = self.buf
        pos = 0
        try:
            if not self.preface:
                if len(buf) < len(PREFACE) + 9:  # the preface, and the head of the first frame
                    if not (PREFACE.startswith(bytes(buf)) or bytes(buf).startswith(PREFACE)):
                        self._abort_connection(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if not buf.startswith(PREFACE):
                    self._abort_connection(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    return
                if buf[len(PREFACE) + 3] != SETTINGS or buf[len(PREFACE) + 4] & ACK:
                    raise H2Error(PROTOCOL_ERROR, "the first frame is not SETTINGS")
                self.preface = True
                pos = len(PREFACE)
            pos = self._frames(buf, pos, len(buf), True)
        except H2Error as exc:
            self._abort_connection(exc.code, str(exc))
            return
        except Exception as exc:  # a bug: one line, and the connection ends cleanly
            self._abort_connection(
                INTERNAL_ERROR, "internal error", f"{type(exc).__name__} handling a frame: {exc}"
            )
            return
        if not self.dead:
            del buf[:pos]

    def _frames(self, data: bytearray | memoryview, pos: int, end: int, copy: bool) -> int:
        """Handle the frames in ``data[pos:end]`` until reading is paused (or the loop's other
        connections get their turn); returns where it stopped. A DATA frame is handed on as its
        payload arrives (a long one need not be read whole first); a frame of another kind waits
        until it is complete. ``copy``: ``data`` is ``buf`` (which is resized after this):
        payloads are handed on as copies, else as views of ``data``."""
        count = 0
        while True:
            left = self.frame_left
            if left:  # the rest of a DATA frame's payload
                n = min(left, end - pos)
                if not n:
                    break
                stream = self.frame_stream
                if stream is not None:
                    piece: Piece = bytes(memoryview(data)[pos : pos + n]) if copy else data[pos : pos + n]
                    if not self._data_piece(stream, piece):
                        self.frame_stream = stream = None
                pos += n
                self.frame_left = left = left - n
                if left:
                    break
                if stream is not None:
                    self.frame_stream = None
                    self._data_end(stream, self.frame_flags, 0)
                    if self.stalled or self.dead:
                        break
                count += 1
                continue
            if end - pos < 9:
                break
            hi, lo, ftype, flags, sid = FRAME_HEAD.unpack_from(data, pos)
            length = (hi << 16) | lo
            if length > MAX_FRAME_IN:
                raise H2Error(FRAME_SIZE_ERROR, f"frame of {length} bytes")
            stop = pos + 9 + length
            if stop > end:
                if ftype != DATA or flags & PADDED:
                    break  # handled once it is all here
                pos += 9  # a DATA frame, in pieces as they arrive
                if self.continuing is not None:
                    raise H2Error(PROTOCOL_ERROR, "expected CONTINUATION")
                self.frame_stream = self._data_begin(sid & 0x7FFFFFFF, length)
                self.frame_left = length
                self.frame_flags = flags
                continue
            if ftype == DATA and not copy:  # its payload a view of the read buffer
                if self.continuing is not None:
                    raise H2Error(PROTOCOL_ERROR, "expected CONTINUATION")
                self._data(flags, sid & 0x7FFFFFFF, data[pos + 9 : stop])
            else:
                self._frame(ftype, flags, sid & 0x7FFFFFFF, bytes(memoryview(data)[pos + 9 : stop]))
            pos = stop
            if self.stalled or self.dead:
                break
            count += 1
            if length > 64 and ftype in (HEADERS, CONTINUATION):
                count += length // HEADER_BYTES_PER_FRAME
            if count >= FRAMES_PER_TURN and end - pos >= 9:
                # the loop's other connections first: the rest waits for the next turn
                self.deferred = True
                self._set_reading()
                self.loop.call_soon(self._next_turn)
                break
        return pos

    # ---------------------------------------------------------------- timers

    def _handshake_expired(self) -> None:
        self.handshake_timer = None
        if not self.dead:
            self._abort_connection(PROTOCOL_ERROR, "no connection preface and SETTINGS in time")

    def _idle_check(self) -> None:
        """No call for ``idle_timeout_s`` (keep-alive PINGs do not count): GOAWAY NO_ERROR."""
        self.idle_timer = None
        if self.dead or self.transport is None:
            return
        timeout = self.server.idle_timeout_s
        left = timeout if self.streams else self.idle_at + timeout - self.loop.time()
        if left > 0:
            self.idle_timer = self.loop.call_later(left, self._idle_check)
            return
        self._abort_connection(NO_ERROR, f"no call for {timeout:g} s")

    def expire_bodies(self, tick: int) -> None:
        """End the calls whose request message made no progress since body tick ``tick - 3``
        (between 1 and 1.5 body timeouts): a unary call still waiting for its message (or its
        end), a streaming call with a message begun and not finished (one waiting between
        messages is not waiting for a body). DEADLINE_EXCEEDED, and what they held goes back.
        Not while this side holds the client back (a window withheld: its reader lags)."""
        if self.buffered >= self.server.max_buffered:
            return
        for stream in list(self.streams.values()):
            if tick - stream.stamp < 3 or stream.remote_closed or stream.trailers is not None:
                continue
            if stream.queue is None:
                waiting = stream.task is None
            else:
                waiting = (bool(stream.data) or stream.into is not None) and self._reader_keeps_up(stream)
            if waiting:
                timeout = self.server.body_timeout_s
                message = f"the request message made no progress for {timeout:g} s (--grpc-body-timeout-secs)"
                self._finish(stream, grpc.StatusCode.DEADLINE_EXCEEDED, message)

    # ---------------------------------------------------------------- eviction (guard.Tracked)

    def idle_since(self) -> float | None:
        """When (the loop's clock, which is the guard's ``time.monotonic``) this connection last
        had a call; None while one is open (it is never evicted then)."""
        return None if self.streams else self.idle_at

    def evict(self) -> None:
        """Make room for a new connection (the guard chose this one, idle the longest): GOAWAY
        NO_ERROR (clients reconnect when they have a call to make), then close."""
        self.admitted = False  # the guard already took its slot back
        self._abort_connection(NO_ERROR, "evicted: the listener was full, and it idle the longest")

    # ---------------------------------------------------------------- budgets

    def _control(self) -> None:
        """A control frame: free while the connection's calls have earned it (a well-behaved
        client's WINDOW_UPDATEs and PINGs, see ``CONTROLS_PER_STREAM``), else one token of the
        connection's bucket."""
        if self.free > 0:
            self.free -= 1
            return
        earned = (self.opened - self.credited_opened) * CONTROLS_PER_STREAM + (
            self.flushes - self.credited_flushes
        ) * CONTROLS_PER_FLUSH
        if earned:
            self.credited_opened = self.opened
            self.credited_flushes = self.flushes
            self.free = min(earned, CONTROL_BURST) - 1
            return
        self.controls.take(self.loop)

    def _reset_charge(self, cost: int = 1) -> None:
        """A stream reset by the client before it ended, or refused or answered from its headers
        alone (``cost``: more for a larger header block)."""
        self.resets.take(self.loop, cost)

    def _wasted_headers(self, headers: list[tuple[bytes, bytes]], block: bytes) -> None:
        """A stream that came to nothing but its decoded headers: tokens of the reset bucket,
        one and one per HEADER_FIELDS_PER_TOKEN fields and HEADER_BYTES_PER_TOKEN bytes."""
        self._reset_charge(1 + len(headers) // HEADER_FIELDS_PER_TOKEN + len(block) // HEADER_BYTES_PER_TOKEN)

    # ---------------------------------------------------------------- frames in

    def _frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if self.continuing is not None and ftype != CONTINUATION:
            raise H2Error(PROTOCOL_ERROR, "expected CONTINUATION")
        if ftype == DATA:
            self._data(flags, sid, payload)
        elif ftype == HEADERS:
            self._headers(flags, sid, payload)
        elif ftype == WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif ftype == CONTINUATION:
            self._continuation(flags, sid, payload)
        elif ftype == SETTINGS:
            self._settings(flags, sid, payload)
        elif ftype == PING:
            if sid:
                raise H2Error(PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise H2Error(FRAME_SIZE_ERROR, "PING of the wrong size")
            self._control()
            if not flags & ACK:
                self._write(frame(PING, ACK, 0, payload))
        elif ftype == RST_STREAM:
            self._rst_stream(sid, payload)
        elif ftype == PRIORITY:
            self._priority(sid, payload)
        elif ftype == GOAWAY:
            if sid:
                raise H2Error(PROTOCOL_ERROR, "GOAWAY on a stream")
            if len(payload) < 8:
                raise H2Error(FRAME_SIZE_ERROR, "GOAWAY of the wrong size")
            self._control()
            self.closing = True
            self._maybe_idle()
        elif ftype == PUSH_PROMISE:
            raise H2Error(PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        else:
            self._control()  # unknown frame types are ignored, but not for free

    def _rst_stream(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise H2Error(PROTOCOL_ERROR, "RST_STREAM on stream 0")
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        stream = self.streams.get(sid)
        if stream is None:
            if sid > self.last_sid:
                raise H2Error(PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}")
            self._control()  # a closed stream: nothing to do
            return
        if stream.trailers is None:
            self._reset_charge()  # reset before it was answered
        if stream.task is not None:
            stream.task.cancel()
        self._drop(stream)

    def _priority(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise H2Error(PROTOCOL_ERROR, "PRIORITY on stream 0")
        self._control()
        if len(payload) != 5:
            self._reset_sid(sid, FRAME_SIZE_ERROR)
            return
        if WINDOW.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
            self._reset_sid(sid, PROTOCOL_ERROR)  # a stream cannot depend on itself

    def _reset_sid(self, sid: int, code: int) -> None:
        """A stream error on ``sid``, open or not."""
        stream = self.streams.get(sid)
        if stream is not None:
            self._reset(stream, code)
        else:
            self._write(frame(RST_STREAM, 0, sid, WINDOW.pack(code)))
            self._remember_reset(sid)

    def _reset(self, stream: Stream, code: int) -> None:
        """A stream error (RFC 9113 section 5.4.2): RST_STREAM, and the call is cancelled."""
        self._write(frame(RST_STREAM, 0, stream.sid, WINDOW.pack(code)))
        self._remember_reset(stream.sid)
        if stream.task is not None:
            stream.task.cancel()
        self._drop(stream)

    def _remember_reset(self, sid: int) -> None:
        self.recent_resets[self.recent_pos] = sid
        self.recent_pos = (self.recent_pos + 1) % RECENT_RESETS

    def _headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise H2Error(PROTOCOL_ERROR, "HEADERS on stream 0")
        if len(payload) > MAX_HEADER_BLOCK:  # frames may be large (MAX_FRAME_IN) for DATA's sake
            raise H2Error(ENHANCE_YOUR_CALM, f"header block over {MAX_HEADER_BLOCK} bytes")
        start, stop = 0, len(payload)
        if flags & (PADDED | PRIORITY_FLAG):
            if flags & PADDED:
                if not stop:
                    raise H2Error(PROTOCOL_ERROR, "PADDED HEADERS without a pad length")
                start, stop = 1, stop - payload[0]
            if flags & PRIORITY_FLAG:
                if stop - start >= 5 and WINDOW.unpack_from(payload, start)[0] & 0x7FFFFFFF == sid:
                    flags |= PRIORITY_FLAG << 8  # depends on itself: refused once decoded
                start += 5
            if start > stop:
                raise H2Error(PROTOCOL_ERROR, "bad padding")
        block = payload[start:stop]
        if not flags & END_HEADERS:
            if not block:
                self._control()
            self.continuing = (sid, flags, bytearray(block))
            self.continuations = 0
            return
        self._header_block(flags, sid, block)

    def _continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if self.continuing is None or self.continuing[0] != sid:
            raise H2Error(PROTOCOL_ERROR, "unexpected CONTINUATION")
        self.continuations += 1
        if self.continuations > MAX_CONTINUATIONS:
            raise H2Error(ENHANCE_YOUR_CALM, f"over {MAX_CONTINUATIONS} CONTINUATION frames")
        if not payload and not flags & END_HEADERS:
            self._control()
        self.continuing[2].extend(payload)
        if len(self.continuing[2]) > MAX_HEADER_BLOCK:
            raise H2Error(ENHANCE_YOUR_CALM, f"header block over {MAX_HEADER_BLOCK} bytes")
        if flags & END_HEADERS:
            sid, first_flags, block = self.continuing
            self.continuing = None
            self._header_block(first_flags, sid, bytes(block))

    def _header_block(self, flags: int, sid: int, block: bytes) -> None:
        fields = 0  # counted only where there may be more than MAX_HEADER_FIELDS
        if len(block) > MAX_HEADER_FIELDS:
            fields = header_fields(block, 2 * MAX_HEADER_FIELDS)
            if fields > 2 * MAX_HEADER_FIELDS:  # not decoded: the connection cannot go on
                raise H2Error(ENHANCE_YOUR_CALM, f"header block of over {2 * MAX_HEADER_FIELDS} fields")
        try:
            headers, size = decode_headers(self.decoder, block)
        except hpack.OversizedHeaderListError:
            raise H2Error(ENHANCE_YOUR_CALM, f"header list over {2 * MAX_HEADER_LIST} bytes") from None
        except Exception as exc:  # hpack's decoding errors
            raise H2Error(COMPRESSION_ERROR, f"header block: {exc}") from None
        stream = self.streams.get(sid)
        if stream is not None:  # trailers from the client: they end the stream
            if stream.remote_closed:
                self._reset(stream, STREAM_CLOSED)
            elif not flags & END_STREAM:
                self._reset(stream, PROTOCOL_ERROR)
            else:
                self._remote_end(stream)
            return
        if sid % 2 == 0:
            raise H2Error(PROTOCOL_ERROR, f"stream {sid} cannot be opened by a client")
        if sid <= self.last_sid:
            if sid in self.recent_resets:
                self._wasted_headers(headers, block)
                return  # a stream this side reset: frames the client sent before it knew
            raise H2Error(PROTOCOL_ERROR, f"HEADERS on closed stream {sid} (ids only go up)")
        self.last_sid = sid
        self.opened += 1
        if flags & (PRIORITY_FLAG << 8):
            self._reset_sid(sid, PROTOCOL_ERROR)
            return
        if (
            self.closing
            or len(self.streams) >= MAX_STREAMS
            or self.out_blocked > CONN_SEND_AHEAD
            or self.header_bytes > MAX_HEADERS_HELD
        ):
            self._wasted_headers(headers, block)  # refused (clients retry): not for free
            self._reset_sid(sid, REFUSED_STREAM)
            return
        path = b""
        content_type = b""
        encoding = b"identity"
        accept = b""
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-encoding":
                encoding = value
            elif name == b"grpc-accept-encoding":
                accept = value
        if not content_type.startswith(b"application/grpc"):
            self._wasted_headers(headers, block)
            self._write(frame(HEADERS, END_HEADERS | END_STREAM, sid, STATUS_415))
            if not flags & END_STREAM:
                self._reset_sid(sid, NO_ERROR)
            return
        method = self.methods.get(path)
        stream = Stream(sid, method or UNKNOWN, headers, self.peer_initial_window)
        stream.context.peer_address = self.client
        stream.encoding = encoding
        compression = self.server.compression
        if compression is not None:
            stream.reply_encoding = compression.encoding_for(path, accept)
        self.streams[sid] = stream
        stream.stamp = self.server.tick
        if size:
            stream.header_size = size
            self.header_bytes += size
        refusal = self._refusal(method, path, encoding, stream, size, fields)
        if refusal is not None:
            if refusal[0] is not grpc.StatusCode.UNAVAILABLE:  # a bad call, not a restricted one
                self._wasted_headers(headers, block)
            # answered at once (trailers only); a request still being sent is reset after it
            stream.remote_closed = bool(flags & END_STREAM)
            self._finish(stream, *refusal)
            return
        assert method is not None
        if method.streaming is not None:
            stream.queue = asyncio.Queue()
            stream.task = self.loop.create_task(self._run_streaming(stream, method.streaming))
        if flags & END_STREAM:
            self._remote_end(stream)

    def _refusal(
        self, method: Method | None, path: bytes, encoding: bytes, stream: Stream, size: int, fields: int
    ) -> tuple[grpc.StatusCode, str] | None:
        """Why a new call is answered without running it, if it is."""
        if size > MAX_HEADER_LIST:
            return grpc.StatusCode.RESOURCE_EXHAUSTED, f"header list of {size} bytes (max {MAX_HEADER_LIST})"
        if fields > MAX_HEADER_FIELDS:
            message = f"header list of {fields} fields (max {MAX_HEADER_FIELDS})"
            return grpc.StatusCode.RESOURCE_EXHAUSTED, message
        if method is None:
            return grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {shown(path)}"
        if encoding not in ENCODINGS:
            return grpc.StatusCode.UNIMPLEMENTED, f"unsupported grpc-encoding '{shown(encoding)}'"
        gate = self.server.gate
        denial = gate(path.decode("latin-1"), stream.context.header) if gate is not None else None
        if denial is not None:
            return grpc.StatusCode.UNAVAILABLE, denial
        return None

    # ---------------------------------------------------------------- frames out

    def _close(self, stream: Stream) -> None:
        """This side ended the stream (its END_STREAM is written)."""
        if not stream.remote_closed:
            # the client may still be sending: tell it to stop (gRPC servers do this)
            self._write(frame(RST_STREAM, 0, stream.sid, WINDOW.pack(NO_ERROR)))
            self._remember_reset(stream.sid)
        self._drop(stream)

    def _drop(self, stream: Stream) -> None:
        """Forget a stream (ended here, or reset by the client): a sender waiting on it wakes,
        request bytes it still held count as delivered, its budget goes back."""
        if self.streams.pop(stream.sid, None) is None:
            return
        self.blocked.pop(stream.sid, None)
        self._wake(stream)
        if stream.out.size:
            self._unqueue(stream)
        if stream.header_size:
            self.header_bytes -= stream.header_size
        if stream.held:
            self._give(stream)
        if stream.data:
            self._take_data(len(stream.data))
            stream.data = bytearray()
        if stream.into is not None:
            self._take_data(stream.filled)
            self._forget_into(stream)
        if stream.queued:
            self._take_data(stream.queued)
            stream.queued = 0
        if not self.streams:
            self.idle_at = self.loop.time()
        self._maybe_idle()

    def _settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid:
            raise H2Error(PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & ACK:
            if payload:
                raise H2Error(FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            if self.settings_unacked:
                self.settings_unacked -= 1  # the answer to this side's SETTINGS: free
            else:
                self._control()
            return
        self._control()
        if len(payload) % 6:
            raise H2Error(FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        for pos in range(0, len(payload), 6):
            key, value = SETTING.unpack_from(payload, pos)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise H2Error(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise H2Error(FLOW_CONTROL_ERROR, "a stream window overflows")
            elif key == MAX_FRAME_SIZE:
                if not 16_384 <= value <= 2**24 - 1:
                    raise H2Error(PROTOCOL_ERROR, "bad SETTINGS_MAX_FRAME_SIZE")
                self.peer_max_frame = value
            elif key == ENABLE_PUSH and value > 1:
                raise H2Error(PROTOCOL_ERROR, "bad SETTINGS_ENABLE_PUSH")
            # HEADER_TABLE_SIZE: responses use no dynamic table; unknown settings are ignored
        if self.handshake_timer is not None:
            self.handshake_timer.cancel()
            self.handshake_timer = None
        self._write(frame(SETTINGS, ACK, 0))
        self._flush_blocked()

    def _abort_connection(self, code: int, message: str, detail: str = "") -> None:
        """A connection error (or the end of an idle one): GOAWAY, then close; a peer that
        does not read it in ``CLOSE_GRACE_S`` is cut. Logged with its reason (WARNING, INFO for
        NO_ERROR), at most once a second (``Http2GrpcServer.notes``); ``detail``: said in the log
        instead of ``message`` (which the peer reads)."""
        if self.transport is None or self.dead:
            return
        self.server.notes(
            logging.INFO if code == NO_ERROR else logging.WARNING,
            "gRPC connection from %s: GOAWAY %s after stream %d, closed: %s",
            self.peer, ERROR_NAMES.get(code, str(code)), self.last_sid, detail or message,
        )  # fmt: skip
        self.dead = True
        self.continuing = None
        self._write(frame(GOAWAY, 0, 0, GOAWAY_BODY.pack(self.last_sid, code) + message.encode()[:256]))
        self._write_pending()
        self.buf.clear()
        transport = self.transport
        transport.close()
        self.loop.call_later(CLOSE_GRACE_S, transport.abort)

    # ---------------------------------------------------------------- graceful stop

    def go_away(self) -> None:
        """No new streams; the connection closes once its streams are done."""
        if not self.closing and self.transport is not None:
            self._write(frame(GOAWAY, 0, 0, GOAWAY_BODY.pack(self.last_sid, NO_ERROR)))
        self.closing = True
        self._maybe_idle()

    def _maybe_idle(self) -> None:
        if self.closing and not self.streams:
            if self.idle is not None and not self.idle.done():
                self.idle.set_result(None)
            if self.transport is not None:
                self._write_pending()
                self.transport.close()

    async def wait_idle(self) -> None:
        if not self.streams:
            return
        self.idle = self.loop.create_future()
        await self.idle

    def close(self) -> None:
        if self.transport is not None:
            self._write_pending()
            self.transport.abort()
