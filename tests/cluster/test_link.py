"""The link between worker processes (flowserve/cluster/link.py): calls, out-of-band tensors,
errors, and every way a link can end."""

from __future__ import annotations

import asyncio
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
    got = reply["inputs"]["big"]
    # received into its own writable buffer, not rebuilt from a copy inside the pickle
    assert got.flags.writeable
    base = got.base
    while isinstance(base, memoryview | np.ndarray):
        base = base.obj if isinstance(base, memoryview) else base.base
    assert isinstance(base, bytearray) and len(base) == big.nbytes
    assert bytes(reply["raw"]) == b"x" * 100_000
    # the pickle itself stays small: the arrays travel beside it
    chunks = linkmod.encode(1, linkmod.CALL, ("echo", message))
    _, _, pickle_bytes, count = linkmod.HEADER.unpack(bytes(chunks[0][: linkmod.HEADER.size]))
    assert pickle_bytes < 4096 and count >= 6
    assert any(isinstance(c, memoryview) and c.nbytes == big.nbytes for c in chunks)


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
