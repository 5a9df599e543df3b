"""Shared test helpers: repository paths, free ports, and a real ``flowserve serve`` process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUNDLED_REPOSITORY = ROOT / "model_repository"
BUNDLED_GRAPHS = ROOT / "graphs"
TEST_MODELS = ROOT / "tests" / "models"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProcess:
    """A running ``flowserve serve`` on 127.0.0.1 with free ports; output kept for debugging."""

    http_port: int
    grpc_port: int
    metrics_port: int
    process: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)
    pump: threading.Thread | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return "".join(self.output)

    def stop(self, timeout: float = 20.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.pump is not None:
            self.pump.join(5)  # it closes the stdout pipe at EOF (else: ResourceWarning)
        return int(self.process.returncode)


def start_server(
    *extra: str,
    repositories: tuple[Path, ...] = (BUNDLED_REPOSITORY, TEST_MODELS),
    graphs: tuple[Path, ...] = (BUNDLED_GRAPHS,),
    listeners: str | None = None,
    timeout: float = 90.0,
) -> ServerProcess:
    """Start a server subprocess and wait until it says it is ready.

    ``listeners`` (default: env FLOWSERVE_TEST_LISTENERS or "http,grpc,metrics") picks which
    front ends run; the others get port -1 (off). A free port can be taken by another process
    between :func:`free_port` and the server's bind (tests run in parallel): a server that
    stops with "address already in use" is started again on other ports.
    """
    for attempt in range(PORT_RETRIES):
        try:
            return _start_server(extra, repositories, graphs, listeners, timeout)
        except PortTaken:
            if attempt == PORT_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


PORT_RETRIES = 4


class PortTaken(RuntimeError):
    """The server could not bind a port :func:`free_port` had found free."""


def _start_server(
    extra: tuple[str, ...],
    repositories: tuple[Path, ...],
    graphs: tuple[Path, ...],
    listeners: str | None,
    timeout: float,
) -> ServerProcess:
    wanted = (listeners or os.environ.get("FLOWSERVE_TEST_LISTENERS", "http,grpc,metrics")).split(",")
    ports = {name: (free_port() if name in wanted else -1) for name in ("http", "grpc", "metrics")}
    cmd = [sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1"]
    cmd += [
        f"--http-port={ports['http']}",
        f"--grpc-port={ports['grpc']}",
        f"--metrics-port={ports['metrics']}",
    ]
    for repo in repositories:
        cmd += ["--model-repository", str(repo)]
    for gdir in graphs:
        cmd += ["--graphs", str(gdir)]
    cmd += list(extra)
    if TEST_MODELS in repositories and not any(a.startswith("--strict-readiness") for a in extra):
        # tests/models/broken fails to load on purpose: with strict readiness (the default) the
        # server would never read ready; the tests of readiness itself say what they want
        cmd.append("--strict-readiness=false")
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    server = ServerProcess(ports["http"], ports["grpc"], ports["metrics"], proc)
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        with proc.stdout:
            for line in proc.stdout:
                server.output.append(line)
                if "flowserve ready" in line or "flowserve not ready" in line:  # started
                    ready.set()

    server.pump = threading.Thread(target=pump, daemon=True)
    server.pump.start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.1):
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            if "address already in use" in server.log():
                raise PortTaken(server.log())
            raise RuntimeError(f"flowserve did not start:\n{server.log()}")
    return server


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """One server for a whole test session (bundled content + tests/models, shm allowed)."""
    proc = start_server(
        "--allow-shm", "--model-control-mode=explicit", "--load-model=*", f"--cache-size={1 << 20}"
    )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def server_factory() -> Iterator[type[_Factory]]:
    """Start extra servers with custom arguments inside one test; all are stopped after it."""
    started: list[ServerProcess] = []

    class Factory(_Factory):
        @staticmethod
        def start(*extra: str, **kwargs: object) -> ServerProcess:
            proc = start_server(*extra, **kwargs)  # type: ignore[arg-type]
            started.append(proc)
            return proc

    try:
        yield Factory
    finally:
        for proc in started:
            proc.stop()


class _Factory:
    @staticmethod
    def start(*extra: str, **kwargs: object) -> ServerProcess:
        raise NotImplementedError
