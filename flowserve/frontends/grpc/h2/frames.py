"""HTTP/2 frames: types, flags, error codes, settings, the frame header codec (RFC 9113 sections 4, 6, 7)."""

from __future__ import annotations

import struct

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

FRAME_HEAD = struct.Struct(">BHBBL")  # length (24 bits as 8 + 16), type, flags, stream id
SETTING = struct.Struct(">HL")
WINDOW = struct.Struct(">L")
GOAWAY_BODY = struct.Struct(">LL")
MAX_WINDOW = 2**31 - 1


def frame(ftype: int, flags: int, sid: int, payload: bytes | bytearray = b"") -> bytes:
    n = len(payload)
    return FRAME_HEAD.pack(n >> 16, n & 0xFFFF, ftype, flags, sid) + payload


class H2Error(Exception):
    """A connection error (RFC 9113 section 5.4.1): GOAWAY with ``code``, then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
