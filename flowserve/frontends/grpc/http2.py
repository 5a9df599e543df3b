"""A lean HTTP/2 server for gRPC on the running asyncio loop (the default gRPC transport).

The code lives in the package ``flowserve.frontends.grpc.h2``, one concern a module (see its
``__init__``); this module re-exports the names the rest of flowserve, the tests and the
benchmarks use, and says what the transport covers and bounds.

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

A large message's bytes are copied at most once in user space, most of them not at all
(``benchmarks/copies.py`` counts it): the
connection is a ``BufferedProtocol``; once a request message's 5-byte prefix declares a large
message (``guard.SMALL`` or more, taken from the request budget; a unary call's, or one of a
streaming call's), the rest of it is read into a buffer of its size as its DATA frames arrive,
straight from the socket while a long frame is arriving (``get_buffer`` hands the transport a
view of it, ``SINK_FROM``), else copied from the server's read buffer, and the message is parsed
from that buffer (an inference request's raw contents stay views of it: ``codec.parse_request``;
on the loop when what protobuf parses is small, ``Method.inline``, else in a thread). A
response that gives its bytes as pieces (``calls.Scattered``: ``codec.WireResponse`` and, on a
stream, ``codec.StreamWireResponse``, a tensor's own buffer) is queued as those pieces
(``calls.Outgoing``), framed as DATA frame heads and views of them, and written with one vectored
write (``writelines``), never joined.

The common small unary call takes a short cut both ways: a request whose one message arrives
whole in one DATA frame (END_STREAM) is parsed from the read as it lies and its call started at
once (``Receiver._data``; a frame cut in its payload takes the general path), and an answer
with nothing queued before it and room in the windows leaves as one DATA frame, in one write
with its HEADERS and trailers (``Sender._send``).

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
INFO for NO_ERROR: idle, evicted), at most one line a second (``flowserve.core.ratelog.LimitedLog``).

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

from flowserve.frontends.grpc.h2.calls import (
    EOF,
    Eof,
    Gate,
    Later,
    Method,
    Refused,
    Stream,
    Streaming,
    Unary,
    retrieved,
)
from flowserve.frontends.grpc.h2.compression import (
    COMPRESS_FROM,
    COMPRESSION_LEVELS,
    ENCODINGS,
    ResponseCompression,
    inflate,
    inflate_rest,
)
from flowserve.frontends.grpc.h2.connection import (
    Connection,
)
from flowserve.frontends.grpc.h2.frames import (
    ACK,
    CANCEL,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    ERROR_NAMES,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
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
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    H2Error,
    frame,
)
from flowserve.frontends.grpc.h2.headers import (
    RESPONSE_HEADERS,
    STATUS_415,
    TRAILERS_OK,
    CallContext,
    decode_block,
    decode_headers,
    grpc_peer,
    grpc_timeout_s,
    header_fields,
    header_list_size,
    literal,
    shown,
    status_block,
)
from flowserve.frontends.grpc.h2.limits import (
    CLOSE_GRACE_S,
    CONN_SEND_AHEAD,
    CONN_SEND_HARD,
    CONNECTION_WINDOW,
    CONTROL_BURST,
    CONTROL_RATE,
    CONTROLS_PER_FLUSH,
    CONTROLS_PER_STREAM,
    CREDITED_FLUSH,
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_WINDOW,
    FRAMES_PER_TURN,
    HEADER_BYTES_PER_FRAME,
    HEADER_BYTES_PER_TOKEN,
    HEADER_FIELDS_PER_TOKEN,
    INFLATE_INLINE,
    MAX_CONTINUATIONS,
    MAX_ECHO,
    MAX_FRAME_IN,
    MAX_HEADER_BLOCK,
    MAX_HEADER_FIELDS,
    MAX_HEADER_LIST,
    MAX_HEADERS_HELD,
    MAX_PENDING_OUT,
    MAX_STALLED_IN,
    MAX_STATUS_MESSAGE,
    MAX_STREAMS,
    MAX_WRITE_BUFFER,
    PARSE_INLINE,
    QUEUE_AHEAD,
    RECENT_RESETS,
    RESET_BURST,
    RESET_RATE,
    SEND_AHEAD,
    STREAM_WINDOW,
    TokenBucket,
)
from flowserve.frontends.grpc.h2.server import (
    Http2GrpcServer,
    service_methods,
)

__all__ = [
    "ACK",
    "CANCEL",
    "CLOSE_GRACE_S",
    "COMPRESSION_ERROR",
    "COMPRESSION_LEVELS",
    "COMPRESS_FROM",
    "CONNECTION_WINDOW",
    "CONN_SEND_AHEAD",
    "CONN_SEND_HARD",
    "CONTINUATION",
    "CONTROLS_PER_FLUSH",
    "CONTROLS_PER_STREAM",
    "CONTROL_BURST",
    "CONTROL_RATE",
    "CREDITED_FLUSH",
    "DATA",
    "DEFAULT_BODY_TIMEOUT_S",
    "DEFAULT_HANDSHAKE_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_WINDOW",
    "ENABLE_PUSH",
    "ENCODINGS",
    "END_HEADERS",
    "END_STREAM",
    "ENHANCE_YOUR_CALM",
    "EOF",
    "ERROR_NAMES",
    "FLOW_CONTROL_ERROR",
    "FRAMES_PER_TURN",
    "FRAME_SIZE_ERROR",
    "GOAWAY",
    "HEADERS",
    "HEADER_BYTES_PER_FRAME",
    "HEADER_BYTES_PER_TOKEN",
    "HEADER_FIELDS_PER_TOKEN",
    "HEADER_TABLE_SIZE",
    "INFLATE_INLINE",
    "INITIAL_WINDOW_SIZE",
    "INTERNAL_ERROR",
    "MAX_CONCURRENT_STREAMS",
    "MAX_CONTINUATIONS",
    "MAX_ECHO",
    "MAX_FRAME_IN",
    "MAX_FRAME_SIZE",
    "MAX_HEADERS_HELD",
    "MAX_HEADER_BLOCK",
    "MAX_HEADER_FIELDS",
    "MAX_HEADER_LIST",
    "MAX_HEADER_LIST_SIZE",
    "MAX_PENDING_OUT",
    "MAX_STALLED_IN",
    "MAX_STATUS_MESSAGE",
    "MAX_STREAMS",
    "MAX_WINDOW",
    "MAX_WRITE_BUFFER",
    "NO_ERROR",
    "PADDED",
    "PARSE_INLINE",
    "PING",
    "PREFACE",
    "PRIORITY",
    "PRIORITY_FLAG",
    "PROTOCOL_ERROR",
    "PUSH_PROMISE",
    "QUEUE_AHEAD",
    "RECENT_RESETS",
    "REFUSED_STREAM",
    "RESET_BURST",
    "RESET_RATE",
    "RESPONSE_HEADERS",
    "RST_STREAM",
    "SEND_AHEAD",
    "SETTINGS",
    "STATUS_415",
    "STREAM_CLOSED",
    "STREAM_WINDOW",
    "TRAILERS_OK",
    "WINDOW_UPDATE",
    "CallContext",
    "Connection",
    "Eof",
    "Gate",
    "H2Error",
    "Http2GrpcServer",
    "Later",
    "Method",
    "Refused",
    "ResponseCompression",
    "Stream",
    "Streaming",
    "TokenBucket",
    "Unary",
    "decode_block",
    "decode_headers",
    "frame",
    "grpc_peer",
    "grpc_timeout_s",
    "header_fields",
    "header_list_size",
    "inflate",
    "inflate_rest",
    "literal",
    "retrieved",
    "service_methods",
    "shown",
    "status_block",
]
