"""The web page in a real headless browser (Debian's chromium): it loads, draws the graph, its
counters move after requests are sent, and a failing node shows. Screenshots are kept in
$FLOWSERVE_ARTIFACTS (default build/test-artifacts/). Skipped when chromium is not installed."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from flowserve.core.errors import FlowserveError
from flowserve.core.types import InferRequest
from flowserve.dataplane.plane import DataPlane
from flowserve.observability.httpserver import AsgiListener, Receive, Scope, Send, serve_asgi
from flowserve.observability.ui import make_ui_app

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p is not None), None
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs a headless chromium (Debian: apt-get install chromium)"
)
A = np.ones((2, 16), np.int32)


def artifacts() -> Path:
    path = Path(os.environ.get("FLOWSERVE_ARTIFACTS", ROOT / "build" / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


async def serve_ui(plane: DataPlane) -> AsgiListener:
    """The page mounted at /ui, as the HTTP front end mounts it (root_path set)."""
    ui = make_ui_app(plane, interval_ms=300)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"].startswith("/ui"):
            await ui({**scope, "root_path": "/ui"}, receive, send)
            return
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    return await serve_asgi(app, "127.0.0.1", 0)


async def chromium(profile: Path, url: str, *flags: str) -> str:
    assert CHROMIUM is not None
    proc = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=4000",
        *flags,
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode(errors="replace")


def counters(dom: str) -> dict[str, str]:
    """The text the page wrote under each node of the drawing."""
    found = {}
    for node_id, text in re.findall(
        r'<g id="(fs_node_\d+)".*?<text class="fs-counter[^"]*"[^>]*>([^<]*)<', dom, re.S
    ):
        found[node_id] = text
    return found


async def test_page_loads_draws_and_counters_move(plane: DataPlane, tmp_path: Path) -> None:
    plane.update_trace_settings({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    listener = await serve_ui(plane)
    url = f"http://127.0.0.1:{listener.port}/ui/graph/fanout"
    try:
        for i in range(3):
            await plane.infer(InferRequest("fanout", {"a": A, "b": A}, id=f"first-{i}"))
        dom = await chromium(tmp_path / "p1", url, "--dump-dom")
        assert "<svg" in dom
        assert re.search(r'data-polls="\d+"', dom), "the page's script did not poll"
        first = counters(dom)
        assert set(first) == {"fs_node_0", "fs_node_1", "fs_node_2", "fs_node_3"}
        assert all(text.startswith("3 calls · 0 err") for text in first.values()), first
        # the newest trace is selected and its timeline lists every node it passed
        timeline = set(re.findall(r'<div class="row ?[a-z]*" data-node="([^"]+)" data-status="ok"', dom))
        assert timeline == {"addsub", "double_sum", "triple_diff", "join", "simple"}

        for i in range(2):
            await plane.infer(InferRequest("fanout", {"a": A, "b": A}, id=f"then-{i}"))
        dom = await chromium(tmp_path / "p2", url, "--dump-dom")
        assert all(text.startswith("5 calls · 0 err") for text in counters(dom).values()), counters(dom)

        shot = artifacts() / "ui-fanout.png"
        await chromium(tmp_path / "p3", url, f"--screenshot={shot}", "--window-size=1400,1250")
        assert shot.stat().st_size > 10_000
    finally:
        await listener.stop(1.0)


async def test_failing_node_is_marked_on_the_page(plane: DataPlane, tmp_path: Path) -> None:
    plane.update_trace_settings({"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    listener = await serve_ui(plane)
    url = f"http://127.0.0.1:{listener.port}/ui/graph/checked"
    try:
        await plane.infer(InferRequest("checked", {"x": np.array([1], np.int32)}))
        with pytest.raises(FlowserveError):
            await plane.infer(InferRequest("checked", {"x": np.array([-1], np.int32)}, id="bad-one"))
        dom = await chromium(tmp_path / "p1", url, "--dump-dom")
        assert re.search(r'<g id="fs_node_0" class="[^"]*fs-has-error', dom), "failing node not marked"
        assert "2 calls · 1 err" in counters(dom)["fs_node_0"]
        assert 'data-node="check" data-status="error"' in dom
        assert "negative input" in dom
        shot = artifacts() / "ui-failing-node.png"
        await chromium(tmp_path / "p2", url, f"--screenshot={shot}", "--window-size=1400,1250")
    finally:
        await listener.stop(1.0)


async def test_index_page_in_the_browser(plane: DataPlane, tmp_path: Path) -> None:
    listener = await serve_ui(plane)
    try:
        dom = await chromium(tmp_path / "p", f"http://127.0.0.1:{listener.port}/ui/", "--dump-dom")
        assert 'href="/ui/graph/fanout"' in dom and "UNAVAILABLE" in dom
    finally:
        await listener.stop(1.0)
