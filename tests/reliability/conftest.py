"""Servers for the reliability tests: tests/reliability/models (slow, add_sub, text, models that
misbehave) and graphs/faults.yaml, on 127.0.0.1, always stopped after the test.

Tests get the helpers through the ``rel`` fixture (test modules do not import each other)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
MODELS = HERE / "models"
GRAPHS = HERE / "graphs"


def start(factory: Any, *extra: str, listeners: str = "http,grpc") -> Any:
    """A server of the reliability models (explicit control mode, every model loaded)."""
    return factory.start(
        "--model-control-mode=explicit",
        "--load-model=*",
        *extra,
        repositories=(MODELS,),
        graphs=(GRAPHS,),
        listeners=listeners,
    )


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def post(
    port: int, path: str, body: bytes = b"", headers: dict[str, str] | None = None, timeout: float = 30
) -> tuple[int, dict[str, Any]]:
    """One HTTP request on a fresh connection; (status, JSON body or {})."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        parsed = json.loads(raw) if raw else {}
    except ValueError:
        parsed = {"raw": raw.decode("latin-1")}
    return resp.status, parsed if isinstance(parsed, dict) else {"json": parsed}


def get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    return resp.status, json.loads(raw) if raw else None


class Helpers:
    """What the reliability tests share: ``rel.start(...)``, ``rel.post(...)``, ``rel.rss(pid)``."""

    models = MODELS
    graphs = GRAPHS

    def __init__(self, factory: Any) -> None:
        self._factory = factory

    def start(self, *extra: str, listeners: str = "http,grpc") -> Any:
        return start(self._factory, *extra, listeners=listeners)

    post = staticmethod(post)
    get = staticmethod(get)
    rss = staticmethod(rss_bytes)


@pytest.fixture
def rel(server_factory: Any) -> Iterator[Helpers]:
    yield Helpers(server_factory)


def _root_start_server(config: pytest.Config) -> Any:
    """tests/conftest.py's ``start_server`` (conftest modules cannot be imported by name)."""
    wanted = str(HERE.parent / "conftest.py")
    for plugin in config.pluginmanager.get_plugins():
        if getattr(plugin, "__file__", None) == wanted:
            return plugin.start_server
    raise RuntimeError("tests/conftest.py is not loaded")


@pytest.fixture(scope="module")
def module_server(request: pytest.FixtureRequest) -> Iterator[Any]:
    """One server for a whole test module, started with the module's ``SERVER_FLAGS`` and
    loading its ``LOAD_MODELS`` (default: all)."""
    flags = tuple(getattr(request.module, "SERVER_FLAGS", ()))
    if not getattr(request.module, "STRICT_READINESS", False):
        # MODELS holds one that fails to load on purpose: strict readiness would keep the server
        # not ready; the modules that test readiness set STRICT_READINESS = True
        flags += ("--strict-readiness=false",)
    loads = tuple(f"--load-model={m}" for m in getattr(request.module, "LOAD_MODELS", ("*",)))
    proc = _root_start_server(request.config)(
        "--model-control-mode=explicit",
        *loads,
        *flags,
        repositories=(MODELS,),
        graphs=(GRAPHS,),
        listeners="http,grpc",
    )
    try:
        yield proc
    finally:
        proc.stop()
