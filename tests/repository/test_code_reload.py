"""Poll mode reloads a graph whose python nodes' code changed (the node module, or a module of
the user's it uses), with the new code; a reload that fails is logged as failed with its reason
and the loaded version keeps serving; a graph that failed to load is tried again once its code
is fixed. In process (Engine.poll_once) and against a served ``--model-control-mode poll``."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flowserve.dataplane.engine import Engine
from flowserve.repository.settings import RepositorySettings
from tests.conftest import ServerProcess, start_server

GRAPH = """
name: g
inputs:
  x: {{datatype: FP32, dims: [2]}}
outputs:
  y: pre.y
nodes:
  pre:
    python: {module}:Pre
    inputs: {{x: $x}}
    outputs: {{y: {{datatype: FP32, dims: [2]}}}}
"""
NODE = """
from {helper} import offset


class Pre:
    def initialize(self, config):
        self.factor = {factor}

    def execute(self, inputs):
        return {{"y": inputs["x"] * self.factor + offset()}}
"""
HELPER = "def offset():\n    return {}\n"
X = np.ones(2, np.float32)


class Project:
    """A graphs folder, a node module and a helper module it imports (names of their own)."""

    def __init__(self, root: Path) -> None:
        tag = uuid.uuid4().hex[:10]
        self.module, self.helper = f"reload_node_{tag}", f"reload_helper_{tag}"
        self.node_file = root / f"{self.module}.py"
        self.helper_file = root / f"{self.helper}.py"
        self.graphs = root / "graphs"
        self.graphs.mkdir()
        (self.graphs / "g.yaml").write_text(GRAPH.format(module=self.module))
        self.write_node(2)
        self.write_helper(0)

    def write_node(self, factor: object) -> None:
        _write(self.node_file, NODE.format(helper=self.helper, factor=factor))

    def write_helper(self, offset: int) -> None:
        _write(self.helper_file, HELPER.format(offset))

    def forget(self) -> None:
        for name in (self.module, self.helper):
            sys.modules.pop(name, None)


def _write(path: Path, text: str) -> None:
    """Write a new version of a source file (its mtime moved on, so no stale bytecode can
    match it even within the same second)."""
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))


async def _y(engine: Engine) -> list[float]:
    return [float(v) for v in (await engine.infer("g", {"x": X}))["y"]]


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Project]:
    made = Project(tmp_path)
    yield made
    made.forget()


async def test_edited_node_code_is_reloaded(project: Project, caplog: pytest.LogCaptureFixture) -> None:
    engine = await Engine.start(graphs=project.graphs, settings=RepositorySettings("poll", poll_secs=3600))
    try:
        assert await _y(engine) == [2.0, 2.0]
        assert await engine.poll_once() == ([], [])  # nothing changed
        project.write_node(3)
        with caplog.at_level(logging.INFO):
            assert await engine.poll_once() == (["g"], [])
        assert await _y(engine) == [3.0, 3.0]  # the new code runs
        assert f"node code changed ({project.node_file})" in caplog.text
        assert "repository poll: loaded ['g'], unloaded []" in caplog.text
        project.write_helper(10)  # a module the node module uses
        assert await engine.poll_once() == (["g"], [])
        assert await _y(engine) == [13.0, 13.0]
        assert await engine.poll_once() == ([], [])
    finally:
        await engine.stop()


async def test_a_failed_reload_is_logged_and_the_old_version_serves(
    project: Project, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await Engine.start(graphs=project.graphs, settings=RepositorySettings("poll", poll_secs=3600))
    try:
        project.write_node('{}["scale"]')  # initialize raises KeyError
        with caplog.at_level(logging.INFO):
            assert await engine.poll_once() == ([], [])  # not "loaded"
        assert "repository poll: loaded" not in caplog.text
        failure = next(r.getMessage() for r in caplog.records if "repository poll: failed" in r.getMessage())
        assert failure.startswith(
            "repository poll: failed to load 'g': version 1: node 'pre' failed to start: "
        )
        assert "KeyError: 'scale'" in failure and failure.endswith("(the loaded version keeps serving)")
        assert f'{project.module}.py", line 7, in initialize' in caplog.text  # the traceback
        assert await _y(engine) == [2.0, 2.0]  # the old version
        caplog.clear()
        assert await engine.poll_once() == ([], [])  # not tried again until it changes
        assert "failed" not in caplog.text
        project.write_node("class")  # a syntax error: the graph does not even compile
        with caplog.at_level(logging.ERROR):
            assert await engine.poll_once() == ([], [])
        assert "repository poll: failed to load 'g': " in caplog.text and "SyntaxError" in caplog.text
        assert await _y(engine) == [2.0, 2.0]
        project.write_node(5)  # fixed
        assert await engine.poll_once() == (["g"], [])
        assert await _y(engine) == [5.0, 5.0]
    finally:
        await engine.stop()


async def test_a_graph_that_failed_to_load_loads_once_its_code_is_fixed(project: Project) -> None:
    project.write_node('{}["scale"]')
    engine = await Engine.start(graphs=project.graphs, settings=RepositorySettings("poll", poll_secs=3600))
    try:
        assert not engine.model_ready("g")
        project.write_node(4)
        assert await engine.poll_once() == (["g"], [])
        assert await _y(engine) == [4.0, 4.0]
    finally:
        await engine.stop()


def _infer(server: ServerProcess) -> list[float]:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 1]}]}
    request = urllib.request.Request(
        f"http://{server.http_url}/v2/models/g/infer", json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return [float(v) for v in json.loads(reply.read())["outputs"][0]["data"]]


@pytest.mark.slow
def test_a_served_poll_mode_server_runs_edited_node_code(project: Project) -> None:
    server = start_server(
        "--model-control-mode=poll", "--repository-poll-secs=0.3",
        repositories=(), graphs=(project.graphs,), listeners="http",
    )  # fmt: skip
    try:
        assert _infer(server) == [2.0, 2.0]
        project.write_node(7)
        deadline = time.monotonic() + 60
        while _infer(server) != [7.0, 7.0]:
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.2)
        assert "repository poll: loaded ['g']" in server.log()
    finally:
        server.stop()
