"""The server processes an analysis starts and stops: ``flowserve serve`` on 127.0.0.1 and free
ports, explicit model control, serving a graph target from the analysis's work folder (a copy of
the graph file and of every graph file it uses; the node code is imported from where it is, read
only) and models from the user's repositories. A candidate is applied through the load API
without a restart (a graph: its copy rewritten, then reloaded; a model: a config override); only a
change of ``--workers`` restarts the server."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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
from flowserve.analyze.space import Candidate, NodeConfig
from flowserve.analyze.target import Target, graph_text, locate, model_override

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


def model_entry(name: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A model's statistics (Triton's, every version summed) in the shape of a node's on the
    web page: calls, and queue and compute time as averages over those calls."""

    def total(key: str, part: str = "ns") -> int:
        return sum(int((e.get("inference_stats") or {}).get(key, {}).get(part, 0)) for e in entries)

    calls = total("success", "count")
    compute = total("compute_input") + total("compute_infer") + total("compute_output")
    per = 1000 * calls if calls else 1
    return {
        "name": name,
        "kind": "model",
        "calls": calls,
        "queue_us": total("queue") / per,
        "compute_us": compute / per,
        "avg_us": total("success") / per,
        "inference_count": sum(int(e.get("inference_count", 0)) for e in entries),
        "execution_count": sum(int(e.get("execution_count", 0)) for e in entries),
    }


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
        self.shipped: Candidate | None = None  # what a fresh start serves, once known
        self.written: dict[str, str] = {}  # graph name -> its text in the work folder
        self.models_now: dict[str, NodeConfig] = {}  # tuned models as served now
        self.files: dict[str, str] = {}  # graph name -> its file name in the work folder
        for name, graph in target.graphs.items():
            taken = graph.path.name in self.files.values()
            self.files[name] = f"{name}.yaml" if taken else graph.path.name

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"

    def know_shipped(self, shipped: Candidate) -> None:
        """The shipped configuration (what the server serves after a fresh start)."""
        self.shipped = shipped
        self.models_now = self._models_of(shipped)

    def _models_of(self, candidate: Candidate) -> dict[str, NodeConfig]:
        return {unit: node for unit, node in candidate.nodes if not locate(self.target, unit)[0]}

    def _write_graphs(self, candidate: Candidate) -> list[str]:
        """The work folder's graph files with the candidate's settings; returns the graphs whose
        file changed."""
        self.graphs.mkdir(parents=True, exist_ok=True)
        changed = []
        for name in self.target.graphs:
            text, _ = graph_text(self.target, candidate, name)
            if self.written.get(name) != text:
                (self.graphs / self.files[name]).write_text(text)
                self.written[name] = text
                changed.append(name)
        return changed

    def _copy_warmup(self) -> None:
        """A graph's warmup samples are read from ./warmup beside its file: copied along."""
        for folder in dict.fromkeys(g.path.parent for g in self.target.graphs.values()):
            if (folder / "warmup").is_dir():
                shutil.copytree(folder / "warmup", self.graphs / "warmup", dirs_exist_ok=True)

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
        """The user's node code is run where it is (read only): the folder holding each graph's
        folder (where a project keeps nodes/) and the working directory go on PYTHONPATH."""
        env = dict(os.environ)
        folders = [str(g.path.parent.parent) for g in self.target.graphs.values()]
        roots = list(dict.fromkeys([*folders, str(Path.cwd())]))
        env["PYTHONPATH"] = os.pathsep.join([*roots, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return env

    def start(self, candidate: Candidate) -> None:
        self.stop()
        self.work.mkdir(parents=True, exist_ok=True)
        if self.target.kind == "graph":
            self.written = {}
            self._write_graphs(candidate)
            self._copy_warmup()
        self.models_now = self._models_of(self.shipped) if self.shipped is not None else {}
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

    def _load(self, name: str, config: dict[str, Any] | None = None) -> None:
        body = {} if config is None else {"parameters": {"config": json.dumps(config)}}
        _request(f"http://{self.url('http')}/v2/repository/models/{name}/load", body)

    def apply(self, candidate: Candidate) -> None:
        """Bring the server to ``candidate``: the models whose settings change reloaded with a
        config override, then the graph files that change rewritten and reloaded (the graphs
        they use first); a restart only for other workers."""
        if self.process is None or self.process.poll() is not None or candidate.workers != self.workers:
            self.start(candidate)
        for unit, node in candidate.nodes:
            where, model = locate(self.target, unit)
            if where or self.models_now.get(unit) == node:
                continue
            config = self.target.config if model == self.target.name else self.target.configs.get(model)
            self.models_now.pop(unit, None)
            self._load(model, model_override(config or {}, node))
            self.models_now[unit] = node
        if self.target.kind != "graph":
            return
        changed = self._write_graphs(candidate)
        for name in reversed(self.target.graphs):
            if name in changed:
                try:
                    self._load(name)
                except MeasureError:
                    self.written.pop(name, None)  # not served: written again next time
                    raise

    def stats(self) -> list[dict[str, Any]]:
        """Per-node counters of the target and the graphs it uses (the web page's JSON; a used
        graph's nodes named GRAPH/NODE) and per-model counters of the tuned models (the
        statistics API), whole-server with workers."""
        out: list[dict[str, Any]] = []
        for name in self.target.graphs:
            reply = _request(f"http://{self.url('http')}/ui/api/graphs/{name}/stats", timeout=10)
            prefix = "" if name == self.target.name else f"{name}/"
            out += [{**n, "name": prefix + str(n["name"])} for n in reply.get("nodes") or []]
        if self.shipped is not None:  # the nodes tuned (a sub-graph's step would count its nodes twice)
            out = [n for n in out if n["name"] in dict(self.shipped.nodes)]
        tuned = self._models_of(self.shipped) if self.shipped is not None else {}
        models = {locate(self.target, unit)[1]: unit for unit in tuned}
        if models:
            reply = _request(f"http://{self.url('http')}/v2/models/stats", timeout=10)
            for model, unit in models.items():
                entries = [e for e in reply.get("model_stats") or [] if e.get("name") == model]
                out.append(model_entry(unit, entries))
        return out

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
