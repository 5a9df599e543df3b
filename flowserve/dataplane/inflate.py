"""Compressed requests inflated within bounds no client can get around, for both front ends
(HTTP ``Content-Encoding``, gRPC ``grpc-encoding``; gzip and deflate).

A compressed body is inflated in steps by an :class:`Inflater`, and every step is bounded:

- size: never past ``limit`` (the request or message size limit, ``--max-request-bytes``;
  a JSON body's own limit over HTTP) nor past ``max(RATIO x compressed size, FLOOR)``; a
  body that would grow past either is refused one step past it, naming the bound, having
  inflated no more than that.
- memory: inflated bytes are counted against the server's
  :class:`~flowserve.dataplane.guard.ByteBudget` (``--max-buffered-request-bytes``) as the
  output grows: before each step the inflater takes what that step may produce (steps
  double, from ``FIRST_STEP`` up to ``MAX_STEP``, so a body takes about what it has
  inflated, never more than twice), and refuses when it does not fit. An output under
  ``guard.SMALL`` bytes takes nothing (as requests under SMALL take nothing), so small
  compressed requests make no budget call. What is held is given back by :meth:`release`
  (refused, or the request is done: the front end decides when), and freed memory goes back
  to the system (``memory.py``).
- the loop: :func:`inflate` inflates at most ``INLINE`` bytes of a body on the event loop
  (every small body: no thread hop), and the rest in a worker thread (zlib lets the GIL go),
  one step of at most ``MAX_STEP`` bytes per hop, touching the budget only on the loop,
  between steps. At most ``THREADS`` steps run at once per event loop (process): bombs queue
  for it instead of taking every core from the loop (measured: 20 bombs at once on 2 cores
  made a good client wait 1.3 s for an answer).

Why ``RATIO`` is 400: deflate cannot do better than about 1032:1, and reaches that only on
runs of one byte value (a bomb: zeros). Real tensors compress far less, measured with zlib at
levels 6 and 9 on 16 MiB FP32 tensors of normal values with a share of exact zeros: 90 %
zeros 7:1, 99 % zeros 57-59:1, 99.9 % zeros 359-369:1 (a one-hot or bag-of-words input). So
400 passes every tensor that is mostly, not wholly, zeros, while a bomb is refused after at
most 400 times what its sender sent (the 300 KB bombs of an attack that reached the
request limit of 256 MiB each now stop at 117 MiB). A tensor that is almost wholly one value
(more than 99.99 % zeros, or constant) compresses past 400:1 and is refused above ``FLOOR``:
the message says to send it uncompressed. ``FLOOR`` (4 MiB) lets any body inflate that far
whatever its ratio (a constant mask or state tensor of a few MiB): below it, what bounds a bomb
is the budget, as for any request.
"""

from __future__ import annotations

import asyncio
import weakref
import zlib
from typing import Any

from flowserve.core.errors import InvalidArgument, ResourceExhausted
from flowserve.dataplane.guard import SMALL, ByteBudget
from flowserve.dataplane.memory import trimmer

RATIO = 400  # a compressed body inflates to at most RATIO times its size ...
FLOOR = 4 << 20  # ... or this many bytes, whichever is more (then the request limit)
FIRST_STEP = 1 << 20  # bytes inflated by the first counted step; steps double from here ...
MAX_STEP = 16 << 20  # ... up to this (what one hop to a thread inflates at most)
INLINE = 256 << 10  # bytes inflated on the event loop; the rest of a body inflates in a thread
# compressed bytes handed to zlib per call: a call stopped by its output bound gives back the
# input it did not use as a new bytes (``unconsumed_tail``), so handing it the whole body made
# every step copy the rest of it (a 57 MiB body: about 400 MiB copied in 9 steps)
IN_CHUNK = 1 << 20
THREADS = 1  # steps inflating in worker threads at once, per event loop
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}  # encoding -> zlib's wbits


class TooLarge(ResourceExhausted):
    """The body inflates past the size limit or past ``RATIO`` times its compressed size
    (HTTP 413, gRPC RESOURCE_EXHAUSTED)."""


class OverBudget(ResourceExhausted):
    """The server's budget of buffered request bytes has no room for the inflated bytes (HTTP
    503, gRPC RESOURCE_EXHAUSTED)."""


class Corrupt(InvalidArgument):
    """Not valid compressed data, or cut short (HTTP 400, gRPC INTERNAL)."""


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _turn() -> asyncio.Semaphore:
    """The running loop's semaphore of ``THREADS`` inflating steps."""
    loop = asyncio.get_running_loop()
    turn = _turns.get(loop)
    if turn is None:
        turn = _turns[loop] = asyncio.Semaphore(THREADS)
    return turn


def ceiling(compressed: int, limit: int) -> int:
    """The most bytes a body of ``compressed`` bytes may inflate to under ``limit``."""
    return min(limit, max(RATIO * compressed, FLOOR))


class Inflater:
    """One compressed body, inflated step by step within its bounds.

    ``wbits``: zlib's (``WBITS``); ``limit``: the size limit and ``limit_text`` how a refusal
    names it; ``budget``: the server's budget of buffered request bytes (None: not counted);
    ``what``: what the body is, for messages ("request body", "request message"). Use it on
    the event loop through :func:`inflate`, :func:`inflate_inline` and :func:`finish`:
    :meth:`plan` (takes budget), then :meth:`step` (zlib only, may run in a thread), until
    ``done``; then :meth:`reserve_join`, :meth:`result`, :meth:`unreserve`. :meth:`release`
    gives back all it holds, once, whatever happened."""

    __slots__ = (
        "_input",
        "_offset",
        "_parts",
        "_tail",
        "_zlib",
        "budget",
        "ceiling",
        "compressed",
        "done",
        "held",
        "limit",
        "limit_text",
        "size",
        "what",
    )  # fmt: skip

    def __init__(
        self,
        data: bytes | bytearray | memoryview,
        wbits: int,
        limit: int,
        budget: ByteBudget | None = None,
        what: str = "request body",
        limit_text: str = "",
    ) -> None:
        self.compressed = len(data)
        self.limit = limit
        self.ceiling = ceiling(len(data), limit)
        self.budget = budget
        self.what = what
        self.limit_text = limit_text or f"the server's limit of {limit} bytes (--max-request-bytes)"
        self.size = 0  # bytes inflated so far
        self.held = 0  # bytes taken from the budget (output so far, and the step planned)
        self.done = False
        self._zlib: Any = zlib.decompressobj(wbits)
        self._input = memoryview(data).cast("B")  # the compressed body, handed on IN_CHUNK at a time
        self._offset = 0  # where the next chunk of it starts
        self._tail: bytes = b""  # what zlib left of the last chunk it was given
        self._parts: list[bytes] = []

    def plan(self, cap: int = MAX_STEP) -> int:
        """The most bytes the next step may produce (at most ``cap``), taken from the budget
        beforehand; OverBudget when they do not fit."""
        size = self.size
        step = min(max(size, FIRST_STEP) if size >= SMALL else SMALL, MAX_STEP, cap)
        step = min(step, self.ceiling + 1 - size)  # one byte past the ceiling says "too large"
        need = size + step - self.held
        if size + step > SMALL and need > 0:
            need = max(need, SMALL)  # every take counts (see ByteBudget.take), so give matches it
            budget = self.budget
            if budget is not None and not budget.take(need):
                raise OverBudget(f"decompressing the {self.what}: {budget.refusal(need)}")
            self.held += need
        return step

    def step(self, max_out: int) -> None:
        """Inflate at most ``max_out`` more bytes (zlib only: safe in a worker thread while the
        loop runs on); TooLarge past the bounds, Corrupt on bad data."""
        produced = 0
        unzip, source = self._zlib, self._input
        while produced < max_out and not self.done:
            chunk: bytes | memoryview = self._tail
            if not chunk:
                if self._offset >= len(source):
                    break  # all input used, more output wanted
                chunk = source[self._offset : self._offset + IN_CHUNK]
                self._offset += len(chunk)
            try:
                part = unzip.decompress(chunk, max_out - produced)
            except zlib.error as exc:
                raise Corrupt(f"{self.what} is not valid compressed data: {exc}") from None
            self._tail = unzip.unconsumed_tail
            if not part and len(self._tail) == len(chunk) and not unzip.eof:
                raise Corrupt(f"{self.what} is not valid compressed data: no progress")  # never loop
            produced += len(part)
            self.size += len(part)
            if self.size > self.ceiling:
                self._parts.clear()
                raise TooLarge(self._too_large())
            if part:
                self._parts.append(part)
            self.done = unzip.eof
        if not self.done and produced < max_out:
            raise Corrupt(f"{self.what} is truncated compressed data")

    def reserve_join(self) -> int:
        """Take the budget for joining several parts into one body (both exist while it is
        copied); the amount to give to :meth:`unreserve` after :meth:`result`."""
        if len(self._parts) <= 1 or self.size < SMALL:
            return 0
        budget = self.budget
        if budget is not None and not budget.take(self.size):
            raise OverBudget(f"decompressing the {self.what}: {budget.refusal(self.size)}")
        return self.size

    def unreserve(self, extra: int) -> None:
        if extra and self.budget is not None:
            self.budget.give(extra)

    def result(self) -> bytes:
        """The whole inflated body (call when ``done``, after :meth:`reserve_join`; zlib-free
        work only, so a worker thread may run it)."""
        parts = self._parts
        if len(parts) == 1:
            return parts.pop()
        try:
            return b"".join(parts)
        finally:
            parts.clear()

    def release(self) -> None:
        """Give back what this inflater holds of the budget (once; later calls do nothing),
        and have freed memory given back to the system if it was a lot."""
        held, self.held = self.held, 0
        self._parts.clear()
        if held:
            if self.budget is not None:
                self.budget.give(held)
            trimmer.freed(held)

    def detach(self) -> int:
        """Hand what this inflater holds of the budget to the caller (who gives it back when
        the request is done, and reports it to ``memory.trimmer``)."""
        held, self.held = self.held, 0
        return held

    def _too_large(self) -> str:
        if self.ceiling == self.limit:
            return (
                f"decompressed {self.what} exceeds {self.limit_text} "
                f"(stopped after {self.size} bytes inflated)"
            )
        return (
            f"decompressed {self.what} exceeds {RATIO} times its compressed size of {self.compressed} "
            f"bytes (stopped after {self.size} bytes inflated): a compressed body may inflate to at most "
            f"{RATIO} x its size or {FLOOR} bytes, whichever is more; send data that compresses this "
            "well uncompressed"
        )


def inflate_inline(inflater: Inflater, upto: int) -> bytes | None:
    """Inflate on the calling thread (the loop) while the output stays within ``upto``
    bytes: the whole body, or None when more remains (finish it with :func:`finish`). Errors
    are raised as they are; the caller releases."""
    while not inflater.done:
        room = upto - inflater.size
        if room <= 0:
            return None
        inflater.step(inflater.plan(room))
    extra = inflater.reserve_join()
    try:
        return inflater.result()
    finally:
        inflater.unreserve(extra)


async def finish(inflater: Inflater) -> bytes:
    """Inflate the rest in a worker thread, step by step, and join it; what it holds stays
    held (the caller releases it when the request is done). Errors are raised as they are;
    the caller releases."""
    turn = _turn()
    while not inflater.done:
        async with turn:  # one step at a time per loop (THREADS): the loop keeps a core
            step = inflater.plan()
            await asyncio.to_thread(inflater.step, step)
    extra = inflater.reserve_join()
    try:
        if extra > FIRST_STEP:
            return await asyncio.to_thread(inflater.result)
        return inflater.result()
    finally:
        inflater.unreserve(extra)


async def inflate(inflater: Inflater) -> bytes:
    """The whole inflated body: its first ``INLINE`` bytes on the loop, the rest in a worker
    thread (see :func:`finish`). On an error what it holds is given back before the error is
    raised; on success the caller releases it, or takes it over (:meth:`Inflater.detach`), when done."""
    try:
        out = inflate_inline(inflater, INLINE)
        return out if out is not None else await finish(inflater)
    except BaseException:
        inflater.release()
        raise
