"""The server processes an analysis starts and stops: ``flowserve serve`` on 127.0.0.1 and free
ports, explicit model control, serving the target from the analysis's work folder (a graph) or
the user's repository (a model). A candidate is applied through the load API without a restart
(a graph: its YAML rewritten in the work folder, then reloaded; a model: a config override);
only a change of ``--workers`` restarts the server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from flowserve.analyze.search import MeasureError
from flowserve.analyze.space import Candidate
from flowserve.analyze.target import Target, graph_document, graph_text, model_config

START_TIMEOUT_S = 180.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, body: dict[str, Any] | None = None, timeout: float = 120.0) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            text = reply.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            detail = str(json.loads(detail).get("error", detail))
        raise MeasureError(f"{exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise MeasureError(f"{url}: {getattr(exc, 'reason', exc)}") from None
    return dict(json.loads(text)) if text else {}


class AnalysisServer:
    """One server at a time; :meth:`apply` brings it to a candidate."""

    def __init__(self, target: Target, work: Path) -> None:
        self.target = target
        self.work = work
        self.graphs = work / "graphs"
        self.process: subprocess.Popen[bytes] | None = None
        self.workers = 0
        self.http_port = self.grpc_port = 0
        self.log = work / "server.log"

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"

    def _write_graph(self, candidate: Candidate) -> None:
        assert self.target.graph_file is not None
        self.graphs.mkdir(parents=True, exist_ok=True)
        text = graph_text(graph_document(self.target, candidate))
        (self.graphs / self.target.graph_file.name).write_text(text)

    def _command(self, workers: int) -> list[str]:
        command = [
            sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1",
            f"--http-port={self.http_port}", f"--grpc-port={self.grpc_port}", "--metrics-port=-1",
            "--model-control-mode", "explicit", "--load-model", self.target.name, "--workers", str(workers),
        ]  # fmt: skip
        for repository in self.target.repositories:
            command += ["--model-repository", str(repository)]
        if self.target.kind == "graph":
            command += ["--graphs", str(self.graphs)]
        return command

    def _env(self) -> dict[str, str]:
        """The user's node code stays importable: the folder holding the graph's folder (where a
        project keeps nodes/) and the working directory go on PYTHONPATH."""
        env = dict(os.environ)
        roots = [str(Path.cwd())]
        if self.target.graph_file is not None:
            roots.insert(0, str(self.target.graph_file.parent.parent))
        env["PYTHONPATH"] = os.pathsep.join([*roots, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return env

    def start(self, candidate: Candidate) -> None:
        self.stop()
        self.work.mkdir(parents=True, exist_ok=True)
        if self.target.kind == "graph":
            self._write_graph(candidate)
        self.http_port, self.grpc_port = free_port(), free_port()
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self._command(candidate.workers),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(),
                start_new_session=True,
            )
        self.workers = candidate.workers
        deadline = time.monotonic() + START_TIMEOUT_S
        ready = f"http://{self.url('http')}/v2/models/{self.target.name}/ready"
        while True:
            if self.process.poll() is not None:
                raise MeasureError(
                    f"the server exited with {self.process.returncode} at start: {self._tail()}"
                )
            with contextlib.suppress(MeasureError):
                _request(ready, timeout=2)
                break
            if time.monotonic() > deadline:
                raise MeasureError(f"the server was not ready after {START_TIMEOUT_S:.0f} s: {self._tail()}")
            time.sleep(0.25)
        if self.target.kind == "model" and self.target.config is None:
            self.target.config = self.config(self.target.name)  # the shipped config, as served

    def _tail(self, lines: int = 5) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def config(self, model: str) -> dict[str, Any]:
        return _request(f"http://{self.url('http')}/v2/models/{model}/config")

    def apply(self, candidate: Candidate) -> None:
        """Bring the server to ``candidate``: reload in place, or restart for other workers."""
        if self.process is None or self.process.poll() is not None or candidate.workers != self.workers:
            self.start(candidate)
            if self.target.kind == "graph":
                return  # started from the candidate's YAML
        load = f"http://{self.url('http')}/v2/repository/models/{self.target.name}/load"
        if self.target.kind == "graph":
            self._write_graph(candidate)
            _request(load, {})
        else:
            _request(load, {"parameters": {"config": json.dumps(model_config(self.target, candidate))}})

    def stats(self) -> list[dict[str, Any]]:
        """Per-node counters of the target (the web page's JSON), whole-server with workers."""
        reply = _request(f"http://{self.url('http')}/ui/api/graphs/{self.target.name}/stats", timeout=10)
        return list(reply.get("nodes") or [])

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)


__all__ = ["AnalysisServer", "free_port"]
