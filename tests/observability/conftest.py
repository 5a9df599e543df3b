"""Fixtures for the observability tests: an in-process engine over the bundled content plus a
graph with a failing node, its data plane, and helpers to call ASGI apps and read metrics."""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

import flowserve
from flowserve.dataplane.plane import DataPlane
from flowserve.observability.httpserver import ASGIApp, call_app

ROOT = Path(__file__).resolve().parents[2]

# "check" runs tests/models/failing (raises on a negative element), "echo" runs beside it.
CHECKED_GRAPH = """
name: checked
description: a check that fails on negative input, beside a passthrough
inputs:
  x: {datatype: INT32, dims: [-1]}
outputs:
  y: check.OUTPUT0
  z: echo.y
nodes:
  check: {model: failing, inputs: {INPUT0: $x}}
  echo:
    python: nodes.arith:Identity
    inputs: {x: $x}
    outputs: {y: {datatype: INT32, dims: [-1]}}
"""

Metrics = dict[tuple[str, frozenset[tuple[str, str]]], float]
Call = Callable[..., Awaitable[tuple[int, dict[str, str], bytes]]]


@pytest.fixture
def sources(tmp_path: Path) -> tuple[list[Path], list[Path]]:
    """(model repositories, graph folders): bundled ones, plus 'failing', 'broken', 'checked'."""
    models = tmp_path / "models"
    for name in ("failing", "broken"):
        shutil.copytree(ROOT / "tests" / "models" / name, models / name)
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    (graphs / "checked.yaml").write_text(CHECKED_GRAPH)
    return [ROOT / "model_repository", models], [ROOT / "graphs", graphs]


@pytest.fixture
async def engine(sources: tuple[list[Path], list[Path]]) -> AsyncIterator[flowserve.Engine]:
    engine = await flowserve.Engine.start(*sources)
    try:
        yield engine
    finally:
        await engine.stop()


@pytest.fixture
def plane(engine: flowserve.Engine) -> DataPlane:
    return DataPlane(engine)


_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> Metrics:
    """Samples of a Prometheus text exposition: (name, labels) -> value."""
    out: Metrics = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        assert match is not None, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        out[(name, frozenset(_LABEL.findall(labels or "")))] = float(value)
    return out


@pytest.fixture
def metrics_of() -> Callable[[str], Metrics]:
    return parse_metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics[(name, frozenset(labels.items()))]


@pytest.fixture
def value() -> Callable[..., float]:
    """value(metrics, name, label=...) -> the sample's value (KeyError names what is missing)."""
    return sample


@pytest.fixture
def call() -> Call:
    """Call an ASGI app directly: await call(app, "GET", "/ui/api/models", query=..., body=...)."""

    async def run(
        app: ASGIApp, method: str, path: str, query: str = "", body: bytes = b"", root_path: str = ""
    ) -> tuple[int, dict[str, str], bytes]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": root_path,
            "headers": [],
        }
        status, headers, parts = await call_app(app, scope, body)
        return status, {k.decode(): v.decode() for k, v in headers}, b"".join(parts)

    return run
