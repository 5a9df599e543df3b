"""HPACK and header handling: request header blocks decoded within their bounds, response
header blocks as constant literals, grpc-status / grpc-message / grpc-timeout, and the
``CallContext`` a servicer gets."""

from __future__ import annotations

from typing import NoReturn

import grpc
import hpack

from flowserve.frontends.grpc.h2.limits import MAX_ECHO, MAX_HEADER_LIST, MAX_STATUS_MESSAGE

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


def shown(name: bytes) -> str:
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


def grpc_peer(peername: object) -> str:
    """A socket's peer address as gRPC writes it ("ipv4:1.2.3.4:5678", "ipv6:[::1]:5678")."""
    if not isinstance(peername, tuple) or len(peername) < 2:
        return ""
    host, port = peername[0], peername[1]
    return f"ipv6:[{host}]:{port}" if ":" in str(host) else f"ipv4:{host}:{port}"
