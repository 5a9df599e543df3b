"""The bounds of the HTTP/2 gRPC transport: windows, frame and header sizes, per-stream and
per-connection budgets, token buckets for control frames and resets, timeouts, and the
rate-limited log (what each bound answers: ``http2``'s module docstring)."""

from __future__ import annotations

import asyncio
import logging

from flowserve.core.ratelog import LimitedLog
from flowserve.frontends.grpc.h2.frames import (
    ENHANCE_YOUR_CALM,
    H2Error,
)

log = logging.getLogger("flowserve.grpc")


def limited_log() -> LimitedLog:
    """The transport's log of connection ends: at most one line a second (core.ratelog)."""
    return LimitedLog(log)


DEFAULT_WINDOW = 65_535
# what this server lets a peer send ahead: per stream, and on the connection as a whole
STREAM_WINDOW = 16 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
# requests of one streaming call parsed but not yet read by the servicer, beyond which the
# stream's window is given back only as the servicer reads (the client then waits)
QUEUE_AHEAD = 64
MAX_STREAMS = 4096
MAX_FRAME_IN = 1 << 20  # SETTINGS_MAX_FRAME_SIZE advertised: 16 DATA frames to parse per 16 MiB, not 1,024
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
# the server's read buffer (connections of its loop take turns: what a read leaves in it is
# handled, or copied out, before the next read)
READ_BUFFER = 256 * 1024
# a DATA frame's payload of at least this many bytes still to come, for a message read into its
# own buffer, is read straight into it (no copy in user space)
SINK_FROM = 64 * 1024
# a response message of at least this many bytes is queued and framed as it is, its bytes never
# copied (DATA frame heads and views of it, in one vectored write); smaller ones are copied once
SCATTER_FROM = 64 * 1024
# frames pending for one write are joined into one buffer below this size, else written as
# they are (``writelines``)
JOIN_BELOW = 64 * 1024
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
# request messages larger than this are parsed in a worker thread, unless their method says
# their parse is quick whatever their size (``calls.Method.inline``: an inference request whose
# bytes are nearly all raw contents, parsed as views)
PARSE_INLINE = 1 << 20
# seconds a connection that was told to go away may take to read it before it is cut
CLOSE_GRACE_S = 2.0
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 300.0
DEFAULT_BODY_TIMEOUT_S = 30.0  # as HTTP's --http-body-timeout-secs


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
