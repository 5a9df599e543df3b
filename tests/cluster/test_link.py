"""The link between worker processes (flowserve/cluster/link.py): calls, out-of-band tensors,
errors, and every way a link can end."""

from __future__ import annotations

import asyncio
import mmap
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import uvloop

from flowserve.cluster import arena as arenamod
from flowserve.cluster import link as linkmod
from flowserve.cluster.link import Link, serve
from flowserve.core.errors import InternalError, InvalidArgument, NodeError, Unavailable


@pytest.fixture
def sock_dir() -> Iterator[str]:
    # AF_UNIX paths are limited to 108 bytes: pytest's tmp_path can be longer
    path = tempfile.mkdtemp(prefix="fsl", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def echo(kind: str, message: Any) -> Any:
    if kind == "echo":
        return message
    if kind == "sleep":
        await asyncio.sleep(message)
        return message
    if kind == "invalid":
        raise InvalidArgument(f"bad input '{message}'")
    if kind == "value":
        raise ValueError("no good")
    if kind == "unpicklable":
        return lambda: None
    if kind == "node":
        raise NodeError("pipe", "step", InvalidArgument("shape [3] is not [4]"))
    raise InvalidArgument(f"unknown kind {kind}")


class Pair:
    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.client: Link | None = None
        self.accepted: list[Link] = []

    @property
    def remote(self) -> Link:
        assert self.accepted
        return self.accepted[0]


@pytest.fixture
async def pair(sock_dir: str) -> AsyncIterator[Pair]:
    out = Pair()
    path = str(Path(sock_dir) / "s")
    out.server = await serve(path, echo, out.accepted.append, name="client")
    out.client = await Link.connect(path, echo, "server")
    for _ in range(100):
        if out.accepted:
            break
        await asyncio.sleep(0.01)
    try:
        yield out
    finally:
        await out.client.close()
        for link in out.accepted:
            await link.close()
        out.server.close()
        await out.server.wait_closed()


async def test_round_trip_of_nested_tensors(pair: Pair) -> None:
    assert pair.client is not None
    big = np.arange(16 << 20, dtype=np.float32)  # 64 MiB
    message = {
        "inputs": {
            "f32": np.linspace(0, 1, 16, dtype=np.float32),
            "i64": np.arange(12, dtype=np.int64).reshape(3, 4),
            "u8": np.frombuffer(b"hello world", dtype=np.uint8),
            "bool": np.array([True, False, True]),
            "f16": np.ones((2, 2), dtype=np.float16),
            "bytes": np.array([b"a", b"bc"], dtype=object),
            "big": big,
            "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
            "strided": np.arange(20, dtype=np.float64).reshape(4, 5)[:, 1::2],
            "fortran": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
            "scalar": np.array(7.5, dtype=np.float32),
            "empty": np.zeros((0, 3), dtype=np.uint32),
            "complex": np.array([1 + 2j], dtype=np.complex64),
            "structured": np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
        },
        "meta": [1, "two", (3.0, None)],
        "raw": pickle.PickleBuffer(bytearray(b"x" * 100_000)),
    }
    reply = await pair.client.call("echo", message)
    assert reply["meta"] == [1, "two", (3.0, None)]
    for key, array in message["inputs"].items():  # type: ignore[attr-defined]
        got = reply["inputs"][key]
        assert got.dtype == array.dtype and got.shape == array.shape
        assert np.array_equal(got, array)
        assert got.flags.writeable == array.flags.writeable, key  # a model may change its inputs
    got = reply["inputs"]["big"]
    # received as a writable view of shared memory, not rebuilt from a copy inside the pickle
    assert got.flags.writeable
    assert isinstance(_memory_of(got), mmap.mmap)
    assert _memory_of(reply["inputs"]["f32"]) is not None  # small: through the socket
    assert bytes(reply["raw"]) == b"x" * 100_000
    # the pickle itself stays small: the arrays travel beside it
    chunks = linkmod.encode(1, linkmod.CALL, ("echo", message))
    _, _, pickle_bytes, count = linkmod.HEADER.unpack(bytes(chunks[0][: linkmod.HEADER.size]))
    assert pickle_bytes < 4096 and count >= 6
    assert any(isinstance(c, memoryview) and c.nbytes == big.nbytes for c in chunks)


def _memory_of(array: np.ndarray) -> object:
    """What finally holds an array's bytes (a bytearray, an mmap, ...)."""
    base: object = array
    while isinstance(base, memoryview | np.ndarray):
        base = base.obj if isinstance(base, memoryview) else base.base
    return base


async def _until(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def test_a_large_tensor_crosses_through_shared_memory_and_its_block_comes_back(sock_dir: str) -> None:
    seen: list[Any] = []

    async def keep(kind: str, message: Any) -> Any:
        array = message["x"]
        seen.append((_memory_of(array), array.flags.writeable, float(array.flat[7])))
        return {"sum": float(array.sum())}

    accepted: list[Link] = []
    server = await serve(str(Path(sock_dir) / "s"), keep, accepted.append)
    client = await Link.connect(str(Path(sock_dir) / "s"), None, "server")
    try:
        image = np.arange(3 * 224 * 224, dtype=np.float32).reshape(3, 224, 224)  # 588 KiB
        for _ in range(5):
            reply = await client.call("f", {"x": image})
            assert reply["sum"] == float(image.sum())
        memory, writeable, value = seen[0]
        # the receiver's array is the shared block itself: no copy through the socket or pickle
        assert isinstance(memory, mmap.mmap) and writeable and value == 7.0
        arena = client.arena
        assert arena is not None and arena.sent == 5 and accepted[0].shared_received == 5
        # each call's block was released once the handler was done with it, and reused
        await _until(lambda: arena.in_use == 0)
        assert arena.bytes == arenamod.SEGMENT_BYTES  # one segment of 1 MiB blocks
        # what travelled through the socket: the frame, not the 588 KiB
        chunks = linkmod.encode(1, linkmod.CALL, ("f", {"x": image}), arena)
        assert sum(len(c) for c in chunks) < 1024
    finally:
        await client.close()
        for link in accepted:
            await link.close()
        server.close()


async def test_a_block_the_receiver_keeps_stays_its_own(sock_dir: str) -> None:
    kept: list[np.ndarray] = []

    async def store(kind: str, message: Any) -> Any:
        kept.append(message["x"])
        return None

    accepted: list[Link] = []
    server = await serve(str(Path(sock_dir) / "s"), store, accepted.append)
    client = await Link.connect(str(Path(sock_dir) / "s"), None, "server")
    try:
        for value in (1.0, 2.0, 3.0):
            await client.call("f", {"x": np.full(1 << 18, value, np.float32)})  # 1 MiB each
        assert [float(k[0]) for k in kept] == [1.0, 2.0, 3.0]  # none overwritten by a later call
        arena = client.arena
        assert arena is not None and arena.in_use == 3
        kept.pop(0)
        await _until(lambda: arena.in_use == 2)  # released once the receiver dropped it
    finally:
        await client.close()
        for link in accepted:
            await link.close()
        server.close()


async def test_a_full_arena_or_a_small_tensor_goes_through_the_socket(pair: Pair) -> None:
    assert pair.client is not None
    small = np.ones(1000, np.float32)
    reply = await pair.client.call("echo", {"x": small})
    assert isinstance(_memory_of(reply["x"]), bytearray)
    arena = pair.client.arena
    assert arena is not None and arena.sent == 0
    arena.capacity = 0  # full: no segment may be made
    big = np.ones(1 << 20, np.float32)
    reply = await pair.client.call("echo", {"x": big})
    assert np.array_equal(reply["x"], big) and arena.sent == 0 and arena.full == 1


def test_no_room_in_dev_shm_is_a_fallback_not_a_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small /dev/shm (a container's 64 MiB default): the segment's pages are reserved before
    anything is written, so a lack of room is ENOSPC and the socket, never a SIGBUS."""

    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(arenamod.os, "posix_fallocate", no_room)
    arena = arenamod.Arena()
    first = arenamod.SHM_DIR / arenamod.segment_name((os.getpid() << 32) | (arena._number << 16))
    try:
        assert arena.put(memoryview(np.ones(1 << 20, np.uint8))) is None
        assert arena.full == 1 and arena.bytes == 0
        assert arena.put(memoryview(np.ones(1 << 20, np.uint8))) is None  # not tried again
        assert not first.exists()  # the file that could not be reserved is removed
    finally:
        arena.close()


async def test_a_shared_block_outside_its_segment_ends_the_link(pair: Pair) -> None:
    assert pair.client is not None
    await pair.client.call("echo", {"x": np.ones(1 << 18, np.float32)})
    arena = pair.client.arena
    assert arena is not None
    key = next(iter(arena._segments))
    frame = (
        linkmod.HEADER.pack(9, linkmod.CALL, 0, 1)
        + linkmod.LENGTH.pack((1 << 30) | linkmod.SHARED_FLAG)
        + linkmod.SHARED_REF.pack(key, 0)
    )
    pair.client._writer.write(frame)
    await asyncio.wait_for(pair.remote.wait_closed(), 5)


async def test_a_thousand_concurrent_calls_answered_out_of_order(pair: Pair) -> None:
    assert pair.client is not None
    delays = [((i * 7919) % 1000) / 20_000 for i in range(1000)]  # 0 .. 50 ms, shuffled
    order: list[int] = []

    async def one(i: int) -> None:
        assert pair.client is not None
        assert await pair.client.call("sleep", delays[i]) == delays[i]
        order.append(i)

    await asyncio.gather(*(one(i) for i in range(1000)))
    assert sorted(order) == list(range(1000)) and order != list(range(1000))
    # both directions on one link
    assert await pair.remote.call("echo", {"back": 1}) == {"back": 1}


async def test_errors_are_mapped(pair: Pair) -> None:
    assert pair.client is not None
    with pytest.raises(InvalidArgument) as invalid:
        await pair.client.call("invalid", "x")
    assert type(invalid.value) is InvalidArgument and invalid.value.message == "bad input 'x'"
    with pytest.raises(InternalError) as internal:
        await pair.client.call("value", None)
    assert type(internal.value) is InternalError
    assert str(internal.value) == "server: ValueError: no good"
    with pytest.raises(NodeError) as node:
        await pair.client.call("node", None)
    assert node.value.graph == "pipe" and node.value.node == "step"
    assert node.value.code.value == "INVALID_ARG" and "shape [3] is not [4]" in str(node.value)
    with pytest.raises(InternalError, match=r"server: InternalError: cannot send the reply to 'unpicklable'"):
        await pair.client.call("unpicklable", None)
    with pytest.raises(InternalError, match="cannot send 'echo' to server"):
        await pair.client.call("echo", lambda: None)
    assert not pair.client.closed  # errors do not end the link


async def test_notify(pair: Pair) -> None:
    assert pair.client is not None
    seen: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    async def record(kind: str, message: Any) -> Any:
        await seen.put((kind, message))

    pair.remote.handler = record
    await pair.client.notify("stats", {"a": np.arange(3)})
    kind, message = await asyncio.wait_for(seen.get(), 2)
    assert kind == "stats" and np.array_equal(message["a"], np.arange(3))


async def test_timeout(pair: Pair) -> None:
    assert pair.client is not None
    start = time.monotonic()
    with pytest.raises(Unavailable, match=r"server did not answer 'sleep' within 0\.1 s"):
        await pair.client.call("sleep", 0.5, timeout=0.1)
    assert time.monotonic() - start < 0.4
    await asyncio.sleep(0.5)  # the late reply arrives and is dropped
    assert await pair.client.call("echo", 7) == 7


async def test_close_fails_pending_calls(pair: Pair) -> None:
    assert pair.client is not None
    closed: list[Link] = []
    pair.client.on_close = closed.append
    pending = asyncio.create_task(pair.client.call("sleep", 30))
    await asyncio.sleep(0.05)
    await pair.client.close()
    with pytest.raises(Unavailable, match="server went away while handling 'sleep'"):
        await asyncio.wait_for(pending, 1)
    assert pair.client.closed and closed == [pair.client]
    with pytest.raises(Unavailable):
        await pair.client.call("echo", 1)
    # the other side sees the end too
    await asyncio.wait_for(pair.remote.wait_closed(), 2)
    await pair.client.close()  # idempotent
    assert closed == [pair.client]


async def test_a_corrupt_frame_ends_the_link(sock_dir: str) -> None:
    path = str(Path(sock_dir) / "s")
    accepted: list[Link] = []
    server = await serve(path, echo, accepted.append)
    try:
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(linkmod.HEADER.pack(1, 99, 0, 0))  # an unknown frame type
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 2) == b""  # the server hung up
        assert accepted and accepted[0].closed
        writer.close()

        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(linkmod.HEADER.pack(1, linkmod.CALL, 2**32 - 1, 0))  # over the frame limit
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 2) == b""
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_link_over_plain_streams(sock_dir: str) -> None:
    """Link also runs on asyncio's streams (the buffers then pass through the stream's buffer)."""
    path = str(Path(sock_dir) / "s")
    server = await serve(path, echo)
    try:
        reader, writer = await asyncio.open_unix_connection(path)
        link = Link(reader, writer, None, "server")
        array = np.random.default_rng(0).random((512, 1024))
        got = await link.call("echo", {"x": array})
        assert np.array_equal(got["x"], array) and got["x"].flags.writeable
        await link.close()
    finally:
        server.close()
        await server.wait_closed()


def test_on_uvloop(sock_dir: str) -> None:
    """The server's default loop: its transports fill the buffered protocol too."""

    async def scenario() -> None:
        path = str(Path(sock_dir) / "s")
        accepted: list[Link] = []
        server = await serve(path, echo, accepted.append)
        client = await Link.connect(path, None, "server")
        try:
            await asyncio.wait_for(exercise(client, accepted), 10)
        finally:
            await client.close()
            server.close()
            await server.wait_closed()

    async def exercise(client: Link, accepted: list[Link]) -> None:
        big = np.random.default_rng(1).random(4 << 20)  # 32 MiB
        small = np.arange(16, dtype=np.float32)
        replies = await asyncio.gather(
            *(client.call("echo", {"big": big, "small": small, "i": i}) for i in range(4)),
            *(client.call("sleep", (50 - i) / 10_000) for i in range(50)),
        )
        for i, reply in enumerate(replies[:4]):
            assert reply["i"] == i and np.array_equal(reply["big"], big) and reply["big"].flags.writeable
            assert np.array_equal(reply["small"], small)
        with pytest.raises(InvalidArgument, match="bad input 'y'"):
            await client.call("invalid", "y")
        pending = asyncio.create_task(client.call("sleep", 30))
        await asyncio.sleep(0.05)
        await accepted[0].close()
        with pytest.raises(Unavailable, match="server went away while handling 'sleep'"):
            await asyncio.wait_for(pending, 2)

    uvloop.run(scenario())


PEER = """
import asyncio, sys
from flowserve.cluster.link import serve

async def handler(kind, message):
    await asyncio.sleep(3600)

async def main():
    server = await serve(sys.argv[1], handler)
    print("ready", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_peer_killed_mid_call(sock_dir: str) -> None:
    path = str(Path(sock_dir) / "s")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PEER, path, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 10)
        assert line.strip() == b"ready"
        link = await Link.connect(path, None, f"worker 1 (pid {process.pid})")
        closed: list[Link] = []
        link.on_close = closed.append
        pending = [asyncio.create_task(link.call("infer", np.zeros(1000))) for _ in range(3)]
        await asyncio.sleep(0.1)
        os.kill(process.pid, signal.SIGKILL)
        start = time.monotonic()
        for task in pending:
            with pytest.raises(
                Unavailable, match=rf"worker 1 \(pid {process.pid}\) went away while handling 'infer'"
            ):
                await asyncio.wait_for(task, 2)
        assert time.monotonic() - start < 1
        assert closed == [link] and link.closed
        await link.close()
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
