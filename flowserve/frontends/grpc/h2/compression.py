"""Compression glue: request messages inflated within the server's bounds (``grpc-encoding``),
responses compressed as the client accepts (``ResponseCompression``)."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from flowserve.dataplane.inflate import Corrupt, Inflater, OverBudget, TooLarge, finish, inflate_inline
from flowserve.frontends.grpc.h2.calls import Refused

# grpc-encoding -> zlib's wbits (None: the message is not compressed)
ENCODINGS: dict[bytes, int | None] = {
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
        packer = zlib.compressobj(self.level, zlib.DEFLATED, ENCODINGS[encoding] or zlib.MAX_WBITS)
        return packer.compress(message) + packer.flush()


def inflate(data: bytes, wbits: int | None, limit: int) -> bytes | None:
    """A compressed message inflated, or None when it inflates past ``limit`` bytes or past
    ``inflate.RATIO`` times its size (inflating stops there: a small bomb cannot take the
    memory it would expand to); uncounted (the server's path is ``Receiver._message``)."""
    if wbits is None:
        return data
    try:
        return inflate_inline(Inflater(data, wbits, limit, what="request message"), limit + 1)
    except TooLarge:
        return None
    except Corrupt as exc:
        raise zlib.error(exc.message) from None


async def inflate_rest(inflater: Inflater, parse: Callable[[bytes], Any]) -> Any:
    """Finish inflating a message (in a thread, step by step, its bytes counted against the
    budget as they grow: ``inflate.finish``) and parse it (in a thread; protobuf holds the GIL
    while it parses, so what keeps the loop free for large messages is the field bound an
    inference method's parse checks first, fields.py); what the inflater holds is given back
    when it is parsed or refused."""
    try:
        out = await finish(inflater)
        return await asyncio.to_thread(parse, out)
    except (TooLarge, OverBudget) as exc:
        raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED, exc.message) from None
    except (DecodeError, Corrupt) as exc:
        raise Refused(grpc.StatusCode.INTERNAL, f"Failed to parse the request message: {exc}") from None
    finally:
        inflater.release()
