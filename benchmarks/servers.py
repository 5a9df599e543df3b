"""Start and always stop the servers of a benchmark run, each in its own process group.

:class:`ServerGroup` is a context manager: every server started through it is stopped when the
block exits, however it exits (an error, Ctrl-C or SIGTERM, which :func:`sigterm_as_interrupt`
turns into KeyboardInterrupt). A server is stopped with SIGTERM to its whole process group
(Triton's Python-backend stubs included), then SIGKILL after a grace period. Every server
listens on 127.0.0.1 only, on free ports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc)."""
    out = [pid]
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for child in children:
        out += _tree(int(child))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` and its descendants so far (0 where unreadable)."""
    ticks = 0
    for p in _tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class Server:
    """One started server: its HTTP and gRPC ports (-1: none) and its log file."""

    name: str
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log: Path
    ready_paths: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.process.pid

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.http_port if protocol == 'http' else self.grpc_port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, grace_s: float = 15.0) -> None:
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tcp_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


class ServerGroup:
    """The servers of one run; all stopped on exit from the ``with`` block."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.servers: list[Server] = []

    def __enter__(self) -> ServerGroup:
        self.logs.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def stop_all(self) -> None:
        for server in reversed(self.servers):
            server.stop()
        self.servers.clear()

    def start(
        self,
        name: str,
        command: Sequence[str],
        http_port: int,
        grpc_port: int,
        ready_paths: Sequence[str] = ("/v2/health/ready",),
        env: dict[str, str] | None = None,
        timeout_s: float = 120.0,
        cwd: Path | None = None,
    ) -> Server:
        """Start ``command`` (in ``cwd``, default the repository root) in a new process group and
        wait until every ``ready_paths`` answers 200 on its HTTP port and its gRPC port accepts
        connections."""
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                list(command),
                cwd=cwd or ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = Server(name, process, http_port, grpc_port, log, list(ready_paths))
        self.servers.append(server)
        deadline = time.monotonic() + timeout_s
        while True:
            if not server.alive():
                raise RuntimeError(f"{name} exited with {process.returncode} during start; see {log}")
            http_ok = http_port < 0 or all(
                _http_ok(f"http://127.0.0.1:{http_port}{path}") for path in server.ready_paths
            )
            if http_ok and (grpc_port < 0 or _tcp_open(grpc_port)):
                return server
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} was not ready after {timeout_s:.0f} s; see {log}")
            time.sleep(0.25)


def flowserve_command(repository: Path, graphs: Path, http_port: int, grpc_port: int) -> list[str]:
    return [
        sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1",
        f"--http-port={http_port}", f"--grpc-port={grpc_port}", "--metrics-port=-1",
        "--model-repository", str(repository), "--graphs", str(graphs),
    ]  # fmt: skip


def bare_command(protocol: str, port: int) -> list[str]:
    return [sys.executable, str(HERE / f"bare_{protocol}.py"), "--host", "127.0.0.1", "--port", str(port)]


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise KeyboardInterrupt (so ``finally`` and ``with``
    clean up), SIGINT even when the process was started with it ignored (a background job)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
