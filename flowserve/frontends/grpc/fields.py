"""A bound on the protobuf fields of an inference request message, counted before it is parsed.

protobuf (upb) spends tens of nanoseconds per field and holds the GIL while it parses, so a
message of millions of tiny fields stalls every client for seconds and takes gigabytes, within
the message size limit: 20 million empty ``bytes_contents`` entries are 40 MiB and took 0.7 s
and 700 MB to parse (the largest message, 256 MiB, holds 128 million). No legitimate request
needs more fields than the BYTES elements it may carry (``--max-bytes-elements-per-request``;
numeric typed contents are packed, one field each) plus a few for its tensors and parameters.

So the ModelInfer and ModelStreamInfer messages are parsed by :func:`guarded_parser`: one of
more than twice as many bytes as the fields allowed (fewer bytes cannot hold more fields: a
field takes at least two) is walked first, field by field along the message's descriptor,
stopping one past the bound. The walk is Python, so it lets the GIL go while it runs, and the
transport runs it in a worker thread for large messages (``http2.PARSE_INLINE``), except those
whose bytes are nearly all raw contents (``codec.parses_quickly``: the walk skips them, and
protobuf parses only the rest, at most ``PARSE_INLINE`` bytes). Past the
bound: :class:`TooManyFields` (RESOURCE_EXHAUSTED) naming the model and the tensor (input or
output) where the count ran over. A malformed message is left to the parser to refuse.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import Descriptor
from tritonclient.grpc import service_pb2

from flowserve.core.errors import ResourceExhausted
from flowserve.frontends.grpc.codec import parse_request, parses_quickly, read_varint
from flowserve.frontends.grpc.http2 import Method

# fields a request may have besides its BYTES elements (tensors, shapes, parameters, outputs)
OTHER_FIELDS = 1 << 16
_FIXED = {1: 8, 5: 4}  # wire type -> bytes (64-bit, 32-bit)


class TooManyFields(ResourceExhausted):
    """A request message with more protobuf fields than its bound, refused unparsed."""


class _Over(Exception):
    """The walk went past the bound inside the top-level field at ``span`` (None: at the top)."""

    def __init__(self, span: tuple[int, int] | None) -> None:
        self.span = span


def guard_inference(methods: dict[str, Method], max_bytes_elements: int) -> None:
    """ModelInfer and ModelStreamInfer of a native transport's method table parse through
    :func:`guarded_parser`."""
    for name in ("ModelInfer", "ModelStreamInfer"):
        path = f"/inference.GRPCInferenceService/{name}"
        if path in methods:
            parse = guarded_parser(service_pb2.ModelInferRequest, max_bytes_elements, parse_request)
            methods[path] = dataclasses.replace(methods[path], parse=parse, inline=parses_quickly)


def guarded_parser(
    message_class: Any, max_bytes_elements: int, parse: Callable[[bytes | memoryview], Any] | None = None
) -> Callable[[bytes | memoryview], Any]:
    """``parse`` (default ``message_class.FromString``), refusing a message of more than
    ``max_bytes_elements`` + OTHER_FIELDS fields before it is parsed (:class:`TooManyFields`)."""
    if parse is None:
        parse = message_class.FromString
    descriptor: Descriptor = message_class.DESCRIPTOR
    most = max_bytes_elements + OTHER_FIELDS

    def guarded(data: bytes | memoryview) -> Any:
        if len(data) > 2 * most:
            check_fields(descriptor, data, most, max_bytes_elements)
        return parse(data)

    return guarded


def check_fields(
    descriptor: Descriptor, data: bytes | memoryview, most: int, max_bytes_elements: int
) -> None:
    """Raise :class:`TooManyFields` when ``data`` (a message of ``descriptor``) has more than
    ``most`` fields, counting those of its nested messages."""
    try:
        _count(descriptor, data, 0, len(data), most, None)
    except _Over as over:
        model = _string_field(data, 0, len(data), 1)  # ModelInferRequest.model_name
        where = f"model '{model}'"
        if over.span is not None:
            where += f", tensor '{_string_field(data, *over.span, 1)}'"  # its name (field 1)
        raise TooManyFields(
            f"{where}: the request message has more than {most} protobuf fields (its typed "
            f"contents take one per BYTES element), over the server's limit of {max_bytes_elements} "
            "BYTES elements per request (--max-bytes-elements-per-request)"
        ) from None
    except (IndexError, ValueError):  # malformed: the parser says how
        return


def count_fields(descriptor: Descriptor, data: bytes | memoryview, most: int) -> int | None:
    """The fields of ``data`` counted as :func:`check_fields` counts them; None past ``most``."""
    try:
        return most - _count(descriptor, data, 0, len(data), most, None)
    except _Over:
        return None


def _count(
    descriptor: Descriptor,
    buf: bytes | memoryview,
    pos: int,
    end: int,
    left: int,
    span: tuple[int, int] | None,
) -> int:
    """The fields left of the bound once the message at ``buf[pos:end]`` is counted; _Over
    past it. ``span``: where the top-level field being walked lies (None at the top)."""
    fields = descriptor.fields_by_number
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = read_varint(buf, pos - 1)
        left -= 1
        if left < 0:
            raise _Over(span)
        wire = tag & 7
        if wire == 0:
            while buf[pos] >= 0x80:
                pos += 1
            pos += 1
        elif wire == 2:
            length = buf[pos]
            pos += 1
            if length >= 0x80:
                length, pos = read_varint(buf, pos - 1)
            field = fields.get(tag >> 3)
            if field is not None and field.message_type is not None:
                inner = (pos, pos + length) if span is None else span
                left = _count(field.message_type, buf, pos, pos + length, left, inner)
            pos += length
        elif wire in _FIXED:
            pos += _FIXED[wire]
        else:  # groups, or not protobuf: the parser refuses it
            raise ValueError("unsupported wire type")
    if pos != end:
        raise ValueError("a field runs past its message")
    return left


def _string_field(buf: bytes | memoryview, pos: int, end: int, number: int) -> str:
    """The first string field ``number`` of the message at ``buf[pos:end]`` ("" if none), for a
    message (cut to 200 characters)."""
    try:
        while pos < end:
            tag, pos = read_varint(buf, pos)
            wire = tag & 7
            if wire == 0:
                _, pos = read_varint(buf, pos)
            elif wire == 2:
                length, pos = read_varint(buf, pos)
                if tag >> 3 == number:
                    return bytes(buf[pos : pos + min(length, 200)]).decode("utf-8", "replace")
                pos += length
            elif wire in _FIXED:
                pos += _FIXED[wire]
            else:
                return ""
    except (IndexError, ValueError):
        pass
    return ""


__all__ = [
    "OTHER_FIELDS",
    "TooManyFields",
    "check_fields",
    "count_fields",
    "guard_inference",
    "guarded_parser",
]
