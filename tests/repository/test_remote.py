"""Remote model repositories: the completeness rule (pure), the mirror (fsspec's in-memory
filesystem), and the acceptance tests against a local S3-compatible server (moto's server
mode on 127.0.0.1, started and stopped here): serve a model from S3, pick up a new version in
poll mode, never serve an incomplete upload; and ``flowserve serve --model-repository s3://``."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import flowserve
from flowserve.core.errors import InvalidArgument, Unavailable
from flowserve.repository.remote import (
    COMPLETE_MARKER,
    RemoteFile,
    RemoteOptions,
    RemoteRepository,
    decide,
    group_units,
    is_remote,
    settle_wait,
    unit_of,
)
from flowserve.repository.settings import RepositorySettings

BUNDLED_REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
SIMPLE_CONFIG = (BUNDLED_REPOSITORY / "simple" / "config.pbtxt").read_bytes()
SIMPLE_MODEL = (BUNDLED_REPOSITORY / "simple" / "1" / "model.py").read_bytes()


def simple_model(offset: int) -> bytes:
    """simple's model.py, with OUTPUT0 = INPUT0 + INPUT1 + offset (tells versions apart)."""
    return SIMPLE_MODEL.replace(b"(in0 + in1)", f"(in0 + in1 + {offset})".encode())


A = np.arange(16, dtype=np.int32).reshape(1, 16)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def output0(engine: flowserve.Engine, version: str = "") -> int:
    out = await engine.infer("simple", {"INPUT0": A, "INPUT1": A}, version=version)
    return int(out["OUTPUT0"][0, 0] - 2 * A[0, 0])


# ------------------------------------------------------------------------ the pure rule


def f(path: str, size: int = 1, token: str = "t") -> RemoteFile:
    return RemoteFile(path, size, token)


def test_units_and_urls() -> None:
    assert unit_of("m/config.pbtxt") == ("m", "")
    assert unit_of("m/1/model.onnx") == ("m", "1")
    assert unit_of("m/1/sub/x.bin") == ("m", "1")
    assert unit_of("m/01/model.onnx") == ("m", "")  # not a version directory (Triton ignores it)
    assert unit_of("m/labels/x.txt") == ("m", "")
    assert unit_of("README.md") is None and unit_of(".hidden/x") is None
    units = group_units([f("m/config.pbtxt"), f("m/2/model.py")], dirs=["m/1", "m", "e/1/"])
    assert units == {
        ("m", ""): frozenset({f("m/config.pbtxt")}),
        ("m", "1"): frozenset(),  # an empty version directory (an ensemble's)
        ("m", "2"): frozenset({f("m/2/model.py")}),
        ("e", "1"): frozenset(),
    }
    assert is_remote("s3://bucket/x") and is_remote("memory://x") and is_remote("gs://b")
    assert not is_remote("model_repository") and not is_remote(Path("s3:/x")) and not is_remote("/abs/path")


def test_stable_mode_needs_two_equal_listings_settle_apart() -> None:
    v1 = {("m", ""): frozenset({f("m/config.pbtxt")}), ("m", "1"): frozenset({f("m/1/model.py")})}
    first = decide(v1, {}, {}, now=100.0, mode="stable", settle_s=2.0)
    assert first.complete == set() and first.pending == set(v1)
    assert settle_wait(first, 100.0, "stable", 2.0) == 2.0
    too_soon = decide(v1, {}, first.seen, now=101.0, mode="stable", settle_s=2.0)
    assert too_soon.complete == set()
    assert settle_wait(too_soon, 101.0, "stable", 2.0) == 1.0
    later = decide(v1, {}, too_soon.seen, now=102.0, mode="stable", settle_s=2.0)
    assert later.complete == set(v1) and later.pending == set()
    # cached as listed: complete at once (a restart with a persistent cache needs no wait)
    assert decide(v1, v1, {}, now=0.0, mode="stable", settle_s=2.0).complete == set(v1)


def test_a_version_that_changes_between_listings_is_not_complete() -> None:
    cached = {("m", ""): frozenset({f("m/config.pbtxt")}), ("m", "1"): frozenset({f("m/1/model.py")})}
    growing = [
        {**cached, ("m", "2"): frozenset({f("m/2/weights.bin", 10)})},
        {**cached, ("m", "2"): frozenset({f("m/2/weights.bin", 20)})},  # still being written
        {**cached, ("m", "2"): frozenset({f("m/2/weights.bin", 20), f("m/2/model.py")})},
    ]
    seen: dict[Any, Any] = {}
    for now, listed in zip(itertools.count(0, 10), growing, strict=False):
        decision = decide(listed, cached, seen, now=float(now), mode="stable", settle_s=1.0)
        assert ("m", "2") in decision.pending and ("m", "1") in decision.complete
        seen = decision.seen
    done = decide(growing[-1], cached, seen, now=100.0, mode="stable", settle_s=1.0)
    assert ("m", "2") in done.complete


def test_a_new_model_appears_once_its_own_files_and_a_version_are_complete() -> None:
    config = {("n", ""): frozenset({f("n/config.pbtxt")})}
    v1 = {("n", "1"): frozenset({f("n/1/model.py")})}
    seen = decide(config, {}, {}, now=0.0, mode="stable", settle_s=1.0).seen
    # the config is stable, but no version is yet: the model does not appear without one
    decision = decide({**config, **v1}, {}, seen, now=5.0, mode="stable", settle_s=1.0)
    assert decision.complete == set() and decision.pending == {("n", ""), ("n", "1")}
    decision = decide({**config, **v1}, {}, decision.seen, now=10.0, mode="stable", settle_s=1.0)
    assert decision.complete == {("n", ""), ("n", "1")}
    # a version still being uploaded does not hold the others back
    v2 = {("n", "2"): frozenset({f("n/2/model.py")})}
    decision = decide({**config, **v1, **v2}, {}, decision.seen, now=20.0, mode="stable", settle_s=1.0)
    assert decision.complete == {("n", ""), ("n", "1")} and decision.pending == {("n", "2")}
    # nor does its own files' change hold back a cached model's complete versions
    changed = {("n", ""): frozenset({f("n/config.pbtxt", 2)})}
    decision = decide({**changed, **v1}, {**config, **v1}, {}, now=0.0, mode="stable", settle_s=1.0)
    assert decision.complete == {("n", "1")} and decision.pending == {("n", "")}


def test_marker_mode() -> None:
    marker = f"m/2/{COMPLETE_MARKER}"
    listed = {("m", ""): frozenset({f("m/config.pbtxt")}), ("m", "2"): frozenset({f("m/2/model.py")})}
    decision = decide(listed, {}, {}, now=0.0, mode="marker", settle_s=0.0)
    assert decision.complete == set() and decision.pending == set(listed)
    assert settle_wait(decision, 0.0, "marker", 0.0) is None  # waiting does not help
    marked = {**listed, ("m", "2"): frozenset({f("m/2/model.py"), f(marker)})}
    assert decide(marked, {}, {}, now=0.0, mode="marker", settle_s=0.0).complete == set(marked)


def test_options_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="stable, marker"):
        RemoteOptions(complete="maybe")
    with pytest.raises(InvalidArgument, match=">= 0"):
        RemoteOptions(settle_s=-1)


# ------------------------------------------------------------------------ the mirror (in memory)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def memory_repo() -> Iterator[tuple[Any, str]]:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    root = f"/repo-{uuid.uuid4().hex[:8]}"
    try:
        yield fs, root
    finally:
        if fs.exists(root):
            fs.rm(root, recursive=True)


def test_mirror_syncs_complete_units_and_keeps_the_old_copy_of_a_changing_one(
    memory_repo: tuple[Any, str], tmp_path: Path
) -> None:
    fs, root = memory_repo
    fs.pipe(f"{root}/simple/config.pbtxt", SIMPLE_CONFIG)
    fs.pipe(f"{root}/simple/1/model.py", simple_model(0))
    clock = Clock()
    options = RemoteOptions(cache_dir=tmp_path, settle_s=1.0)
    repo = RemoteRepository(f"memory://{root}", tmp_path / "mirror", options, clock)
    first = repo.sync()
    assert first.applied == [] and first.pending == [("simple", ""), ("simple", "1")]
    assert first.wait_s == 1.0
    clock.t += 1.0
    second = repo.sync()
    assert second.applied == [("simple", ""), ("simple", "1")]
    local = tmp_path / "mirror" / "simple"
    assert (local / "1" / "model.py").read_bytes() == simple_model(0)
    # version 1 is rewritten: the cache keeps the old content until the new one is stable
    fs.pipe(f"{root}/simple/1/model.py", simple_model(5))
    clock.t += 10
    assert repo.sync().pending == [("simple", "1")]
    assert (local / "1" / "model.py").read_bytes() == simple_model(0)
    clock.t += 10
    assert repo.sync().applied == [("simple", "1")]
    assert (local / "1" / "model.py").read_bytes() == simple_model(5)
    # a new mirror over the same cache directory downloads nothing that is unchanged
    fetched: list[str] = []
    again = RemoteRepository(f"memory://{root}", tmp_path / "mirror", options, clock)
    original = again.fs.get_file
    again.fs.get_file = lambda src, dst, **kw: (fetched.append(src), original(src, dst, **kw))
    (tmp_path / "mirror" / "stale" / "1").mkdir(parents=True)  # left by something else
    assert again.sync().applied == [] and fetched == []
    assert not (tmp_path / "mirror" / "stale").exists()  # the mirror holds what its manifest says
    # a removed version directory goes at once; so does a removed model
    fs.rm(f"{root}/simple/1", recursive=True)
    fs.pipe(f"{root}/simple/2/model.py", simple_model(2))
    result = again.sync()
    assert result.removed == [("simple", "1")] and result.pending == [("simple", "2")]
    assert not (local / "1").exists()
    fs.rm(f"{root}/simple", recursive=True)
    assert again.sync().removed == [("simple", "")]
    assert not local.exists()


async def test_engine_polls_a_memory_repository(memory_repo: tuple[Any, str]) -> None:
    fs, root = memory_repo
    fs.pipe(f"{root}/simple/config.pbtxt", SIMPLE_CONFIG)
    fs.pipe(f"{root}/simple/1/model.py", simple_model(0))
    engine = await flowserve.Engine.start(
        f"memory://{root}",
        settings=RepositorySettings(control_mode="poll", poll_secs=3600, remote=RemoteOptions(settle_s=0.0)),
    )
    cache = engine.remote.root
    try:
        assert await output0(engine) == 0
        assert await engine.poll_once() == ([], [])
        fs.pipe(f"{root}/simple/2/model.py", simple_model(2))
        assert await engine.poll_once() == ([], [])  # first sight of version 2
        assert await engine.poll_once() == (["simple"], [])
        assert await output0(engine) == 2 and engine.registry.versions("simple") == [2]
        fs.rm(f"{root}/simple", recursive=True)
        assert await engine.poll_once() == ([], ["simple"])
        with pytest.raises(Unavailable, match="not ready: unloaded"):
            await output0(engine)
    finally:
        await engine.stop()
    assert not cache.exists()  # the temporary cache is removed with the engine


async def test_a_missing_filesystem_package_is_a_clear_error() -> None:
    pytest.importorskip("fsspec")
    with pytest.raises(InvalidArgument, match=r"nosuchfs://.*(missing|Protocol not known|not known)"):
        await flowserve.Engine.start("nosuchfs://bucket/repo")


# ------------------------------------------------------------------------ a local S3 server


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3-compatible server on 127.0.0.1 and a free port, stopped after the module."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, str]]:
    """(s3fs filesystem, "bucket/repo") on the local server, with credentials in the
    environment as a deployment would set them; the bucket is emptied afterwards."""
    import s3fs

    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",  # never ask a metadata service for credentials
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": f"http://{s3_endpoint}"})
    bucket = f"models-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    try:
        yield fs, f"{bucket}/repo"
    finally:
        fs.rm(bucket, recursive=True)


def upload(fs: Any, path: str, data: bytes) -> None:
    fs.pipe(path, data)
    fs.invalidate_cache()


async def test_serves_from_s3_and_picks_up_a_new_version_in_poll_mode(
    s3: tuple[Any, str], s3_endpoint: str
) -> None:
    fs, repo = s3
    upload(fs, f"{repo}/simple/config.pbtxt", SIMPLE_CONFIG)
    upload(fs, f"{repo}/simple/1/model.py", simple_model(0))
    url = f"s3://{s3_endpoint}/{repo}"  # Triton's form for an S3-compatible endpoint
    engine = await flowserve.Engine.start(
        url,
        settings=RepositorySettings(control_mode="poll", poll_secs=3600, remote=RemoteOptions(settle_s=0.0)),
    )
    try:
        assert await output0(engine) == 0
        upload(fs, f"{repo}/simple/2/model.py", simple_model(2))
        assert await engine.poll_once() == ([], [])  # listed once: not known to be complete
        assert await output0(engine) == 0
        assert await engine.poll_once() == (["simple"], [])  # the same listing again: complete
        assert await output0(engine) == 2
        assert engine.registry.versions("simple") == [2]  # version_policy: latest 1
    finally:
        await engine.stop()


async def test_an_incomplete_upload_is_never_served(s3: tuple[Any, str], s3_endpoint: str) -> None:
    fs, repo = s3
    upload(fs, f"{repo}/simple/config.pbtxt", SIMPLE_CONFIG)
    upload(fs, f"{repo}/simple/1/model.py", simple_model(0))
    url = f"s3://{s3_endpoint}/{repo}"
    engine = await flowserve.Engine.start(
        url,
        settings=RepositorySettings(control_mode="poll", poll_secs=3600, remote=RemoteOptions(settle_s=0.0)),
    )
    try:
        # version 3 arrives in pieces: a large file first, then a second part, model.py last;
        # while its listing changes from poll to poll, version 1 keeps serving
        upload(fs, f"{repo}/simple/3/weights.bin", b"\0" * 1000)
        assert await engine.poll_once() == ([], [])
        upload(fs, f"{repo}/simple/3/weights.bin", b"\0" * 5000)
        assert await engine.poll_once() == ([], [])
        upload(fs, f"{repo}/simple/3/model.py", simple_model(3))
        assert await engine.poll_once() == ([], [])
        assert await output0(engine) == 0 and engine.registry.versions("simple") == [1]
        # nothing changed since the last poll: complete now
        assert await engine.poll_once() == (["simple"], [])
        assert await output0(engine) == 3
    finally:
        await engine.stop()

    # marker mode: a version directory without its marker is never read, at start or later
    upload(fs, f"{repo}/simple/1/{COMPLETE_MARKER}", b"")
    upload(fs, f"{repo}/simple/4/model.py", simple_model(4))
    engine = await flowserve.Engine.start(
        url,
        settings=RepositorySettings(
            control_mode="poll", poll_secs=3600, remote=RemoteOptions(complete="marker")
        ),
    )
    try:
        assert engine.registry.versions("simple") == [1]
        assert await engine.poll_once() == ([], [])
        assert await engine.poll_once() == ([], [])
        assert await output0(engine) == 0
        upload(fs, f"{repo}/simple/4/{COMPLETE_MARKER}", b"")
        assert await engine.poll_once() == (["simple"], [])  # at once: no second listing needed
        assert await output0(engine) == 4
    finally:
        await engine.stop()


@pytest.mark.slow
def test_flowserve_serve_with_an_s3_repository(
    s3: tuple[Any, str], s3_endpoint: str, server_factory: Any
) -> None:
    import tritonclient.http as httpclient

    fs, repo = s3
    upload(fs, f"{repo}/simple/config.pbtxt", SIMPLE_CONFIG)
    upload(fs, f"{repo}/simple/1/model.py", simple_model(0))
    server = server_factory.start(
        "--model-repository",
        f"s3://{s3_endpoint}/{repo}",
        "--repository-settle-secs=0.05",
        repositories=(),
        graphs=(),
        listeners="http",
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        names = ("INPUT0", "INPUT1")
        inputs = [httpclient.InferInput(name, [1, 16], "INT32") for name in names]
        for item in inputs:
            item.set_data_from_numpy(A)
        np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), 2 * A)
    finally:
        client.close()
    assert server.stop() == 0, server.log()


# ------------------------------------------------------------------------ Azure (Azurite)

AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def _azurite_binary() -> str | None:
    """``azurite-blob`` from npm: $AZURITE_BLOB, the PATH, or ./node_modules/.bin."""
    candidates = [os.environ.get("AZURITE_BLOB"), shutil.which("azurite-blob")]
    candidates.append(str(BUNDLED_REPOSITORY.parent / "node_modules" / ".bin" / "azurite-blob"))
    return next((c for c in candidates if c and Path(c).is_file()), None)


@pytest.fixture(scope="module")
def azurite() -> Iterator[str]:
    """The Azurite blob emulator (npm) on 127.0.0.1 and a free port, in memory, no telemetry;
    stopped after the module. Yields its connection string."""
    pytest.importorskip("adlfs")
    binary = _azurite_binary()
    if binary is None:
        pytest.skip("Azurite is not installed (npm install -g azurite, or set AZURITE_BLOB)")
    port = free_port()
    args = ["--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence"]
    args += ["--disableTelemetry", "--skipApiVersionCheck", "--silent"]
    proc = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.skip(f"Azurite did not start: {proc.stdout.read() if proc.stdout else ''}")
            time.sleep(0.1)
        yield (
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
            f"AccountKey={AZURITE_KEY};BlobEndpoint=http://127.0.0.1:{port}/devstoreaccount1;"
        )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()


async def test_serves_from_azure_blob_storage(azurite: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import fsspec

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite)
    fs = fsspec.filesystem("az", connection_string=azurite)
    container = f"models-{uuid.uuid4().hex[:8]}"
    fs.mkdir(container)
    try:
        upload(fs, f"{container}/repo/simple/config.pbtxt", SIMPLE_CONFIG)
        upload(fs, f"{container}/repo/simple/1/model.py", simple_model(0))
        engine = await flowserve.Engine.start(
            f"az://{container}/repo",
            settings=RepositorySettings(
                control_mode="poll", poll_secs=3600, remote=RemoteOptions(settle_s=0.0)
            ),
        )
        try:
            assert await output0(engine) == 0
            upload(fs, f"{container}/repo/simple/2/model.py", simple_model(2))
            assert await engine.poll_once() == ([], [])
            assert await engine.poll_once() == (["simple"], [])
            assert await output0(engine) == 2
        finally:
            await engine.stop()
    finally:
        fs.rm(container, recursive=True)
