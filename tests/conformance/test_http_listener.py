"""The HTTP listener in process, on both servers: port 0, mounted ASGI apps, graceful and forced stop."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from flowserve.dataplane.engine import Engine
from flowserve.dataplane.plane import DataPlane
from flowserve.frontends import listen_socket
from flowserve.frontends.http import HTTP_SERVERS, start_http


class SlowApp:
    """A mounted ASGI app whose '/slow' requests wait until released."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.scopes: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.scopes.append(dict(scope))
        if scope["path"].endswith("/slow"):
            self.entered.set()
            await self.release.wait()
        body = f"{scope['root_path']}|{scope['path']}".encode()
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("server", HTTP_SERVERS)
async def test_mounts_and_graceful_stop(server: str) -> None:
    ui = SlowApp()
    mounts: dict[str, Any] = {"/ui": ui, "/ui/admin/": ui}
    listener = await start_http(DataPlane(Engine()), "127.0.0.1", 0, mounts=mounts, server=server)
    assert listener.port > 0
    base = f"http://127.0.0.1:{listener.port}"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/ui/page?x=1") as resp:
                assert resp.status == 200 and await resp.text() == "/ui|/ui/page"
            async with session.get(f"{base}/ui/admin/users") as resp:
                assert await resp.text() == "/ui/admin|/ui/admin/users"
            async with session.get(f"{base}/uix") as resp:  # not under the prefix: the protocol's 404
                assert resp.status == 404
            async with session.get(f"{base}/v2/health/live") as resp:
                assert resp.status == 200
            async with session.get(f"{base}/v2/models/none") as resp:
                assert resp.status == 404 and "none" in (await resp.json())["error"]

            slow = asyncio.create_task(session.get(f"{base}/ui/slow"))
            await ui.entered.wait()
            stopping = asyncio.create_task(listener.stop(grace_s=30))
            await asyncio.sleep(0)  # let stop() close the listening socket (its first step)
            with pytest.raises(aiohttp.ClientConnectionError):
                async with aiohttp.ClientSession() as other, other.get(f"{base}/v2/health/live"):
                    pass
            assert not stopping.done()
            ui.release.set()
            resp = await slow
            assert resp.status == 200 and await resp.text() == "/ui|/ui/slow"
            resp.release()
            await stopping
    finally:
        ui.release.set()
        await listener.stop(grace_s=0)


@pytest.mark.parametrize("server", HTTP_SERVERS)
async def test_stop_cuts_requests_after_grace(server: str) -> None:
    ui = SlowApp()
    listener = await start_http(DataPlane(Engine()), "127.0.0.1", 0, mounts={"/ui": ui}, server=server)
    async with aiohttp.ClientSession() as session:
        slow = asyncio.create_task(session.get(f"http://127.0.0.1:{listener.port}/ui/slow"))
        await ui.entered.wait()
        await listener.stop(grace_s=0)
        with pytest.raises(aiohttp.ClientError):
            await slow


async def test_mount_prefixes_are_checked() -> None:
    ui = SlowApp()
    for prefix in ("", "/", "ui", "/v2/ui"):
        with pytest.raises(ValueError, match="mount prefixes"):
            await start_http(DataPlane(Engine()), "127.0.0.1", 0, mounts={prefix: ui})


@pytest.mark.parametrize("server", HTTP_SERVERS)
async def test_busy_port_is_a_clear_error(server: str) -> None:
    first = await start_http(DataPlane(Engine()), "127.0.0.1", 0, server=server)
    try:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{first.port}"):
            await start_http(DataPlane(Engine()), "127.0.0.1", first.port, server=server)
    finally:
        await first.stop(grace_s=1)


def test_a_port_is_shared_only_when_every_socket_asks_for_it() -> None:
    first = listen_socket("127.0.0.1", 0, "HTTP", reuse_port=True)
    first.listen()
    port = first.getsockname()[1]
    try:
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            listen_socket("127.0.0.1", port, "HTTP")  # flowserve's own listeners never share
        second = listen_socket("127.0.0.1", port, "HTTP", reuse_port=True)  # benchmarks/processes.py's
        second.close()
    finally:
        first.close()
