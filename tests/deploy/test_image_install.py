"""The images serve what they ship, checked without a container runtime: the Dockerfile is
replayed (tests/deploy/dockerfile.py) into a folder standing for the image's root: its COPY
steps, and its install step (docker/install.sh, the CPU variant) run into a fresh venv there
with this machine's python3 and pip configuration. The image's ENTRYPOINT and CMD (paths mapped,
ports free on 127.0.0.1) must then answer /v2/health/ready 200 with every bundled model and
graph READY. Then deploy/examples/own-image/Dockerfile is replayed on top: the derived image
serves its own models, graphs and node code, and nothing of the bundled content.

Slow: a fresh install of the bundled extras (torch, DALI, ONNX Runtime, tree libraries: about
2.4 GB) takes about 3 minutes here. FLOWSERVE_TEST_TORCH_INDEX: the torch index the install
uses (default "none": this machine's pip configuration; the image's own default is
download.pytorch.org/whl/cpu). FLOWSERVE_SKIP_IMAGE_INSTALL=1 skips the module."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import free_port
from tests.deploy.dockerfile import Image, replay
from tests.deploy.kustomize import DEPLOY, ROOT, build
from tests.deploy.test_manifests import container

pytestmark = [pytest.mark.slow, pytest.mark.image]  # make test-image (not in make test: minutes)

EXAMPLE = DEPLOY / "examples" / "own-image"
LISTENERS = ("--host", "--http-port", "--grpc-port", "--metrics-port")


def system_step(command: str) -> bool:
    """RUN steps that need a base image and root (system packages, the image's user)."""
    return "apt-get" in command or "useradd" in command


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    if os.environ.get("FLOWSERVE_SKIP_IMAGE_INSTALL") == "1":
        pytest.skip("FLOWSERVE_SKIP_IMAGE_INSTALL=1")
    root = tmp_path_factory.mktemp("image-root")
    built = replay(
        ROOT / "Dockerfile",
        ROOT,
        Image(root),
        build_args={"TORCH_INDEX": os.environ.get("FLOWSERVE_TEST_TORCH_INDEX", "none")},
        run=lambda command: "docker/install.sh" in command,
    )
    try:
        yield built
    finally:
        shutil.rmtree(root, ignore_errors=True)


class Served:
    def __init__(self, image: Image, args: list[str] | None = None) -> None:
        self.port = free_port()
        env = image.host_env()
        binary = shutil.which(image.entrypoint[0], path=env["PATH"])
        assert binary is not None and binary.startswith(str(image.root)), binary  # the image's venv
        args = [a for a in (args if args is not None else image.cmd) if not a.startswith(LISTENERS)]
        argv = [binary, *image.entrypoint[1:], *(image.map_text(a) for a in args)]
        argv += ["--host=127.0.0.1", f"--http-port={self.port}", f"--grpc-port={free_port()}"]
        argv += [f"--metrics-port={free_port()}"]
        self.log = image.root / f"serve-{self.port}.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                argv, cwd=image.path("."), env=env, stdout=out, stderr=subprocess.STDOUT
            )

    def get(self, path: str, method: str = "GET") -> tuple[int, bytes]:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self, deadline_s: float = 600) -> None:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the server exited:\n{self.log.read_text()}"
            try:
                if self.get("/v2/health/ready")[0] == 200:
                    return
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        raise AssertionError(f"not ready after {deadline_s} s:\n{self.log.read_text()}")

    def index(self) -> dict[str, str]:
        status, body = self.get("/v2/repository/index", "POST")
        assert status == 200, body
        return {entry["name"]: entry["state"] for entry in json.loads(body)}

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(timeout=60)


def shipped(root: Path) -> set[str]:
    """The names a content folder serves: model directories (with or without a config.pbtxt:
    ONNX models complete their own) and graph names."""
    models = {
        p.name for p in (root / "model_repository").iterdir() if p.is_dir() and not p.name.startswith(".")
    }
    graphs = {yaml.safe_load(p.read_text())["name"] for p in (root / "graphs").glob("*.yaml")}
    return models | graphs


def test_the_cpu_image_serves_every_bundled_model_ready(image: Image) -> None:
    assert image.ran == [
        'TORCH_INDEX="$TORCH_INDEX" sh docker/install.sh "$VIRTUAL_ENV" "$VARIANT" "$EXTRAS"'
    ]
    assert image.skipped and all(system_step(c) for c in image.skipped), image.skipped
    # what the Deployment runs is what the image runs
    assert container(build(DEPLOY / "base"))["args"] == image.cmd
    server = Served(image)
    try:
        server.wait_ready()
        states = server.index()
        assert states == dict.fromkeys(shipped(ROOT), "READY")
        assert len(states) == 12  # 9 models and 3 graphs (issue 30: 6 were unavailable)
        assert server.get("/v2/health/live")[0] == 200
    finally:
        assert server.stop() == 0, server.log.read_text()


def test_a_derived_image_serves_its_own_models_graphs_and_nodes(image: Image) -> None:
    """deploy/examples/own-image replaces the bundled content (runs after the test above: it
    changes the image's folders)."""
    derived = replay(
        EXAMPLE / "Dockerfile",
        EXAMPLE,
        image,
        run=lambda command: command.startswith("rm -rf /opt/flowserve/"),
    )
    assert derived.user == "10001:10001"  # the image's user again, as deploy/base runs it
    server = Served(derived)
    try:
        server.wait_ready()
        assert (
            server.index()
            == dict.fromkeys(shipped(EXAMPLE), "READY")
            == {
                "add_one": "READY",
                "affine": "READY",
            }
        )
        body = json.dumps(
            {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))}]}
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/v2/models/affine/infer", data=body, method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            (out,) = json.loads(response.read())["outputs"]
        assert out["data"] == [(x + 1) * 3 + 1 for x in range(16)]  # add_one, then nodes.mathops:Affine
    finally:
        assert server.stop() == 0, server.log.read_text()
