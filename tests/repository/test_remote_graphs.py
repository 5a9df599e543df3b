"""Graphs and node code in object storage: ``--graphs s3://bucket/app/graphs`` mirrors the graph
folder and the ``nodes/`` beside it (repository/remote.py, RemoteGraphs). The mirror on fsspec's
in-memory filesystem (units, layout, completeness, removal), an engine serving a graph whose
Python node exists only in the store and picking up a changed graph in poll mode, and
``flowserve serve`` with models, graphs and node code all in a local S3 server (moto)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import InvalidArgument
from flowserve.repository.remote import RemoteGraphs, RemoteOptions
from flowserve.repository.settings import RepositorySettings
from tests.conftest import BUNDLED_REPOSITORY, free_port

A = np.arange(16, dtype=np.int32).reshape(1, 16)

# a node module that exists only in the store (the bundled nodes/ has no such module)
NODE_MODULE = b"""
import numpy as np


class Times:
    inputs = ["x"]
    outputs = ["y"]

    def initialize(self, config):
        self.factor = config["parameters"].get("factor", 1)

    def execute(self, inputs):
        return {"y": (inputs["x"] * self.factor).astype(np.int32)}
"""


def graph(factor: int) -> bytes:
    return f"""
name: stored
max_batch_size: 8
inputs:
  a: {{datatype: INT32, dims: [16]}}
  b: {{datatype: INT32, dims: [16]}}
outputs:
  out: scale.y
nodes:
  addsub:
    model: simple
    inputs: {{INPUT0: $a, INPUT1: $b}}
  scale:
    python: nodes.fromstore:Times
    parameters: {{factor: {factor}}}
    inputs: {{x: addsub.OUTPUT0}}
    outputs: {{y: {{datatype: INT32, dims: [-1, 16]}}}}
""".encode()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def memory_root() -> Iterator[tuple[Any, str]]:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"/store-{uuid.uuid4().hex[:8]}"
    try:
        yield fs, root
    finally:
        if fs.exists(root):
            fs.rm(root, recursive=True)


@pytest.fixture
def own_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The engine puts the mirror on sys.path and imports ``nodes`` from it: this process may
    have imported the bundled ``nodes`` already, so both are put back as they were after."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in [m for m in sys.modules if m == "nodes" or m.startswith("nodes.")]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m == "nodes" or m.startswith("nodes.")]:
        del sys.modules[name]


def test_graph_mirror_units_layout_and_removal(memory_root: tuple[Any, str], tmp_path: Path) -> None:
    fs, root = memory_root
    fs.pipe(f"{root}/app/graphs/stored.yaml", graph(3))
    fs.pipe(f"{root}/app/graphs/.DS_Store", b"x")  # hidden: left out
    fs.pipe(f"{root}/app/nodes/__init__.py", b"")
    fs.pipe(f"{root}/app/nodes/fromstore.py", NODE_MODULE)
    fs.pipe(f"{root}/app/models/simple/config.pbtxt", b"")  # beside, not part of the graph folder
    clock = Clock()
    mirror = RemoteGraphs(f"memory://{root}/app/graphs", tmp_path / "m", RemoteOptions(settle_s=1.0), clock)
    assert mirror.graph_dir == tmp_path / "m" / "graphs" and (tmp_path / "m").is_dir()
    first = mirror.sync()
    assert first.applied == [] and first.pending == [("graphs/stored.yaml", ""), ("nodes", "")]
    clock.t += 1.0
    assert mirror.sync().applied == [("graphs/stored.yaml", ""), ("nodes", "")]
    local = tmp_path / "m"
    assert (local / "graphs" / "stored.yaml").read_bytes() == graph(3)
    assert (local / "nodes" / "fromstore.py").read_bytes() == NODE_MODULE
    assert not (local / "graphs" / ".DS_Store").exists() and not (local / "models").exists()
    # the node code is one unit: a change to one module and a new one arrive together, once stable
    fs.pipe(f"{root}/app/nodes/fromstore.py", NODE_MODULE + b"\n# v2\n")
    fs.pipe(f"{root}/app/nodes/extra.py", b"X = 1\n")
    clock.t += 10
    assert mirror.sync().pending == [("nodes", "")]
    assert (local / "nodes" / "fromstore.py").read_bytes() == NODE_MODULE
    assert not (local / "nodes" / "extra.py").exists()
    clock.t += 10
    assert mirror.sync().applied == [("nodes", "")]
    assert (local / "nodes" / "extra.py").read_text() == "X = 1\n"
    # a removed graph file goes at once; a removed module with the next complete listing
    fs.rm(f"{root}/app/graphs/stored.yaml")
    fs.rm(f"{root}/app/nodes/extra.py")
    result = mirror.sync()
    assert result.removed == [("graphs/stored.yaml", "")] and result.pending == [("nodes", "")]
    assert not (local / "graphs" / "stored.yaml").exists()
    clock.t += 10
    assert mirror.sync().applied == [("nodes", "")]
    assert not (local / "nodes" / "extra.py").exists() and (local / "nodes" / "fromstore.py").exists()
    # a new mirror over the same cache directory downloads nothing that is unchanged
    again = RemoteGraphs(f"memory://{root}/app/graphs", local, RemoteOptions(settle_s=1.0), clock)
    fetched: list[str] = []
    original = again.fs.get_file
    again.fs.get_file = lambda src, dst, **kw: (fetched.append(src), original(src, dst, **kw))
    assert again.sync().applied == [] and fetched == []


def test_graph_folder_urls_that_cannot_work_are_refused(memory_root: tuple[Any, str], tmp_path: Path) -> None:
    _, root = memory_root
    with pytest.raises(InvalidArgument, match=r"graph folder memory://store: give a folder inside"):
        RemoteGraphs("memory://store", tmp_path / "a", RemoteOptions())
    with pytest.raises(InvalidArgument, match=r"graph folder .*/app/nodes: 'nodes/' holds the node code"):
        RemoteGraphs(f"memory://{root}/app/nodes", tmp_path / "b", RemoteOptions())
    with pytest.raises(
        InvalidArgument, match=r"graph folder nosuchfs://bucket/graphs: .*(missing|not known)"
    ):
        RemoteGraphs("nosuchfs://bucket/graphs", tmp_path / "c", RemoteOptions())


async def test_engine_serves_a_stored_graph_with_stored_node_code_and_polls_it(
    memory_root: tuple[Any, str], own_nodes: None
) -> None:
    fs, root = memory_root
    fs.pipe(f"{root}/app/graphs/stored.yaml", graph(3))
    fs.pipe(f"{root}/app/nodes/__init__.py", b"")
    fs.pipe(f"{root}/app/nodes/fromstore.py", NODE_MODULE)
    engine = await flowserve.Engine.start(
        [BUNDLED_REPOSITORY],
        [f"memory://{root}/app/graphs"],
        settings=RepositorySettings(control_mode="poll", poll_secs=3600, remote=RemoteOptions(settle_s=0.0)),
    )
    cache = engine.remote.root
    try:
        out = await engine.infer("stored", {"a": A, "b": A})
        np.testing.assert_array_equal(out["out"], 3 * 2 * A)
        assert sys.modules["nodes.fromstore"].__file__.startswith(str(cache))
        # a changed graph is loaded by the poll after the one that first lists it
        fs.pipe(f"{root}/app/graphs/stored.yaml", graph(5))
        assert await engine.poll_once() == ([], [])
        assert await engine.poll_once() == (["stored"], [])
        out = await engine.infer("stored", {"a": A, "b": A})
        np.testing.assert_array_equal(out["out"], 5 * 2 * A)
        fs.rm(f"{root}/app/graphs/stored.yaml")
        assert await engine.poll_once() == ([], ["stored"])
    finally:
        await engine.stop()
    assert not cache.exists()  # the temporary mirror goes with the engine


@pytest.mark.slow
def test_flowserve_serve_with_models_graphs_and_node_code_in_s3(
    monkeypatch: pytest.MonkeyPatch, server_factory: Any
) -> None:
    """The object-storage deployment: nothing but the bucket's URLs on the command line."""
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    import tritonclient.http as httpclient

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    port = free_port()
    moto = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    try:
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": f"http://127.0.0.1:{port}"})
        bucket = f"app-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)
        for f in (BUNDLED_REPOSITORY / "simple").rglob("*"):
            if f.is_file() and "__pycache__" not in f.parts:
                rel = f.relative_to(BUNDLED_REPOSITORY).as_posix()
                fs.pipe(f"{bucket}/app/models/{rel}", f.read_bytes())
        fs.pipe(f"{bucket}/app/graphs/stored.yaml", graph(3))
        fs.pipe(f"{bucket}/app/nodes/__init__.py", b"")
        fs.pipe(f"{bucket}/app/nodes/fromstore.py", NODE_MODULE)
        store = f"s3://127.0.0.1:{port}/{bucket}/app"
        server = server_factory.start(
            f"--model-repository={store}/models",
            f"--graphs={store}/graphs",
            "--repository-settle-secs=0",
            repositories=(),
            graphs=(),
            listeners="http",
        )
        client = httpclient.InferenceServerClient(server.http_url)
        try:
            assert client.is_server_ready() and client.is_model_ready("stored")
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("a", "b")]
            for item in inputs:
                item.set_data_from_numpy(A)
            np.testing.assert_array_equal(client.infer("stored", inputs).as_numpy("out"), 3 * 2 * A)
        finally:
            client.close()
        assert server.stop() == 0, server.log()
    finally:
        moto.stop()
