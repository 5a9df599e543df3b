"""A lean HTTP/2 server for gRPC on the running asyncio loop (the default gRPC transport).

Why not grpcio's server: measured under perf_analyzer on the 2-core benchmark machine, a bare
``grpc.aio`` servicer with no engine behind it costs 241-302 us of CPU per request (its Cython
callbacks, a poller thread, GIL hand-offs between them): more than Triton's whole server spends
on the same request. This module speaks exactly the part of HTTP/2 that gRPC uses, in one
``asyncio.Protocol`` per connection, with no extra threads: frames are parsed with ``struct``,
request headers decoded with ``hpack`` (RFC 7541, the dynamic table included), response headers
are constant byte strings (literals without indexing, so no encoder state), and the responses
finished in one loop iteration leave in one ``write``. The servicer is the same object
grpcio serves (``InferenceServicer``); ``context`` is a :class:`CallContext` with the calls it
uses (``abort``, ``invocation_metadata``). ``--grpc-server grpcio`` selects grpcio instead.
Measured the same way, the bare servicer on this transport costs 28 us per request at c=8 and
answers about 30k infer/s, where grpc.aio answered about 4k (benchmarks/README.md).

What is covered: the connection preface and SETTINGS (both directions, ACKs), PING, GOAWAY,
RST_STREAM (cancels the call's task), WINDOW_UPDATE and flow control both ways (receive windows
given back as data arrives, or, on a stream whose reader lags, as it reads; sends wait for the
peer's windows), CONTINUATION, padding, priority fields (ignored), unary and bidirectional
streaming calls, gzip/deflate compressed requests (``grpc-encoding``), message size limits
(RESOURCE_EXHAUSTED; compressed messages inflate only up to the limit), unknown methods
(UNIMPLEMENTED), graceful stop (GOAWAY, then the calls in flight may finish), TLS when the
server is given an ``ssl.SSLContext`` (ALPN ``h2``; see ``tls.py``), compressed responses
when the server is given a :class:`ResponseCompression` (gzip or deflate, as the client
accepts). Not covered: server push (gRPC does not use it). A call's ``grpc-timeout`` (the
client's deadline) bounds it here too: past it the call is cancelled and ends with
DEADLINE_EXCEEDED, whether or not the client resets the stream itself; a malformed one (the
spec: 1-8 ASCII digits and a unit) ends the call with INTERNAL.

Protocol errors follow RFC 9113 (sections 5.1, 5.4 and 6): a frame of the wrong length, bad
padding, a frame on stream 0 that needs a stream (or the reverse), DATA or RST_STREAM on a
stream that was never opened, a new stream id lower than one already used, a first frame
that is not SETTINGS, bad SETTINGS values and window overflows end the connection with a
GOAWAY of the RFC's code; errors confined to one stream (DATA after the client ended it,
WINDOW_UPDATE of 0 or past 2^31-1 on a stream, a stream depending on itself) reset only that
stream. Frames still in flight for a stream this side reset are ignored (the last
``RECENT_RESETS`` such streams are remembered). An unexpected exception while handling frames
is logged in one line and ends the connection with GOAWAY INTERNAL_ERROR, never a traceback.
Every GOAWAY that ends a connection is logged with the peer, the code and the reason (WARNING;
INFO for NO_ERROR: idle, evicted), at most one line a second (``LimitedLog``).

What no client can make this side hold or do without bound (the attacks each bound answers):

- output: bytes queued for a peer that does not read (PING or SETTINGS floods, requests whose
  answers are larger than they are): past the transport's high-water mark this side stops
  reading the socket (``pause_reading``) until the peer drains it, so answers never pile up
  faster than the peer takes them; ``MAX_WRITE_BUFFER`` past that closes the connection with
  GOAWAY ENHANCE_YOUR_CALM. Messages echo at most ``MAX_ECHO`` bytes of a client's path or
  encoding, and grpc-message is cut at ``MAX_STATUS_MESSAGE`` bytes.
- responses waiting for the peer's flow-control windows: ``SEND_AHEAD`` per stream (a
  streaming call waits), ``CONN_SEND_AHEAD`` per connection (streaming calls wait, new streams
  are refused with REFUSED_STREAM, which clients retry), ``CONN_SEND_HARD`` (with more than one
  stream blocked: GOAWAY ENHANCE_YOUR_CALM and close, which frees it all); and across every
  connection of the server, ``Http2GrpcServer.unsent`` (``--max-unsent-response-bytes``), which
  also counts the transport's buffer while a peer does not read it: past half of it streaming
  calls with answers waiting produce no more; an answer that does not fit sheds the
  connections holding the most (``Http2GrpcServer.shed``: their waiting calls end
  RESOURCE_EXHAUSTED, then GOAWAY ENHANCE_YOUR_CALM), or, larger than the whole budget, ends
  its own call RESOURCE_EXHAUSTED.
- requests: bytes received and not yet delivered, a streaming call's parsed requests its
  servicer has not read included (the connection window is withheld past
  ``Http2GrpcServer.max_buffered``; a stream's window past ``QUEUE_AHEAD`` unread requests or a
  window's worth of unread bytes), and DATA past the windows this side gave is a flow-control
  error (RST_STREAM or GOAWAY FLOW_CONTROL_ERROR, RFC 9113 6.9.1); a message whose 5-byte prefix
  declares more than the message limit is refused from the prefix (RESOURCE_EXHAUSTED at once,
  the rest of its data ignored), and every message of ``guard.SMALL`` bytes or more takes its
  declared size from the server-wide :class:`~flowserve.dataplane.guard.ByteBudget` until it is
  parsed (or its stream dies); one that does not fit is refused with RESOURCE_EXHAUSTED before
  its bytes arrive. A request message that makes no progress for ``body_timeout_s`` (a unary
  call's, or one a streaming call has begun) ends its call DEADLINE_EXCEEDED.
- compressed requests inflate up to ``INFLATE_INLINE`` bytes on the loop (every small message);
  a message that inflates further finishes inflating in a thread, never past the message limit,
  so a compression bomb cannot stall the loop.
- headers: ``MAX_HEADER_BLOCK`` encoded bytes and ``MAX_CONTINUATIONS`` frames per header block,
  ``MAX_HEADER_LIST`` decoded bytes (name + value + 32 each, RFC 9113 section 6.5.2; advertised as
  SETTINGS_MAX_HEADER_LIST_SIZE; a larger list is answered RESOURCE_EXHAUSTED, one over twice
  that ends the connection as hpack stops decoding it), ``MAX_HEADER_FIELDS`` fields (more:
  RESOURCE_EXHAUSTED; over twice that, counted without decoding, ends the connection), and
  ``MAX_HEADERS_HELD`` decoded bytes held by the open streams of a connection (new streams past
  it: REFUSED_STREAM).
- CPU: streams opened and reset by the client before they ended (the "rapid reset" attack,
  CVE-2023-44487) take tokens from a per-connection bucket (``RESET_BURST``, refilled at
  ``RESET_RATE`` a second), and so do streams refused (REFUSED_STREAM) or answered from their
  headers alone, the more the larger their header block (``HEADER_FIELDS_PER_TOKEN``,
  ``HEADER_BYTES_PER_TOKEN``); control frames that carry no request (PING, SETTINGS, PRIORITY,
  WINDOW_UPDATE, RST_STREAM of a closed stream, empty DATA, HEADERS or CONTINUATION fragments,
  unknown types) take tokens from another (``CONTROL_BURST``, ``CONTROL_RATE``), except those a
  well-behaved client sends because of its calls (``CONTROLS_PER_STREAM``: gRPC C-core's
  WINDOW_UPDATEs and BDP PINGs, which cut perf_analyzer off at 5k calls a second when they were
  counted) and the ACK of this side's SETTINGS. An empty bucket ends the connection with GOAWAY
  ENHANCE_YOUR_CALM. Both read the loop's clock only when a bucket runs out. One connection
  handles ``FRAMES_PER_TURN`` frames before the loop's other connections have their turn, a
  header frame weighing one per ``HEADER_BYTES_PER_FRAME`` bytes (decoding is what costs).
- connections: ``Http2GrpcServer`` may take a :class:`~flowserve.dataplane.guard.ConnectionGuard`,
  with which each connection registers as a ``guard.Tracked`` with its peer's address: when the
  listener (or the peer's share of it) is full, the connection with no call for longest (at
  least ``guard.EVICT_AFTER_S``; keep-alive PINGs do not count) is evicted with GOAWAY NO_ERROR,
  and only when none is a new connection closed at once; the preface and the client's first
  SETTINGS must arrive within ``handshake_timeout_s`` (a TLS handshake within the same time,
  through ``create_server``'s ``ssl_handshake_timeout``); a connection with no call for
  ``idle_timeout_s`` (PINGs and other frames that carry no call do not count) gets GOAWAY
  NO_ERROR and is closed. A connection that is closed or reset cancels its calls.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn, cast

import grpc
import hpack
from google.protobuf.message import DecodeError

from flowserve.core.errors import ResourceExhausted
from flowserve.dataplane.guard import SMALL, ByteBudget, ConnectionGuard
from flowserve.dataplane.inflate import Corrupt, Inflater, OverBudget, TooLarge, finish, inflate_inline

log = logging.getLogger("flowserve.grpc")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0, 1, 2, 3, 4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 5, 6, 7, 8, 9
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20
# error codes (RFC 9113 section 7)
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0, 1, 2, 3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 5, 6, 7, 8, 9
ENHANCE_YOUR_CALM = 11
ERROR_NAMES = {
    NO_ERROR: "NO_ERROR", PROTOCOL_ERROR: "PROTOCOL_ERROR", INTERNAL_ERROR: "INTERNAL_ERROR",
    FLOW_CONTROL_ERROR: "FLOW_CONTROL_ERROR", STREAM_CLOSED: "STREAM_CLOSED",
    FRAME_SIZE_ERROR: "FRAME_SIZE_ERROR", REFUSED_STREAM: "REFUSED_STREAM", CANCEL: "CANCEL",
    COMPRESSION_ERROR: "COMPRESSION_ERROR", ENHANCE_YOUR_CALM: "ENHANCE_YOUR_CALM",
}  # fmt: skip
# settings identifiers
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS, INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 1, 2, 3, 4, 5
MAX_HEADER_LIST_SIZE = 6

_FRAME = struct.Struct(">BHBBL")  # length (24 bits as 8 + 16), type, flags, stream id
_SETTING = struct.Struct(">HL")
_WINDOW = struct.Struct(">L")
_GOAWAY = struct.Struct(">LL")
MAX_WINDOW = 2**31 - 1

DEFAULT_WINDOW = 65_535
# what this server lets a peer send ahead: per stream, and on the connection as a whole
STREAM_WINDOW = 16 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
# requests of one streaming call parsed but not yet read by the servicer, beyond which the
# stream's window is given back only as the servicer reads (the client then waits)
QUEUE_AHEAD = 64
MAX_STREAMS = 4096
MAX_FRAME_IN = 16_384  # the protocol default; not raised, so frames stay small to parse
MAX_HEADER_BLOCK = 64 * 1024  # one request's header block, CONTINUATION frames included
MAX_CONTINUATIONS = 64  # CONTINUATION frames in one header block (4 carry the largest block)
MAX_HEADER_LIST = 64 * 1024  # one request's decoded header list (name + value + 32 per field)
MAX_HEADERS_HELD = 8 * 1024 * 1024  # decoded header bytes held by the open streams of a connection
# header fields of one request (gRPC's default metadata limit, 8 KiB at 32 bytes a field, allows
# 256): more is answered RESOURCE_EXHAUSTED, and a block of more than twice that ends the
# connection before it is decoded (hpack in Python spends 2 to 17 us a field)
MAX_HEADER_FIELDS = 256
# bytes of one stream's responses waiting for the peer's window before the servicer waits
SEND_AHEAD = 4 * 1024 * 1024
# the same over all streams of a connection: streaming calls wait, new streams are refused
CONN_SEND_AHEAD = 64 * 1024 * 1024
# ... and past this (with more than one stream waiting) the connection is closed
CONN_SEND_HARD = 256 * 1024 * 1024
# bytes of frames queued in one loop iteration before they go to the transport at once (where
# its high-water mark pauses reading)
MAX_PENDING_OUT = 1024 * 1024
# bytes in the transport's buffer, the peer not reading, past which the connection is closed
MAX_WRITE_BUFFER = 256 * 1024 * 1024
# frames handled in one go before the loop turns to its other connections; a header frame of
# more than 64 bytes also counts one per HEADER_BYTES_PER_FRAME of its bytes (decoding them is
# what costs), so one connection's header blocks cannot hold the loop either
FRAMES_PER_TURN = 200
HEADER_BYTES_PER_FRAME = 4
# a stream refused or answered from its headers alone also costs the reset bucket one token per
# HEADER_FIELDS_PER_TOKEN fields and per HEADER_BYTES_PER_TOKEN bytes of its header block
HEADER_FIELDS_PER_TOKEN = 8
HEADER_BYTES_PER_TOKEN = 1024
# request bytes read while reading is paused (a TLS transport may still deliver some)
MAX_STALLED_IN = 4 * 1024 * 1024
# control frames a connection may send at once, and per second after that
CONTROL_BURST = 10_000
CONTROL_RATE = 10_000.0
# control frames a well-behaved client sends because of calls, which take no token: gRPC C-core
# sends a WINDOW_UPDATE on each new stream, one on the connection as each answer arrives, and
# now and then a PING probing the bandwidth (BDP), so each stream opened earns this many, and
# each send of response DATA (of CREDITED_FLUSH bytes or all a stream had queued) earns
# CONTROLS_PER_FLUSH (the WINDOW_UPDATEs answering it); at most CONTROL_BURST are banked
CONTROLS_PER_STREAM = 4
CONTROLS_PER_FLUSH = 2
CREDITED_FLUSH = 4096
# streams a client may reset before they ended (or open past MAX_STREAMS) at once, and per second
RESET_BURST = 1_000
RESET_RATE = 200.0
# streams this side reset whose late frames are ignored (older ones get STREAM_CLOSED)
RECENT_RESETS = 256
# grpc-message bytes (percent-encoded), and bytes of a client's path or encoding echoed in one
MAX_STATUS_MESSAGE = 4096
MAX_ECHO = 128
# bytes a compressed message inflates to on the loop; past this it inflates in a thread
INFLATE_INLINE = 256 * 1024
PARSE_INLINE = 1 << 20  # request messages larger than this are parsed in a worker thread
# seconds a connection that was told to go away may take to read it before it is cut
CLOSE_GRACE_S = 2.0
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 300.0
DEFAULT_BODY_TIMEOUT_S = 30.0  # as HTTP's --http-body-timeout-secs

# grpc-encoding -> zlib's wbits (None: the message is not compressed)
_ENCODINGS: dict[bytes, int | None] = {
    b"gzip": 16 + zlib.MAX_WBITS,
    b"deflate": zlib.MAX_WBITS,
    b"identity": None,
}
# Triton's --grpc-infer-response-compression-level -> zlib level (0: responses go uncompressed)
COMPRESSION_LEVELS = {"none": 0, "low": 1, "medium": 6, "high": 9}
# response messages shorter than this go uncompressed even on a compressing call (a message's
# own flag says which; a few bytes gain nothing and cost a zlib call)
COMPRESS_FROM = 1024


@dataclass(frozen=True, slots=True)
class ResponseCompression:
    """Compress the responses of ``methods`` (``/package.Service/Method`` paths; None: every
    method) at zlib ``level``, with gzip, or deflate, whichever the client lists in
    ``grpc-accept-encoding`` (gzip first); a client that accepts neither gets them
    uncompressed."""

    level: int
    methods: frozenset[str] | None = None

    def encoding_for(self, path: bytes, accept: bytes) -> bytes | None:
        """The encoding for a call's responses, None when they go uncompressed."""
        if self.methods is not None and path.decode("latin-1") not in self.methods:
            return None
        offered = {part.strip() for part in accept.split(b",")}
        for name in (b"gzip", b"deflate"):
            if name in offered:
                return name
        return None

    def compress(self, message: bytes, encoding: bytes) -> bytes:
        packer = zlib.compressobj(self.level, zlib.DEFLATED, _ENCODINGS[encoding] or zlib.MAX_WBITS)
        return packer.compress(message) + packer.flush()


def inflate(data: bytes, wbits: int | None, limit: int) -> bytes | None:
    """A compressed message inflated, or None when it inflates past ``limit`` bytes or past
    ``inflate.RATIO`` times its size (inflating stops there: a small bomb cannot take the
    memory it would expand to); uncounted (the server's path is ``Connection._message``)."""
    if wbits is None:
        return data
    try:
        return inflate_inline(Inflater(data, wbits, limit, what="request message"), limit + 1)
    except TooLarge:
        return None
    except Corrupt as exc:
        raise zlib.error(exc.message) from None


class _Refused(Exception):
    """A request message answered with ``code`` instead of being delivered."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def _inflate_rest(inflater: Inflater, parse: Callable[[bytes], Any]) -> Any:
    """Finish inflating a message (in a thread, step by step, its bytes counted against the
    budget as they grow: ``inflate.finish``) and parse it (in a thread: protobuf lets the GIL
    go); what the inflater holds is given back when it is parsed or refused."""
    try:
        out = await finish(inflater)
        return await asyncio.to_thread(parse, out)
    except (TooLarge, OverBudget) as exc:
        raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message) from None
    except (DecodeError, Corrupt) as exc:
        raise _Refused(grpc.StatusCode.INTERNAL, f"Failed to parse the request message: {exc}") from None
    finally:
        inflater.release()


class _Later:
    """A request message still inflating or parsing (in a thread): its task gives the parsed
    message."""

    __slots__ = ("task",)

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A done callback: the task's exception is seen (a message nobody waited for any more)."""
    if not task.cancelled():
        task.exception()


# request headers that are transport, not call metadata (grpc.aio leaves them out as well)
_NOT_METADATA = frozenset(
    {b"te", b"content-type", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"}
)


_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def grpc_timeout_s(value: str | None) -> float | None:
    """A ``grpc-timeout`` header in seconds ("100m": 0.1); None when absent or malformed
    (the gRPC spec: 1 to 8 ASCII digits, then one of H M S m u n; Python's ``int`` would also
    take other scripts' digits, which the spec does not)."""
    if not value or not 2 <= len(value) <= 9:
        return None
    digits = value[:-1]
    if not (digits.isascii() and digits.isdigit()):
        return None
    unit = _TIMEOUT_UNITS.get(value[-1])
    return None if unit is None else int(digits) * unit


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _FRAME.pack(n >> 16, n & 0xFFFF, ftype, flags, sid) + payload


def _hpack_int(value: int, prefix_bits: int = 7) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = [limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """One header as an HPACK literal without indexing (new name, no Huffman): encoding it
    changes no table, so a header block made of these is a constant."""
    return b"\x00" + _hpack_int(len(name)) + name + _hpack_int(len(value)) + value


def _percent(message: str) -> bytes:
    """grpc-message's percent-encoding (bytes outside printable ASCII, and '%'), at most
    ``MAX_STATUS_MESSAGE`` bytes (an escape is never cut in two)."""
    raw = message.encode("utf-8")[:MAX_STATUS_MESSAGE]
    out = b"".join(bytes([c]) if 0x20 <= c <= 0x7E and c != 0x25 else b"%%%02X" % c for c in raw)
    if len(out) > MAX_STATUS_MESSAGE:
        out = out[:MAX_STATUS_MESSAGE]
        cut = out.find(b"%", MAX_STATUS_MESSAGE - 2)
        if cut >= 0:
            out = out[:cut]
    return out


def _shown(name: bytes) -> str:
    """A client's name (a path, an encoding) as a message may echo it: at most ``MAX_ECHO`` bytes."""
    text = name[:MAX_ECHO].decode("latin-1")
    return text + "..." if len(name) > MAX_ECHO else text


_CONTENT_TYPE = literal(b"content-type", b"application/grpc")
RESPONSE_HEADERS = b"\x88" + _CONTENT_TYPE  # 0x88: ':status: 200' from HPACK's static table
TRAILERS_OK = literal(b"grpc-status", b"0")
STATUS_415 = literal(b":status", b"415")  # a request that is not gRPC (content-type)


def status_block(code: grpc.StatusCode, message: str | None) -> bytes:
    block = literal(b"grpc-status", str(code.value[0]).encode())
    if message:
        block += literal(b"grpc-message", _percent(message))
    return block


def header_list_size(headers: list[tuple[bytes, bytes]]) -> int:
    """A header list's size as RFC 9113 section 6.5.2 counts it (name + value + 32 per field)."""
    return sum(len(k) + len(v) for k, v in headers) + 32 * len(headers)


def _hpack_skip_int(block: bytes, pos: int, mask: int) -> tuple[int, int]:
    """The HPACK integer at ``pos`` (its prefix ``mask``) and the position after it."""
    value = block[pos] & mask
    pos += 1
    if value == mask:
        shift = 0
        while pos < len(block):
            byte = block[pos]
            pos += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
    return value, pos


def header_fields(block: bytes, limit: int) -> int:
    """How many header fields an HPACK block holds, counting up to ``limit + 1``: a walk over the
    representations' first bytes and string lengths, nothing decoded or indexed (a malformed
    block gives what was counted before it goes wrong; hpack then says what is wrong)."""
    pos = count = 0
    end = len(block)
    while pos < end and count <= limit:
        first = block[pos]
        if first & 0x80:  # indexed (RFC 7541 6.1)
            count += 1
            pos = _hpack_skip_int(block, pos, 0x7F)[1] if first == 0xFF else pos + 1
            continue
        if first & 0xE0 == 0x20:  # dynamic table size update (6.3): not a field
            pos = _hpack_skip_int(block, pos, 0x1F)[1]
            continue
        count += 1  # a literal (6.2): an indexed name or a new one, then the value
        mask = 0x3F if first & 0x40 else 0x0F
        index = first & mask
        pos = _hpack_skip_int(block, pos, mask)[1] if index == mask else pos + 1
        for _ in range(1 if index else 2):  # the strings: a length (7-bit prefix), the bytes
            if pos >= end:
                break
            length = block[pos] & 0x7F
            if length == 0x7F:
                length, pos = _hpack_skip_int(block, pos, 0x7F)
            else:
                pos += 1
            pos += length
    return count


def decode_headers(decoder: hpack.Decoder, block: bytes) -> tuple[list[tuple[bytes, bytes]], int]:
    """A request's header fields, and their decoded size (0 when a block of indexed fields is
    known to be under ``MAX_HEADER_LIST`` without counting: its fields are the table's own
    entries, no new bytes). When every field is indexed, each in one byte (a C-core client's
    steady state), table lookups, which leave the table as it is, as decoding would; hpack
    itself stops at ``decoder.max_header_list_size``."""
    if 0 < len(block) <= 64 and min(block) >= 0x80 and max(block) < 0xFF:
        table = decoder.header_table
        get = table.get_by_index
        headers = [get(b & 0x7F) for b in block]
        # an indexed field is at most the dynamic table's size, or 64 bytes (the static table)
        if len(block) * (table._current_size + 64) <= MAX_HEADER_LIST:
            return headers, 0
        return headers, header_list_size(headers)
    headers = list(decoder.decode(block, raw=True))
    return headers, header_list_size(headers)


def decode_block(decoder: hpack.Decoder, block: bytes) -> list[tuple[bytes, bytes]]:
    """A request's header fields (see :func:`decode_headers`)."""
    return decode_headers(decoder, block)[0]


class CallContext:
    """What a servicer method gets as ``context`` (the part of ``grpc.aio.ServicerContext``
    that flowserve's servicer uses)."""

    __slots__ = ("_headers", "code", "details", "peer_address")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self._headers = headers
        self.code = grpc.StatusCode.OK
        self.details = ""
        self.peer_address = ""  # the client's, as peer() gives it

    def peer(self) -> str:
        """The client's address as grpc.aio's context writes it ("ipv4:1.2.3.4:5678",
        "ipv6:[::1]:5678"; "" when unknown)."""
        return self.peer_address

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple(
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in self._headers
            if not k.startswith(b":") and k not in _NOT_METADATA
        )

    def header(self, name: str) -> str | None:
        key = name.encode("latin-1")
        for k, v in self._headers:
            if k == key:
                return v.decode("latin-1")
        return None

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        self.code = code
        self.details = details
        raise grpc.aio.AbortError()

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details


Unary = Callable[[Any, CallContext], Awaitable[Any]]
Streaming = Callable[[AsyncIterator[Any], CallContext], AsyncIterator[Any]]


@dataclass(frozen=True)
class Method:
    parse: Callable[[bytes], Any]
    unary: Unary | None = None
    streaming: Streaming | None = None


# the servicer refuses a call before running it: (method path, metadata header) -> message or None
Gate = Callable[[str, Callable[[str], str | None]], str | None]


class _Eof:
    pass


_EOF = _Eof()


class _Stream:
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


class LimitedLog:
    """Log lines at most once every ``interval_s`` seconds of ``clock`` (a flood of connection
    errors cannot flood the log); the next line written says how many were left out."""

    __slots__ = ("clock", "interval_s", "left_out", "logged_at")

    def __init__(self, clock: Callable[[], float] = time.monotonic, interval_s: float = 1.0) -> None:
        self.clock = clock
        self.interval_s = interval_s
        self.logged_at = -1e18
        self.left_out = 0

    def __call__(self, level: int, message: str, *args: object) -> None:
        now = self.clock()
        if now - self.logged_at < self.interval_s:
            self.left_out += 1
            return
        if self.left_out:
            message += " (and %d more like it since the last such message)"
            args = (*args, self.left_out)
        log.log(level, message, *args)
        self.logged_at = now
        self.left_out = 0


class TokenBucket:
    """``burst`` tokens refilled at ``rate`` a second; taking from an empty bucket is a
    connection error (ENHANCE_YOUR_CALM). The loop's clock is read only when the bucket runs
    out, so a well-behaved peer costs one subtraction per frame."""

    __slots__ = ("at", "burst", "rate", "tokens", "why")

    def __init__(self, burst: int, rate: float, why: str) -> None:
        self.burst = float(burst)
        self.rate = rate
        self.tokens = self.burst
        self.at = 0.0  # when the bucket was last refilled (the loop's clock)
        self.why = why

    def take(self, loop: asyncio.AbstractEventLoop, cost: int = 1) -> None:
        self.tokens -= cost
        if self.tokens < 0:
            now = loop.time()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
            self.at = now
            if self.tokens < 0:
                raise H2Error(ENHANCE_YOUR_CALM, self.why)


class H2Error(Exception):
    """A connection error (RFC 9113 section 5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Connection(asyncio.Protocol):
    def __init__(self, server: Http2GrpcServer) -> None:
        self.server = server
        self.methods = server.methods
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.client = ""  # the client's address, as CallContext.peer() gives it
        self.buf = bytearray()
        self.preface = False
        self.decoder = hpack.Decoder(max_header_list_size=2 * MAX_HEADER_LIST)
        self.streams: dict[int, _Stream] = {}
        self.last_sid = 0
        self.send_window = DEFAULT_WINDOW
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_frame = 16_384
        self.recv_unacked = 0
        self.buffered = 0  # request bytes received, not yet delivered to a call
        self.continuing: tuple[int, int, bytearray] | None = None  # (sid, flags, block so far)
        self.continuations = 0  # CONTINUATION frames of the block in ``continuing``
        self.blocked: dict[int, _Stream] = {}
        self.out_blocked = 0  # response bytes of all streams waiting for the peer's windows
        self.unblocked: asyncio.Future[None] | None = None  # streaming senders waiting on it
        self.header_bytes = 0  # decoded header bytes of the open streams
        self.pending: list[bytes] = []
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
            _SETTING.pack(k, v)
            for k, v in (
                (ENABLE_PUSH, 0),
                (MAX_CONCURRENT_STREAMS, MAX_STREAMS),
                (INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST),
            )
        )
        self.settings_unacked = 1
        self.transport.write(
            frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, _WINDOW.pack(CONNECTION_WINDOW - DEFAULT_WINDOW))
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

    def data_received(self, data: bytes) -> None:
        if self.dead:
            return
        buf = self.buf
        buf += data
        if self.stalled or self.deferred:  # a TLS transport may deliver what it had decrypted
            if len(buf) > MAX_STALLED_IN:
                self._abort_connection(ENHANCE_YOUR_CALM, "the peer sends and does not read")
            return
        self._process()

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
        pos = count = 0
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
            end = len(buf)
            while end - pos >= 9:
                hi, lo, ftype, flags, sid = _FRAME.unpack_from(buf, pos)
                length = (hi << 16) | lo
                if length > MAX_FRAME_IN:
                    raise H2Error(FRAME_SIZE_ERROR, f"frame of {length} bytes")
                stop = pos + 9 + length
                if stop > end:
                    break
                payload = bytes(buf[pos + 9 : stop])
                pos = stop
                self._frame(ftype, flags, sid & 0x7FFFFFFF, payload)
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
                waiting = bool(stream.data) and self._reader_keeps_up(stream)
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

    def _reserve(self, stream: _Stream, size: int) -> bool:
        """Take a message's declared ``size`` from the server's budget; False: refused (answered)."""
        budget = self.server.budget
        if budget is None:
            return True
        if not budget.take(size):
            self._finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED, budget.refusal(size))
            return False
        stream.held = size
        return True

    def _give(self, stream: _Stream) -> None:
        budget = self.server.budget
        if budget is not None:
            budget.give(stream.held)
        stream.held = 0

    def held_unsent(self) -> int:
        """Bytes of the server's budget of unsent response bytes this connection holds."""
        return self.unsent_held + self.socket_held

    def _charge(self, stream: _Stream) -> bool:
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

    def _end_unsent(self, stream: _Stream, why: str) -> None:
        """End a call whose answers wait for its client now, RESOURCE_EXHAUSTED: what it had
        queued is dropped (its trailers, even OK ones, were waiting behind it)."""
        self._unqueue(stream)
        stream.trailers = None
        self._finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED, why)

    def _uncharge(self, stream: _Stream) -> None:
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
        if _WINDOW.unpack_from(payload)[0] & 0x7FFFFFFF == sid:
            self._reset_sid(sid, PROTOCOL_ERROR)  # a stream cannot depend on itself

    def _reset_sid(self, sid: int, code: int) -> None:
        """A stream error on ``sid``, open or not."""
        stream = self.streams.get(sid)
        if stream is not None:
            self._reset(stream, code)
        else:
            self._write(frame(RST_STREAM, 0, sid, _WINDOW.pack(code)))
            self._remember_reset(sid)

    def _reset(self, stream: _Stream, code: int) -> None:
        """A stream error (RFC 9113 section 5.4.2): RST_STREAM, and the call is cancelled."""
        self._write(frame(RST_STREAM, 0, stream.sid, _WINDOW.pack(code)))
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
        start, stop = 0, len(payload)
        if flags & (PADDED | PRIORITY_FLAG):
            if flags & PADDED:
                if not stop:
                    raise H2Error(PROTOCOL_ERROR, "PADDED HEADERS without a pad length")
                start, stop = 1, stop - payload[0]
            if flags & PRIORITY_FLAG:
                if stop - start >= 5 and _WINDOW.unpack_from(payload, start)[0] & 0x7FFFFFFF == sid:
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
        stream = _Stream(sid, method or _UNKNOWN, headers, self.peer_initial_window)
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
        self, method: Method | None, path: bytes, encoding: bytes, stream: _Stream, size: int, fields: int
    ) -> tuple[grpc.StatusCode, str] | None:
        """Why a new call is answered without running it, if it is."""
        if size > MAX_HEADER_LIST:
            return grpc.StatusCode.RESOURCE_EXHAUSTED, f"header list of {size} bytes (max {MAX_HEADER_LIST})"
        if fields > MAX_HEADER_FIELDS:
            message = f"header list of {fields} fields (max {MAX_HEADER_FIELDS})"
            return grpc.StatusCode.RESOURCE_EXHAUSTED, message
        if method is None:
            return grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {_shown(path)}"
        if encoding not in _ENCODINGS:
            return grpc.StatusCode.UNIMPLEMENTED, f"unsupported grpc-encoding '{_shown(encoding)}'"
        gate = self.server.gate
        denial = gate(path.decode("latin-1"), stream.context.header) if gate is not None else None
        if denial is not None:
            return grpc.StatusCode.UNAVAILABLE, denial
        return None

    def _data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise H2Error(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if flags & PADDED and (not size or payload[0] >= size):
            raise H2Error(PROTOCOL_ERROR, "bad padding")
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
            return  # a stream this side reset: its data is dropped
        if stream.unacked + size > STREAM_WINDOW:  # a peer ignoring the stream's window
            self._ack_connection()
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        if flags & PADDED:
            payload = payload[1 : size - payload[0]]
        elif not size and not flags & END_STREAM:
            self._control()
        stream.data += payload
        if payload:
            stream.stamp = self.server.tick  # progress (see Http2GrpcServer.body_timeout_s)
        self.buffered += len(payload)
        self._ack_connection()
        stream.unacked += size
        if stream.queue is not None:
            self._split_messages(stream)
        else:
            data = stream.data
            if stream.declared < 0 and len(data) >= 5:
                declared = stream.declared = int.from_bytes(data[1:5], "big")
                if declared > self.server.max_message:
                    self._too_large(stream, declared)  # refused from the prefix
                    return
                if declared >= SMALL and len(data) - 5 < declared and not self._reserve(stream, declared):
                    return
            if len(data) > self.server.max_message + 5:
                self._too_large(stream, len(data) - 5)
                return
        if flags & END_STREAM:
            self._remote_end(stream)
        elif stream.unacked >= STREAM_WINDOW // 4 and self._reader_keeps_up(stream):
            self._ack_stream(stream)

    def _ack_connection(self) -> None:
        """Give the connection's window back, unless too much request data waits here
        undelivered (the client then stops sending until calls take their requests)."""
        if self.recv_unacked >= CONNECTION_WINDOW // 2 and self.buffered < self.server.max_buffered:
            self._write(frame(WINDOW_UPDATE, 0, 0, _WINDOW.pack(self.recv_unacked)))
            self.recv_unacked = 0

    def _take_data(self, count: int) -> None:
        """``count`` request bytes held here were delivered (or dropped)."""
        self.buffered -= count
        if self.recv_unacked:
            self._ack_connection()

    @staticmethod
    def _reader_keeps_up(stream: _Stream) -> bool:
        return stream.queue is None or (stream.queue.qsize() < QUEUE_AHEAD and stream.queued < STREAM_WINDOW)

    def _ack_stream(self, stream: _Stream) -> None:
        self._write(frame(WINDOW_UPDATE, 0, stream.sid, _WINDOW.pack(stream.unacked)))
        stream.unacked = 0

    def _split_messages(self, stream: _Stream) -> None:
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
                break
            message = self._message(stream, data[pos], bytes(data[pos + 5 : pos + 5 + length]))
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
    def _queued(stream: _Stream, count: int) -> None:
        """The first ``count`` bytes of ``stream.data`` went into its queue as messages: they stay
        counted in the connection's undelivered bytes until the servicer reads them."""
        if count:
            del stream.data[:count]
            stream.queued += count

    def _message(self, stream: _Stream, compressed: int, body: bytes) -> Any | None:
        """A request message parsed (a :class:`_Later` when it inflates past ``INFLATE_INLINE``
        bytes: the rest in a thread), or None when the call was answered instead. A compressed
        one inflates within ``flowserve.dataplane.inflate``'s bounds (the message limit,
        ``RATIO`` times its size, the server's budget: RESOURCE_EXHAUSTED naming the bound)."""
        inflater = None
        try:
            if compressed:
                wbits = _ENCODINGS[stream.encoding]
                if wbits is not None:
                    server = self.server
                    inflater = Inflater(body, wbits, server.max_message, server.budget, "request message")
                    out = inflate_inline(inflater, INFLATE_INLINE)
                    if out is None:
                        later, inflater = self._inflate_later(stream, inflater), None
                        return later
                    body = out
            if len(body) > PARSE_INLINE:
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

    def _inflate_later(self, stream: _Stream, inflater: Inflater) -> _Later:
        """Inflate the rest of a message in a thread; the budget it holds goes back when done."""
        held, stream.held = stream.held, 0
        parse = stream.method.parse

        async def run() -> Any:
            try:
                return await _inflate_rest(inflater, parse)
            finally:
                inflater.release()  # (also when cancelled before it began)
                if held:
                    budget = self.server.budget
                    assert budget is not None
                    budget.give(held)

        task = self.loop.create_task(run())
        task.add_done_callback(_retrieved)
        return _Later(task)

    def _parse_later(self, stream: _Stream, body: bytes) -> _Later:
        """Parse a large message in a thread. protobuf holds the GIL while it parses (tens of
        nanoseconds a field), so what keeps the loop free is the bound on fields that an
        inference method's parse checks first, in Python, which lets the GIL go (fields.py);
        the budget the message holds goes back when it is parsed."""
        held, stream.held = stream.held, 0
        parse = stream.method.parse

        async def run() -> Any:
            try:
                return await asyncio.to_thread(parse, body)
            except ResourceExhausted as exc:  # e.g. fields.TooManyFields
                raise _Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message) from None
            except DecodeError as exc:
                message = f"Failed to parse the request message: {exc}"
                raise _Refused(grpc.StatusCode.INTERNAL, message) from None
            finally:
                if held:
                    budget = self.server.budget
                    assert budget is not None
                    budget.give(held)

        task = self.loop.create_task(run())
        task.add_done_callback(_retrieved)
        return _Later(task)

    def _too_large(self, stream: _Stream, size: int | None) -> None:
        """Refuse a message over the limit (``size`` None: it inflates past it)."""
        limit = self.server.max_message
        detail = f"{size} vs. {limit}" if size is not None else f"more than {limit} bytes inflated"
        message = f"Received message larger than max ({detail})"
        self._finish(stream, grpc.StatusCode.RESOURCE_EXHAUSTED, message)

    def _remote_end(self, stream: _Stream) -> None:
        if stream.remote_closed:
            return
        stream.remote_closed = True
        if stream.queue is not None:
            if stream.data:
                self._finish(stream, grpc.StatusCode.INTERNAL, "truncated request message")
            stream.queue.put_nowait(_EOF)
            return
        if stream.task is not None or stream.trailers is not None:
            return  # already running or answered: its end is this side's to send
        data = stream.data
        if len(data) < 5 or stream.declared != len(data) - 5:
            self._finish(stream, grpc.StatusCode.INTERNAL, "a unary call needs exactly one request message")
            return
        stream.data = bytearray()
        self._take_data(len(data))
        request = self._message(stream, data[0], bytes(data[5:]))
        if stream.held:
            self._give(stream)
        if request is None:
            return
        unary = stream.method.unary
        assert unary is not None
        if request.__class__ is _Later:
            stream.task = self.loop.create_task(self._run_unary_later(stream, unary, request))
            return
        stream.task = self.loop.create_task(self._run_unary(stream, unary, request))

    # ---------------------------------------------------------------- running calls

    async def _run_unary_later(self, stream: _Stream, call: Unary, later: _Later) -> None:
        try:
            request = await later.task
        except asyncio.CancelledError:
            return
        except _Refused as refused:
            self._finish(stream, refused.code, refused.message)
            return
        except Exception as exc:
            self._failed(stream, exc, None)
            return
        await self._run_unary(stream, call, request)

    def _timeout_s(self, stream: _Stream) -> float | None:
        """The call's ``grpc-timeout`` in seconds (None: none); a malformed one ends the call
        with INTERNAL and gives -1."""
        header = stream.context.header("grpc-timeout")
        if header is None:
            return None
        seconds = grpc_timeout_s(header)
        if seconds is None:
            message = f"malformed grpc-timeout '{_shown(header.encode('latin-1'))}'"
            self._finish(stream, grpc.StatusCode.INTERNAL, message)
            return -1.0
        return seconds

    async def _run_unary(self, stream: _Stream, call: Unary, request: Any) -> None:
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
                self._send(stream, response.SerializeToString(), TRAILERS_OK)
        except asyncio.CancelledError:
            return
        except Exception as exc:
            self._failed(stream, exc, deadline)

    async def _run_streaming(self, stream: _Stream, call: Streaming) -> None:
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

    def _failed(self, stream: _Stream, exc: Exception, deadline: asyncio.Timeout | None) -> None:
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

    async def _requests(self, stream: _Stream) -> AsyncIterator[Any]:
        queue = stream.queue
        assert queue is not None
        while True:
            message = await queue.get()
            if message is _EOF:
                return
            size = stream.sizes.popleft()
            stream.queued -= size
            self._take_data(size)
            if message.__class__ is _Later:
                try:
                    message = await message.task
                except _Refused as refused:
                    stream.context.code = refused.code
                    stream.context.details = refused.message
                    raise grpc.aio.AbortError() from None
            if stream.unacked and not stream.remote_closed and self._reader_keeps_up(stream):
                self._ack_stream(stream)
            yield message

    async def _drain(self, stream: _Stream) -> None:
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

    # ---------------------------------------------------------------- frames out

    def _send(self, stream: _Stream, message: bytes, trailers: bytes | None) -> None:
        """One response message, then (if given) the trailers ending the call."""
        flag = b"\x00"
        coding = stream.reply_encoding
        if not stream.headers_sent:
            stream.headers_sent = True
            head = (
                RESPONSE_HEADERS if coding is None else RESPONSE_HEADERS + literal(b"grpc-encoding", coding)
            )
            self._write(frame(HEADERS, END_HEADERS, stream.sid, head))
        compression = self.server.compression
        if coding is not None and compression is not None and len(message) >= COMPRESS_FROM:
            message = compression.compress(message, coding)
            flag = b"\x01"
        n = len(message)
        stream.out += flag + n.to_bytes(4, "big") + message
        self.out_blocked += n + 5
        if trailers is not None:
            stream.trailers = trailers
        self._flush(stream)

    def _finish(self, stream: _Stream, code: grpc.StatusCode, message: str | None) -> None:
        """End the call with a status (trailers-only when nothing was sent yet)."""
        if stream.sid not in self.streams or stream.trailers is not None:
            return
        if stream.task is not None and stream.task is not asyncio.current_task():
            stream.task.cancel()
        block = status_block(code, message)
        if not stream.headers_sent:
            stream.headers_sent = True
            if stream.out:
                self._unqueue(stream)
            stream.trailers = b""
            self._write(frame(HEADERS, END_HEADERS | END_STREAM, stream.sid, RESPONSE_HEADERS + block))
            self._close(stream)
            return
        stream.trailers = block
        self._flush(stream)

    def _flush(self, stream: _Stream) -> None:
        out = stream.out
        if out:
            room = min(stream.send_window, self.send_window, len(out))
            if room > 0:
                max_frame = self.peer_max_frame
                sid = stream.sid
                chunks = [
                    frame(DATA, 0, sid, bytes(out[start : min(start + max_frame, room)]))
                    for start in range(0, room, max_frame)
                ]
                del out[:room]
                stream.send_window -= room
                self.send_window -= room
                self.out_blocked -= room
                if room >= CREDITED_FLUSH or not out:
                    self.flushes += 1  # earns the WINDOW_UPDATEs that answer it
                if self.unblocked is not None:
                    self._less_blocked()
                self._write(b"".join(chunks))
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

    def _unqueue(self, stream: _Stream) -> None:
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

    def _close(self, stream: _Stream) -> None:
        """This side ended the stream (its END_STREAM is written)."""
        if not stream.remote_closed:
            # the client may still be sending: tell it to stop (gRPC servers do this)
            self._write(frame(RST_STREAM, 0, stream.sid, _WINDOW.pack(NO_ERROR)))
            self._remember_reset(stream.sid)
        self._drop(stream)

    def _drop(self, stream: _Stream) -> None:
        """Forget a stream (ended here, or reset by the client): a sender waiting on it wakes,
        request bytes it still held count as delivered, its budget goes back."""
        if self.streams.pop(stream.sid, None) is None:
            return
        self.blocked.pop(stream.sid, None)
        self._wake(stream)
        if stream.out:
            self._unqueue(stream)
        if stream.header_size:
            self.header_bytes -= stream.header_size
        if stream.held:
            self._give(stream)
        if stream.data:
            self._take_data(len(stream.data))
            stream.data = bytearray()
        if stream.queued:
            self._take_data(stream.queued)
            stream.queued = 0
        if not self.streams:
            self.idle_at = self.loop.time()
        self._maybe_idle()

    def _wake(self, stream: _Stream) -> None:
        if stream.drained is not None and not stream.drained.done():
            stream.drained.set_result(None)

    def _window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise H2Error(FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        self._control()
        increment = _WINDOW.unpack(payload)[0] & 0x7FFFFFFF
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
            key, value = _SETTING.unpack_from(payload, pos)
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

    def _flush_blocked(self) -> None:
        """Send what streams had waiting for the peer's windows, oldest first."""
        for stream in list(self.blocked.values()):
            self._flush(stream)
            if self.send_window <= 0 or self.dead:
                break

    def _write(self, data: bytes) -> None:
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

    def _write_pending(self) -> None:
        self.flush_scheduled = False
        transport = self.transport
        if self.pending and transport is not None and not transport.is_closing():
            transport.write(b"".join(self.pending))
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
        self._write(frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_sid, code) + message.encode()[:256]))
        self._write_pending()
        self.buf.clear()
        transport = self.transport
        transport.close()
        self.loop.call_later(CLOSE_GRACE_S, transport.abort)

    # ---------------------------------------------------------------- graceful stop

    def go_away(self) -> None:
        """No new streams; the connection closes once its streams are done."""
        if not self.closing and self.transport is not None:
            self._write(frame(GOAWAY, 0, 0, _GOAWAY.pack(self.last_sid, NO_ERROR)))
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


async def _unknown(request: Any, context: CallContext) -> Any:  # pragma: no cover - never called
    raise AssertionError


_UNKNOWN = Method(parse=bytes, unary=_unknown)


class Http2GrpcServer:
    """``methods``: ``/package.Service/Method`` -> :class:`Method`; ``gate`` may refuse a call
    before it runs (restricted protocols); ``max_message``: largest request message;
    ``compression``: compress responses (Triton's ``--grpc-infer-response-compression-level``);
    ``guard``: the listener's connection cap; ``budget``: the server's budget of buffered request
    bytes; ``unsent``: its budget of response bytes waiting for clients (flow-control windows,
    the socket; see :meth:`shed`); ``body_timeout_s``: a call whose request message makes no
    progress for that long ends DEADLINE_EXCEEDED (:meth:`Connection.expire_bodies`);
    ``handshake_timeout_s``: the TLS handshake, the connection
    preface and the client's first SETTINGS must be done within it; ``idle_timeout_s``: a
    connection with no open stream and no frame for that long is closed (0 for either: no
    timeout)."""

    def __init__(
        self,
        methods: dict[str, Method],
        max_message: int,
        gate: Gate | None = None,
        compression: ResponseCompression | None = None,
        *,
        guard: ConnectionGuard | None = None,
        budget: ByteBudget | None = None,
        unsent: ByteBudget | None = None,
        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
    ) -> None:
        if handshake_timeout_s < 0 or idle_timeout_s < 0 or body_timeout_s < 0:
            raise ValueError("timeouts must be >= 0 (0: none)")
        self.methods = {path.encode("latin-1"): m for path, m in methods.items()}
        self.max_message = max_message
        self.gate = gate
        self.compression = compression if compression is not None and compression.level > 0 else None
        self.guard = guard
        self.budget = budget
        self.unsent = unsent
        self.shedding = False
        self.handshake_timeout_s = handshake_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.body_timeout_s = body_timeout_s
        # body ticks: one every body_timeout_s / 2; a stream stamps the tick of its last progress
        self.tick = 0
        self.body_timer: asyncio.TimerHandle | None = None
        self.connections: set[Connection] = set()
        self.notes = LimitedLog()  # connection ends (GOAWAY), at most once a second
        self.server: asyncio.Server | None = None
        self.port = 0

    def unsent_tight(self) -> bool:
        """Over half the budget of unsent response bytes is taken: streaming calls whose answers
        wait for their client produce no more until they are sent."""
        unsent = self.unsent
        return unsent is not None and unsent.limit > 0 and unsent.in_use * 2 > unsent.limit

    def unsent_refusal(self, size: int) -> str:
        unsent = self.unsent
        assert unsent is not None
        return (
            f"{size} more response bytes waiting for their client do not fit beside the {unsent.in_use} "
            f"held for other clients (--max-unsent-response-bytes {unsent.limit}); retry later"
        )

    def shed(self, need: int) -> bool:
        """Make room in the budget of unsent response bytes for ``need`` more: the connections
        holding the most of it are ended (:meth:`Connection.shed`), largest first, until it
        fits. True when it fits; False when it cannot (``need`` alone is over the budget)."""
        unsent = self.unsent
        if unsent is None or not unsent.limit or need > unsent.limit or self.shedding:
            return False
        self.shedding = True  # what shedding writes may need room too: it is not shed again
        try:
            holders = [c for c in self.connections if not c.dead and c.held_unsent()]
            holders.sort(key=Connection.held_unsent, reverse=True)
            for conn in holders:
                if unsent.in_use + need <= unsent.limit:
                    break
                conn.shed(
                    f"the server's budget of unsent response bytes is spent (--max-unsent-response-bytes "
                    f"{unsent.limit}); this connection held {conn.held_unsent()} bytes, the most"
                )
        finally:
            self.shedding = False
        return unsent.in_use + need <= unsent.limit

    @property
    def max_buffered(self) -> int:
        """Request bytes one connection may hold undelivered before its window is withheld
        (room for two of the largest messages)."""
        return max(2 * self.max_message, CONNECTION_WINDOW)

    async def start(
        self, host: str, port: int, tls: ssl.SSLContext | None = None, reuse_port: bool = False
    ) -> int:
        """Listen on ``host:port`` (0: any free port), over TLS when ``tls`` is given;
        ``reuse_port``: the workers of one server share the port (SO_REUSEPORT)."""
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: Connection(self),
            host,
            port,
            reuse_address=True,
            reuse_port=reuse_port or None,
            ssl=tls,
            ssl_handshake_timeout=(self.handshake_timeout_s or None) if tls is not None else None,
        )
        self.port = int(self.server.sockets[0].getsockname()[1])
        if self.body_timeout_s:
            self.body_timer = loop.call_later(self.body_timeout_s / 2, self._body_tick)
        return self.port

    def _body_tick(self) -> None:
        """Every half body timeout: a tick, and the calls stuck on their request end."""
        self.tick += 1
        for conn in list(self.connections):
            if conn.streams and not conn.dead:
                conn.expire_bodies(self.tick)
        self.body_timer = asyncio.get_running_loop().call_later(self.body_timeout_s / 2, self._body_tick)

    async def stop(self, grace_s: float | None) -> None:
        """Stop accepting; GOAWAY to every connection; calls in flight may finish for up to
        ``grace_s`` seconds, then the connections close."""
        if self.server is not None:
            self.server.close()
        if self.body_timer is not None:
            self.body_timer.cancel()
            self.body_timer = None
        connections = list(self.connections)
        for conn in connections:
            conn.go_away()
        if grace_s and connections:
            waits = [asyncio.ensure_future(c.wait_idle()) for c in connections]
            _, late = await asyncio.wait(waits, timeout=grace_s)
            for w in late:
                w.cancel()
        for conn in list(self.connections):
            conn.close()
        if self.server is not None:
            await self.server.wait_closed()


def service_methods(servicer: Any, service: Any, module: Any) -> dict[str, Method]:
    """The :class:`Method` table of a protobuf service descriptor served by ``servicer``
    (an object with one coroutine, or async generator, per rpc name)."""
    methods: dict[str, Method] = {}
    for m in service.methods:
        handler = getattr(servicer, m.name, None)
        if handler is None:
            continue
        parse = getattr(module, m.input_type.name).FromString
        path = f"/{service.full_name}/{m.name}"
        if m.client_streaming or m.server_streaming:
            methods[path] = Method(parse=parse, streaming=handler)
        else:
            methods[path] = Method(parse=parse, unary=handler)
    return methods


def grpc_peer(peername: object) -> str:
    """A socket's peer address as gRPC writes it ("ipv4:1.2.3.4:5678", "ipv6:[::1]:5678")."""
    if not isinstance(peername, tuple) or len(peername) < 2:
        return ""
    host, port = peername[0], peername[1]
    return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
