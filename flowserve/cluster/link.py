"""The link between two processes of one server: calls and one-way messages over a Unix socket.

Either side of a :class:`Link` may call the other. A message (and a reply) is any picklable
object; it is pickled with protocol 5 and a ``buffer_callback``, so numpy arrays inside it (and
bytes-like objects wrapped in :class:`pickle.PickleBuffer`) are not copied into the pickle: each
travels as an out-of-band buffer, written to the socket straight from the array's memory and
received straight into a ``bytearray`` that the unpickled array then uses (writable, no further
copy). With :func:`connect` and :func:`serve` the receiving side is a
:class:`asyncio.BufferedProtocol`, so the kernel copies a large buffer directly into its final
``bytearray``; a :class:`Link` built on plain asyncio streams reads it through the stream's buffer.

A buffer of :data:`~flowserve.cluster.arena.SHARED_MIN` bytes or more (256 KiB: a decoded image,
an embedding batch) does not cross the socket at all: the sender copies it once into a block of
shared memory (its :class:`~flowserve.cluster.arena.Arena` for this link) and the frame carries
the block's place; the receiver's array uses the block where it is, and the block is the
sender's again once the last array using it is gone (a RELEASE frame). Measured cost of a hop
per size, socket and shared memory: ``cluster/arena.py`` and ``benchmarks/README.md``.

Frame (little-endian)::

    header   <QBxxxII   message id, frame type, (pad), pickle length, buffer count   (20 bytes)
    pickle   the pickle bytes: (kind, message) for a call or notify, the value for a reply,
             (flowserve?, class name, text, attributes) for an error
    buffers  per out-of-band buffer: <Q length, then that many bytes; or, for a buffer in
             shared memory, <Q length | 2**63, then <QQ segment key, offset

A RELEASE frame (no reply) carries <QQ (segment key, offset) pairs as its "pickle": blocks of the
receiver's arena that the sender of the frame no longer uses.

A frame is at most :data:`MAX_FRAME` bytes (pickle plus buffers) with at most
:data:`MAX_BUFFERS` buffers; a frame that breaks these rules, or has an unknown type, ends the
link (every pending call fails with :class:`Unavailable`).

Calls are multiplexed by id: any number (up to ``max_in_flight`` per link; more wait) may be
pending at once, each incoming call runs in its own task, and replies come back in any order.
An exception in the handler is sent back by class name and text, never pickled: a
:class:`FlowserveError` subclass is raised again on the caller as the same class with the same
message; anything else becomes :class:`InternalError` naming the peer.

The sender's arrays are written from their own memory: do not modify an array passed to
:meth:`Link.call` until the call returns, nor one returned by a handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import pickle
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

import numpy as np

from flowserve.cluster.arena import SHARED_MIN, Arena, Mapping, available
from flowserve.core import errors
from flowserve.core.errors import (
    ErrorCode,
    FlowserveError,
    InternalError,
    ResourceExhausted,
    SpecIssue,
    Unavailable,
    Unsupported,
)

log = logging.getLogger("flowserve.cluster")

Handler = Callable[[str, Any], Awaitable[Any]]  # (kind, message) -> reply

HEADER = struct.Struct("<QBxxxII")  # message id, type, pickle length, buffer count
LENGTH = struct.Struct("<Q")  # one out-of-band buffer's length
SHARED_REF = struct.Struct("<QQ")  # a buffer in shared memory: segment key, offset
SHARED_FLAG = 1 << 63  # in a buffer's length: the buffer is in shared memory
CALL, REPLY, ERROR, NOTIFY, RELEASE = 1, 2, 3, 4, 5
MAX_FRAME = 2 << 30  # bytes of pickle plus buffers in one frame
MAX_BUFFERS = 1 << 16
# buffers smaller than this are copied into the frame's leading chunk (one write); larger ones are
# written from their own memory
_INLINE = 64 << 10
_STAGING = 256 << 10  # the buffered protocol's buffer for headers and pickles
_WRITE_HIGH = 1 << 20  # transport write buffer high-water mark
_SOCKET_BUFFER = 1 << 20  # SO_SNDBUF / SO_RCVBUF asked for
_PLAIN = (str, int, float, bool, type(None), SpecIssue)


class CorruptFrame(Exception):
    """A frame that breaks the format: the link ends."""


class ByteSource(Protocol):
    """What a link reads from: an :class:`asyncio.StreamReader`, or this module's protocol."""

    async def readexactly(self, n: int, /) -> bytes | bytearray: ...


class Link:
    """One connection between two processes; either side may call the other."""

    def __init__(
        self,
        reader: ByteSource,
        writer: ByteSink,
        handler: Handler | None,
        name: str,
        max_in_flight: int = 4096,
        shared: bool = True,
    ) -> None:
        self.name = name  # the peer, for error messages ("worker 2 (pid 1234)")
        self.on_close: Callable[[Link], None] | None = None
        self._reader = reader
        self._writer = writer
        self.handler = handler  # may be replaced at any time (the next incoming call uses it)
        self._slots = asyncio.Semaphore(max_in_flight)
        self._next_id = 0
        self._pending: dict[int, tuple[asyncio.Future[Any], str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # large buffers go through shared memory (cluster/arena.py): ours to send, theirs received
        self._shared = shared and available()
        self._arena: Arena | None = None
        self._mapping = Mapping(self._released)
        self._to_release: list[tuple[int, int]] = []
        self._loop = asyncio.get_running_loop()
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._read_task = asyncio.create_task(self._read_loop(), name=f"link {name}")

    def __repr__(self) -> str:
        return f"<Link {self.name}{' closed' if self._closed else ''}>"

    @classmethod
    async def connect(cls, path: str, handler: Handler | None, name: str, shared: bool = True) -> Link:
        """Connect to the :func:`serve` at ``path``; ``name`` names that side. ``shared``: large
        buffers this side sends go through shared memory (module docstring)."""
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_unix_connection(lambda: _LinkProtocol(loop), path)
        return cls(protocol, protocol.writer(transport), handler, name, shared=shared)

    @property
    def arena(self) -> Arena | None:
        """The shared memory this side sent large buffers through (None: none sent yet)."""
        return self._arena

    @property
    def shared_received(self) -> int:
        """Buffers received through shared memory so far."""
        return self._mapping.received

    # -- calling the peer -------------------------------------------------------------------

    async def call(self, kind: str, message: Any, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """Send ``message`` to the peer's handler as ``kind`` and return its reply.

        Raises what the handler raised (see the module docstring), :class:`Unavailable` when the
        link ends before the reply or no reply came within ``timeout`` seconds.
        """
        async with self._slots:
            if self._closed:
                raise Unavailable(f"{self.name} went away before handling '{kind}'")
            self._next_id += 1
            mid = self._next_id
            future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._pending[mid] = (future, kind)
            try:
                await self._send(mid, CALL, (kind, message))
                if timeout is None:
                    return await future
                try:
                    async with asyncio.timeout(timeout):
                        return await future
                except TimeoutError:
                    raise Unavailable(f"{self.name} did not answer '{kind}' within {timeout:g} s") from None
            finally:
                self._pending.pop(mid, None)

    async def notify(self, kind: str, message: Any) -> None:
        """Send ``message`` to the peer's handler as ``kind``; no reply, errors are logged there."""
        if self._closed:
            raise Unavailable(f"{self.name} went away before handling '{kind}'")
        await self._send(0, NOTIFY, (kind, message))

    # -- ending -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    async def wait_closed(self) -> None:
        """Return once the link has ended, for whatever reason."""
        await asyncio.shield(self._done)

    async def close(self) -> None:
        """End the link: pending calls fail with :class:`Unavailable`, handler tasks are cancelled."""
        self._shutdown()
        current = asyncio.current_task()
        tasks = [t for t in (self._read_task, *self._tasks) if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(OSError, RuntimeError):
            await self._writer.wait_closed()

    def _shutdown(self, reason: BaseException | None = None) -> None:
        """End the link at once (idempotent): close the socket, fail the pending calls."""
        if self._closed:
            return
        self._closed = True
        if reason is not None:
            log.warning("link to %s ended: %s", self.name, reason)
        self._writer.close()
        if self._arena is not None:
            self._arena.close()
        self._mapping.close()
        pending, self._pending = self._pending, {}
        for future, kind in pending.values():
            if not future.done():
                future.set_exception(Unavailable(f"{self.name} went away while handling '{kind}'"))
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()
        if not self._done.done():
            self._done.set_result(None)
        if self.on_close is not None:
            try:
                self.on_close(self)
            except Exception:
                log.exception("on_close of the link to %s failed", self.name)

    # -- writing ----------------------------------------------------------------------------

    async def _send(self, mid: int, kind: int, obj: Any) -> None:
        if self._shared and self._arena is None:
            self._arena = Arena()
        try:
            chunks = encode(mid, kind, obj, self._arena if self._shared else None)
        except FlowserveError:
            raise
        except Exception as exc:  # not picklable
            what = f"'{obj[0]}'" if kind in (CALL, NOTIFY) else "a reply"
            raise InternalError(f"cannot send {what} to {self.name}: {type(exc).__name__}: {exc}") from exc
        if self._closed:
            raise Unavailable(f"{self.name} went away")
        for chunk in chunks:
            self._writer.write(chunk)
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self._shutdown(exc)
            raise Unavailable(f"{self.name} went away: {exc}") from None

    # -- reading ----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        reason: BaseException | None = None
        try:
            while True:
                mid, kind, payload, buffers = await self._read_frame()
                self._dispatch(mid, kind, payload, buffers)
                del buffers  # a shared block is released once its last user is gone
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the peer went away: the pending calls say so
        except CorruptFrame as exc:
            reason = exc
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            reason = exc
            log.exception("link to %s failed", self.name)
        finally:
            self._shutdown(reason)

    async def _read_frame(self) -> tuple[int, int, bytes | bytearray, list[bytearray | np.ndarray]]:
        reader = self._reader
        mid, kind, size, count = HEADER.unpack(await reader.readexactly(HEADER.size))
        if kind not in (CALL, REPLY, ERROR, NOTIFY, RELEASE):
            raise CorruptFrame(f"unknown frame type {kind} from {self.name}")
        if size > MAX_FRAME or count > MAX_BUFFERS:
            raise CorruptFrame(f"frame of {size} pickle bytes and {count} buffers from {self.name}")
        payload = await reader.readexactly(size)
        buffers: list[bytearray | np.ndarray] = []
        total = size
        for _ in range(count):
            (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
            shared = bool(length & SHARED_FLAG)
            length &= SHARED_FLAG - 1
            total += length
            if total > MAX_FRAME:
                raise CorruptFrame(f"frame of more than {MAX_FRAME} bytes from {self.name}")
            if shared:
                key, offset = SHARED_REF.unpack(await reader.readexactly(SHARED_REF.size))
                buffers.append(self._shared_view(key, offset, length))
                continue
            buffer = bytearray(length)
            await _read_into(reader, memoryview(buffer))
            buffers.append(buffer)
        return mid, kind, payload, buffers

    def _shared_view(self, key: int, offset: int, length: int) -> np.ndarray:
        try:
            return self._mapping.view(key, offset, length)
        except (OSError, ValueError) as exc:
            raise CorruptFrame(f"a shared buffer from {self.name} that cannot be read: {exc}") from None

    # -- shared memory ------------------------------------------------------------------------

    def _released(self, key: int, offset: int) -> None:
        """A block the peer sent is no longer used here (from any thread, at any time)."""
        self._to_release.append((key, offset))
        if len(self._to_release) == 1:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to tell
                self._loop.call_soon_threadsafe(self._send_releases)

    def _send_releases(self) -> None:
        pending, self._to_release = self._to_release, []
        if not pending or self._closed:
            return
        body = b"".join(SHARED_REF.pack(key, offset) for key, offset in pending)
        self._writer.write(HEADER.pack(0, RELEASE, len(body), 0) + body)

    def _releases(self, payload: bytes | bytearray) -> None:
        arena = self._arena
        if arena is None or len(payload) % SHARED_REF.size:
            return
        for key, offset in SHARED_REF.iter_unpack(payload):
            arena.release(key, offset)

    def _dispatch(
        self, mid: int, kind: int, payload: bytes | bytearray, buffers: list[bytearray | np.ndarray]
    ) -> None:
        if kind == RELEASE:
            self._releases(payload)
            return
        if kind in (REPLY, ERROR):
            entry = self._pending.get(mid)
            if entry is None or entry[0].done():
                return  # a late reply: its call timed out or was cancelled
            future, what = entry
            try:
                value = pickle.loads(payload, buffers=buffers)
            except Exception as exc:
                future.set_exception(
                    InternalError(f"{self.name}: cannot decode the reply to '{what}': {exc}")
                )
                return
            if kind == REPLY:
                future.set_result(value)
            else:
                future.set_exception(self._error(value))
            return
        try:
            what, message = pickle.loads(payload, buffers=buffers)
        except Exception as exc:
            if kind == CALL:
                text = f"cannot decode the call: {type(exc).__name__}: {exc}"
                self._spawn(self._reply_error(mid, False, "InternalError", text, {}))
            else:
                log.error("cannot decode a message from %s: %s", self.name, exc)
            return
        self._spawn(self._handle(mid if kind == CALL else None, what, message))

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, mid: int | None, kind: str, message: Any) -> None:
        try:
            if self.handler is None:
                raise Unsupported(f"this side of the link accepts no '{kind}'")
            result = await self.handler(kind, message)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if mid is None:
                log.exception("'%s' from %s failed", kind, self.name)
                return
            if isinstance(exc, FlowserveError):
                await self._reply_error(mid, True, type(exc).__name__, exc.message, _attributes(exc))
            else:
                await self._reply_error(mid, False, type(exc).__name__, str(exc), {})
            return
        if mid is None:
            return
        try:
            await self._send(mid, REPLY, result)
        except Unavailable:
            pass  # the caller went away; its side says so
        except Exception as exc:  # the reply could not be pickled
            await self._reply_error(
                mid, False, "InternalError", f"cannot send the reply to '{kind}': {exc}", {}
            )

    async def _reply_error(
        self, mid: int, flowserve: bool, cls: str, text: str, attrs: dict[str, Any]
    ) -> None:
        with contextlib.suppress(Unavailable):
            await self._send(mid, ERROR, (flowserve, cls, text, attrs))

    def _error(self, value: Any) -> Exception:
        try:
            flowserve, cls_name, text, attrs = value
        except (TypeError, ValueError):
            return InternalError(f"{self.name}: a malformed error reply: {value!r}")
        if not flowserve:
            return InternalError(f"{self.name}: {cls_name}: {text}")
        cls = getattr(errors, str(cls_name), None)
        if not (isinstance(cls, type) and issubclass(cls, FlowserveError)):
            return InternalError(text)
        # built without its own __init__ (NodeError and SpecError take other arguments)
        exc = cls.__new__(cls)
        Exception.__init__(exc, text)
        exc.message = text
        for key, item in dict(attrs).items():
            with contextlib.suppress(Exception):
                setattr(exc, key, ErrorCode(item) if key == "code" else item)
        return exc


def _attributes(exc: FlowserveError) -> dict[str, Any]:
    """An error's plain-data attributes (NodeError's graph, node and code), to rebuild it."""
    out: dict[str, Any] = {}
    for key, value in vars(exc).items():
        if key == "message":
            continue
        if isinstance(value, ErrorCode):
            out[key] = value.value
        elif isinstance(value, _PLAIN) or (
            isinstance(value, list | tuple) and all(isinstance(v, _PLAIN) for v in value)
        ):
            out[key] = value
    return out


def _array(dtype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """A numeric array from its buffer (see :class:`_Pickler`)."""
    return np.frombuffer(data, dtype).reshape(shape)


class _Pickler(pickle.Pickler):
    """Protocol 5 with numeric arrays as ``_array(dtype string, shape, buffer)``: numpy's own
    reduction pickles the dtype as an object (a call and its state) and rebuilds through its
    own helper: with the requests' own reductions (``core/types.py``), a spilled request with a
    1-element array and its answer pickle and unpickle in 23 us instead of 35. The
    array is the same on arrival: same dtype (byte order included), shape and values, on the
    received buffer; other arrays (objects, structured, subclasses) pickle as numpy does."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not np.ndarray or obj.dtype.kind not in "biufc":
            return NotImplemented
        if not obj.flags.c_contiguous:
            obj = np.ascontiguousarray(obj)
        return _array, (obj.dtype.str, obj.shape, pickle.PickleBuffer(obj))


def encode(mid: int, kind: int, obj: Any, arena: Arena | None = None) -> list[bytes | bytearray | memoryview]:
    """One frame as the chunks to write: small parts joined, large buffers as views of their
    memory, or (with an ``arena``) copied into shared memory, the frame carrying their place."""
    raws: list[memoryview] = []
    out = io.BytesIO()
    _Pickler(out, 5, buffer_callback=lambda b: raws.append(b.raw())).dump(obj)
    payload = out.getvalue()
    if not raws:
        return [HEADER.pack(mid, kind, len(payload), 0) + payload]
    if len(raws) > MAX_BUFFERS or len(payload) + sum(r.nbytes for r in raws) > MAX_FRAME:
        raise ResourceExhausted(f"a message over {MAX_FRAME} bytes or {MAX_BUFFERS} buffers")
    chunks: list[bytes | bytearray | memoryview] = []
    head = bytearray(HEADER.pack(mid, kind, len(payload), len(raws)))
    head += payload
    for raw in raws:
        place = arena.put(raw) if arena is not None and raw.nbytes >= SHARED_MIN else None
        if place is not None:
            head += LENGTH.pack(raw.nbytes | SHARED_FLAG)
            head += SHARED_REF.pack(*place)
            continue
        head += LENGTH.pack(raw.nbytes)
        if raw.nbytes < _INLINE:
            head += raw
        else:
            chunks.append(head)
            chunks.append(raw)
            head = bytearray()
    if head:
        chunks.append(head)
    return chunks


async def _read_into(reader: ByteSource, view: memoryview) -> None:
    if isinstance(reader, _LinkProtocol):
        await reader.readinto(view)
        return
    if isinstance(reader, asyncio.StreamReader):
        position = 0
        while position < len(view):
            chunk = await reader.read(min(len(view) - position, 1 << 20))
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(view[:position]), len(view))
            view[position : position + len(chunk)] = chunk
            position += len(chunk)
        return
    view[:] = await reader.readexactly(len(view))


class ByteSink(Protocol):
    """What a link writes to: an :class:`asyncio.StreamWriter`, or this module's writer."""

    def write(self, data: bytes | bytearray | memoryview, /) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...

    async def wait_closed(self) -> None: ...


class _Writer:
    """The writing half of :class:`_LinkProtocol`'s connection."""

    def __init__(self, transport: asyncio.Transport, protocol: _LinkProtocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def write(self, data: bytes | bytearray | memoryview, /) -> None:
        self._transport.write(data)

    async def drain(self) -> None:
        await self._protocol.drain()

    def close(self) -> None:
        self._transport.close()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._protocol.closed)


class _LinkProtocol(asyncio.BufferedProtocol):
    """A Unix-socket protocol the kernel reads into directly.

    Headers and pickles land in a staging buffer; a large buffer (:meth:`readinto`) is handed to
    the transport as the place to read into, so it is filled with no copy in user space.
    (uvloop reads into a protocol's own buffers only when it is not an :class:`asyncio.Protocol`,
    hence write flow control here rather than asyncio's ``FlowControlMixin``.)
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_connect: Callable[[_LinkProtocol, asyncio.Transport], None] | None = None,
    ) -> None:
        self._loop = loop
        self._on_connect = on_connect
        self._staging = bytearray(_STAGING)
        self._view = memoryview(self._staging)
        self._start = 0
        self._end = 0
        self._target: memoryview | None = None
        self._filled = 0
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._error: BaseException | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = loop.create_future()

    def writer(self, transport: asyncio.BaseTransport) -> _Writer:
        # uvloop's transports are not subclasses of asyncio.Transport but have its methods
        return _Writer(cast(asyncio.Transport, transport), self)

    # -- asyncio.BufferedProtocol -------------------------------------------------------------

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)
        self._transport = transport
        transport.set_write_buffer_limits(high=_WRITE_HIGH)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
        if self._on_connect is not None:
            self._on_connect(self, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None:
            return self._target[self._filled :]
        if self._end == len(self._staging) and self._start > 0:
            self._compact()
        return self._view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None:
            self._filled += nbytes
            if self._filled >= len(self._target):
                self._target = None
                self._wake()
            return
        self._end += nbytes
        self._wake()
        if self._end == len(self._staging):
            if self._start > 0:
                self._compact()
            else:
                self._pause_reading()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._wake()
        self.resume_writing()
        if not self.closed.done():
            self.closed.set_result(None)

    # -- writing ------------------------------------------------------------------------------

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def drain(self) -> None:
        if self.closed.done() or (self._transport is not None and self._transport.is_closing()):
            raise ConnectionResetError("connection lost")
        if not self._writing_paused:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter
        if self.closed.done():
            raise ConnectionResetError("connection lost")

    # -- reading ------------------------------------------------------------------------------

    async def readexactly(self, n: int, /) -> bytes | bytearray:
        if n > len(self._staging):
            out = bytearray(n)
            await self.readinto(memoryview(out))
            return out
        while self._end - self._start < n:
            if self._end + (n - (self._end - self._start)) > len(self._staging):
                self._compact()
            await self._wait(bytes(self._view[self._start : self._end]), n)
        data = bytes(self._view[self._start : self._start + n])
        self._consumed(n)
        return data

    async def readinto(self, view: memoryview) -> None:
        """Fill ``view`` from the stream: what is staged first, then straight from the socket."""
        have = min(self._end - self._start, len(view))
        view[:have] = self._view[self._start : self._start + have]
        self._consumed(have)
        if have == len(view):
            return
        self._target = view
        self._filled = have
        while self._target is not None:
            await self._wait(bytes(view[: self._filled]), len(view))

    def _consumed(self, n: int) -> None:
        self._start += n
        if self._start == self._end:
            self._start = self._end = 0
        if self._reading_paused and self._end < len(self._staging):
            self._reading_paused = False
            if self._transport is not None:
                self._transport.resume_reading()

    async def _wait(self, partial: bytes, expected: int) -> None:
        if self._error is not None:
            raise ConnectionResetError(str(self._error))
        if self._eof:
            raise asyncio.IncompleteReadError(partial, expected)
        if self._reading_paused and self._transport is not None:
            self._reading_paused = False
            self._transport.resume_reading()
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _compact(self) -> None:
        size = self._end - self._start
        self._staging[:size] = self._staging[self._start : self._end]
        self._start, self._end = 0, size
        if self._reading_paused and self._transport is not None:
            self._reading_paused = False
            self._transport.resume_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused and self._transport is not None:
            self._reading_paused = True
            self._transport.pause_reading()


async def serve(
    path: str,
    handler: Handler,
    on_link: Callable[[Link], None] | None = None,
    name: str = "peer",
    shared: bool = True,
) -> asyncio.Server:
    """A Unix-socket server at ``path``; each accepted connection becomes a :class:`Link`
    with ``handler``, named ``name`` (``shared``: as for :meth:`Link.connect`), and is passed
    to ``on_link``."""
    loop = asyncio.get_running_loop()

    def connected(protocol: _LinkProtocol, transport: asyncio.Transport) -> None:
        link = Link(protocol, protocol.writer(transport), handler, name, shared=shared)
        if on_link is not None:
            try:
                on_link(link)
            except Exception:
                log.exception("on_link for %s failed", name)

    return await loop.create_unix_server(lambda: _LinkProtocol(loop, connected), path)
