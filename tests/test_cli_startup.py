"""The command line: help and defaults on every option, Triton's spellings, one-line errors with
their exit status, the startup table, strict readiness, --exit-on-error, and client shared
memory on by default (off with --allow-shm=false)."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from flowserve import cli
from flowserve.core.version import VERSION
from flowserve.settings import Settings
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent


def _parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


def test_every_option_has_help_and_shows_its_default() -> None:
    parser = cli.build_parser(Settings())
    for prog, sub in _parsers(parser):
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{prog}: {action.option_strings or action.dest} has no help"
        text = sub.format_help()
        assert "(default:" in text or prog.endswith(("validate", "graph")), prog
    serve_help = next(p for prog, p in _parsers(parser) if prog == "flowserve serve").format_help()
    for shown in ("(default: 8000)", "(default: True)", "(default: none)", "(default: INFO)"):
        assert shown in serve_help, shown


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"flowserve {VERSION}"


def test_log_level_before_or_after_the_subcommand() -> None:
    parser = cli.build_parser(Settings())
    assert parser.parse_args(["serve"]).log_level == "INFO"
    assert parser.parse_args(["serve", "--log-level", "debug"]).log_level == "DEBUG"
    assert parser.parse_args(["--log-level", "WARNING", "serve"]).log_level == "WARNING"  # not reset
    assert parser.parse_args(["validate", "x", "--log-level=error", "--log-json"]).log_json is True
    assert parser.parse_args(["graph", "list", "--log-level", "error"]).log_level == "ERROR"


def test_triton_spellings_are_accepted() -> None:
    parser = cli.build_parser(Settings())
    args = parser.parse_args(
        ["serve", "--model-store", "a", "--model-repository=b", "--http-address", "127.0.0.1",
         "--allow-grpc=false", "--allow-metrics", "false", "--strict-model-config=false",
         "--log-verbose", "1", "--strict-readiness=false", "--exit-on-error"]
    )  # fmt: skip
    assert args.model_repository == ["a", "b"] and args.host == "127.0.0.1"
    assert (args.allow_http, args.allow_grpc, args.allow_metrics) == (True, False, False)
    assert args.strict_model_config is False and args.log_verbose == 1
    assert args.strict_readiness is False and args.exit_on_error is True


def _settings_of(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Settings:
    """The Settings ``flowserve serve ARGV`` would start a server with."""
    import flowserve.server

    seen: list[Settings] = []

    async def fake_serve(options: Settings) -> int:
        seen.append(options)
        return 0

    monkeypatch.setattr(flowserve.server, "serve", fake_serve)
    monkeypatch.setattr(flowserve.server, "exit_watchdog", lambda: None)
    monkeypatch.setattr(cli.faulthandler, "enable", lambda: None)
    assert cli.main(["serve", "--loop", "asyncio", *argv]) == 0
    return seen[0]


def test_serve_settings_from_the_triton_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = _settings_of(monkeypatch, ["--model-store", str(tmp_path), "--allow-http=false"])
    assert settings.model_repositories == [tmp_path]
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (-1, 8001, 8002)
    assert settings.allow_shm is True and settings.strict_readiness is True
    assert settings.exit_on_error is False
    settings = _settings_of(monkeypatch, ["--graphs", str(ROOT / "graphs"), "--allow-shm=false"])
    assert settings.allow_shm is False
    assert _settings_of(monkeypatch, ["--graphs", str(ROOT / "graphs"), "--allow-shm"]).allow_shm is True


def test_shared_memory_is_on_by_default() -> None:
    assert Settings().allow_shm is True
    assert Settings.from_env({"FLOWSERVE_ALLOW_SHM": "false"}).allow_shm is False
    parser = cli.build_parser(Settings())
    assert parser.parse_args(["serve"]).allow_shm is True
    assert parser.parse_args(["serve", "--allow-shm=false"]).allow_shm is False
    assert parser.parse_args(["serve", "--allow-shm", "no"]).allow_shm is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["serve", "--http-port", "eighty"], "argument --http-port: invalid int value"),
        (["serve", "--allow-shm=maybe"], "expected true or false"),
        (["serve", "--log-level", "loud"], "argument --log-level: invalid choice"),
        (["nothing"], "invalid choice: 'nothing'"),
        ([], "the following arguments are required"),
    ],
)
def test_a_command_line_mistake_is_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "usage:" not in err, err


def test_a_missing_repository_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere"
    assert cli.main(["serve", "--model-repository", str(missing)]) == 2
    assert capsys.readouterr().err == f"error: --model-repository {missing}: no such directory\n"
    afile = tmp_path / "file"
    afile.write_text("")
    assert cli.main(["serve", "--model-repository", str(afile)]) == 2
    assert capsys.readouterr().err == f"error: --model-repository {afile}: not a directory\n"
    assert cli.main(["serve", "--graphs", str(missing)]) == 2
    assert capsys.readouterr().err == f"error: --graphs {missing}: no such directory\n"


def test_an_unknown_cpu_affinity_from_the_environment_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse checks ``--cpu-affinity``'s choices, not a default taken from the environment."""
    monkeypatch.setenv("FLOWSERVE_CPU_AFFINITY", "spred")
    assert cli.main(["serve", "--model-repository", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "error: --cpu-affinity (or FLOWSERVE_CPU_AFFINITY): expected one of none, spread, got 'spred'\n"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_an_unreadable_repository_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0)
    try:
        assert cli.main(["serve", "--model-repository", str(closed)]) == 2
        assert (
            capsys.readouterr().err
            == f"error: --model-repository {closed}: permission denied (cannot read it)\n"
        )
    finally:
        closed.chmod(0o755)


# ------------------------------------------------------------------ servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``simple`` (loads) and ``broken`` (fails in initialize)."""
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(ROOT / "model_repository" / "simple", repo / "simple")
    shutil.copytree(ROOT / "tests" / "models" / "broken", repo / "broken")
    return repo


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1", *argv]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_a_port_in_use_is_one_line(repository: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _run(
            "--model-repository", str(repository / "simple" / ".."), f"--http-port={port}",
            "--grpc-port=-1", "--metrics-port=-1", "--log-level=ERROR",
        )  # fmt: skip
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: cannot listen for HTTP on 127.0.0.1:{port}: address already in use (another server on "
        "that port? choose one with --http-port, or -1 to turn the HTTP listener off)"
    ], done.stderr


@pytest.mark.slow
def test_exit_on_error_ends_the_server_when_a_model_fails(repository: Path) -> None:
    done = _run(
        "--model-repository", str(repository), "--http-port=0", "--grpc-port=-1", "--metrics-port=-1",
        "--exit-on-error", "--log-level=CRITICAL",
    )  # fmt: skip
    assert done.returncode == 1, done
    assert done.stderr.strip().splitlines()[-1] == (
        "error: 1 model(s) failed to load (broken); exiting (--exit-on-error)"
    )
    assert "Traceback" not in done.stderr
    assert "flowserve ready" not in done.stdout
    table = done.stdout.splitlines()
    assert table[0].split() == ["MODEL", "KIND", "VERSION", "STATUS"]
    assert any(line.split()[:3] == ["broken", "python", "1"] and "UNAVAILABLE" in line for line in table)
    assert any(line.split() == ["simple", "python", "1", "READY"] for line in table)


@pytest.mark.slow
def test_exit_on_error_and_the_startup_table_with_workers(repository: Path) -> None:
    http, grpc = free_port(), free_port()
    done = _run(
        "--model-repository", str(repository), f"--http-port={http}", f"--grpc-port={grpc}",
        "--metrics-port=-1", "--workers=2", "--exit-on-error", "--log-level=ERROR",
    )  # fmt: skip
    assert done.returncode == 1, done
    # the one traceback logged is the failing model's own code (file:line), no crash of ours
    assert 'broken/1/model.py", line 3, in initialize' in done.stderr, done.stderr
    assert f'File "{ROOT / "flowserve"}' not in done.stderr
    assert "flowserve ready" not in done.stdout
    # one table for the server (worker 0's), and the reason in the worker's line
    table = done.stdout.splitlines()
    assert sum(line.split() == ["MODEL", "KIND", "VERSION", "STATUS"] for line in table) == 1, done.stdout
    assert any(line.split() == ["simple", "python", "1", "READY"] for line in table)
    assert "1 model(s) failed to load (broken); exiting (--exit-on-error)" in done.stderr, done.stderr


@pytest.fixture
def started(server_factory: Any, repository: Path) -> Any:
    def start(*extra: str) -> Any:
        return server_factory.start(*extra, repositories=(repository,), graphs=(), listeners="http")

    return start


def _printed(server: Any, line: str, wait_s: float = 10.0) -> bool:
    """Whether the server printed ``line`` (on stdout: a line of its own, not a log line),
    waiting a little for it (the log's copy of it may have been read first)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if line + "\n" in server.output:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_startup_table_strict_readiness_and_shared_memory(started: Any) -> None:
    server = started()
    out = "".join(server.output)
    assert "serving 1 of 2; 1 failed: broken\n" in out  # under the table, and in the last line
    assert f"HTTP    http://127.0.0.1:{server.http_port}" in out
    assert "flowserve ready" not in out  # it is not: strict readiness and a model failed
    assert _printed(
        server,
        "flowserve not ready: serving 1 of 2; 1 failed: broken; not ready until they load "
        f"(--strict-readiness), serving the others: HTTP http://127.0.0.1:{server.http_port}",
    )
    line = next(x for x in server.output if x.startswith("broken"))
    assert "UNAVAILABLE" in line and "broken on purpose" in line, line
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.is_server_live() and not client.is_server_ready()  # strict: broken failed
        assert client.is_model_ready("simple")
        assert client.get_system_shared_memory_status() == []  # on by default, as in Triton
    finally:
        client.close()


@pytest.mark.slow
def test_readiness_not_strict_and_shared_memory_off(started: Any) -> None:
    server = started("--strict-readiness=false", "--allow-shm=false")
    assert _printed(
        server,
        "flowserve ready: serving 1 of 2; 1 failed: broken (--strict-readiness=false): "
        f"HTTP http://127.0.0.1:{server.http_port}",
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.is_server_ready()
        with pytest.raises(InferenceServerException) as err:
            client.get_system_shared_memory_status()
        assert err.value.status() == "501" and "--allow-shm" in err.value.message()
    finally:
        client.close()


def test_startup_table_lists_every_state() -> None:
    """The table as a function of the registry (no server)."""
    from flowserve.dataplane.engine import Engine
    from flowserve.server import ServerPlane, failed_models, startup_table

    async def main() -> None:
        engine = await Engine.start(ROOT / "tests" / "models" / "broken" / "..", settings=_explicit())
        try:
            plane = ServerPlane(engine)
            assert failed_models(plane) == []  # never loaded (explicit mode) is not a failure
            assert plane.ready()
            text = startup_table(plane, [("HTTP", "http://h:1")])
            assert text.splitlines()[-1] == "HTTP    http://h:1"
            assert text.splitlines()[-2].startswith("serving 0 of 0 (")  # ... not loaded: explicit mode
            assert text.splitlines()[-2].endswith(" not loaded: explicit mode)")
        finally:
            await engine.stop()

    asyncio.run(main())


def _explicit() -> Any:
    from flowserve.repository.settings import RepositorySettings

    return RepositorySettings(control_mode="explicit")


# ------------------------------------------------------------------ long loads

SLOW_GRAPH = """
name: slow
inputs:
  x: {datatype: FP32, dims: [4]}
outputs:
  y: pre.y
nodes:
  pre:
    python: slow_start_node:Pre
    inputs: {x: $x}
    outputs: {y: {datatype: FP32, dims: [4]}}
"""
SLOW_NODE = """
import time


class Pre:
    def initialize(self, config):
        time.sleep(%s)

    def execute(self, inputs):
        return {"y": inputs["x"]}
"""


def _slow_project(tmp_path: Path, seconds: float) -> Path:
    """A graphs folder whose one graph's node takes ``seconds`` in initialize."""
    (tmp_path / "slow_start_node.py").write_text(SLOW_NODE % seconds)
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    (graphs / "slow.yaml").write_text(SLOW_GRAPH)
    return graphs


def _status(url: str) -> int | None:
    """The HTTP status of GET ``url``; None when nothing answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


class _Serving:
    """A ``flowserve serve`` subprocess whose output is read as it comes."""

    def __init__(self, *argv: str) -> None:
        import threading

        cmd = [sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1", *argv]
        self.process = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self.lines: list[str] = []
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        with self.process.stdout:
            for line in self.process.stdout:
                self.lines.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((line for line in list(self.lines) if text in line), None)
            if found is not None:
                return found
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"no line with {text!r}:\n" + "\n".join(self.lines))

    def printed(self, line: str, timeout_s: float = 10.0) -> bool:
        """Whether ``line`` came as a line of its own (printed, not logged)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if line in self.lines:
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> int:
        import signal

        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.pump.join(5)
        return int(self.process.returncode)


def _probe_while_loading(http: int, serving: _Serving) -> list[tuple[int | None, int | None]]:
    """(live, ready) statuses seen while the server loads (until its last startup line)."""
    seen: list[tuple[int | None, int | None]] = []
    base = f"http://127.0.0.1:{http}/v2/health"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any("flowserve ready" in line for line in serving.lines):
        if serving.process.poll() is not None:
            break
        live = _status(f"{base}/live")
        if live is not None and not any("flowserve ready" in line for line in serving.lines):
            seen.append((live, _status(f"{base}/ready")))
        time.sleep(0.2)
    return seen


@pytest.mark.slow
def test_health_answers_while_a_slow_initialize_loads(tmp_path: Path) -> None:
    """Live (200) and not ready (400, as Triton answers) while a node's initialize runs, a progress line every
    few seconds, then ready (as Triton's probes behave during a long load)."""
    graphs = _slow_project(tmp_path, 5)
    http = free_port()
    serving = _Serving("--graphs", str(graphs), f"--http-port={http}", "--grpc-port=-1", "--metrics-port=-1")
    try:
        serving.wait_for("loading models and graphs")  # the listener is up before the load
        seen = _probe_while_loading(http, serving)
        assert (200, 400) in seen, seen  # live, not ready, while loading
        assert all(live == 200 and ready == 400 for live, ready in seen[:-1]), seen
        progress = serving.wait_for("loading graph 'slow' version 1, node 'pre' (")
        assert progress.endswith(" s)..."), progress
        assert serving.wait_for("flowserve ready:").endswith(f"flowserve ready: HTTP http://127.0.0.1:{http}")
        assert _status(f"http://127.0.0.1:{http}/v2/health/ready") == 200
    finally:
        assert serving.stop() == 0


@pytest.mark.slow
def test_health_answers_while_loading_with_workers(tmp_path: Path) -> None:
    graphs = _slow_project(tmp_path, 5)
    http = free_port()
    serving = _Serving(
        "--graphs", str(graphs), f"--http-port={http}", "--grpc-port=-1", "--metrics-port=-1", "--workers=2"
    )
    try:
        seen = _probe_while_loading(http, serving)
        assert (200, 400) in seen, seen
        assert serving.wait_for("flowserve ready:").endswith(f"flowserve ready: 2 workers, HTTP :{http}")
        assert _status(f"http://127.0.0.1:{http}/v2/health/ready") == 200
        # every worker loads the same graph; one of them says how it goes (not one line each)
        progress = [x for x in serving.lines if "loading graph 'slow' version 1, node 'pre' (3 s)" in x]
        assert len(progress) == 1, serving.lines
    finally:
        assert serving.stop() == 0


@pytest.mark.slow
def test_workers_say_not_ready_when_a_model_failed(repository: Path) -> None:
    http = free_port()
    serving = _Serving(
        "--model-repository", str(repository), f"--http-port={http}", "--grpc-port=-1", "--metrics-port=-1",
        "--workers=2",
    )  # fmt: skip
    try:
        serving.wait_for("flowserve not ready:")
        assert serving.printed(
            "flowserve not ready: serving 1 of 2; 1 failed: broken; not ready until they load "
            f"(--strict-readiness), serving the others: 2 workers, HTTP :{http}"
        )
        assert not any("flowserve ready" in x for x in serving.lines)
    finally:
        assert serving.stop() == 0


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_stopped_while_loading(tmp_path: Path, workers: int) -> None:
    """SIGTERM during a long load stops the server (a pod stopped while it starts), also with
    ``--workers`` (each worker abandoned its load only once it ended, 60 s here)."""
    graphs = _slow_project(tmp_path, 60)
    http = free_port()
    ports = ["--grpc-port=-1", "--metrics-port=-1"]
    if workers > 1:
        ports = [f"--grpc-port={free_port()}", f"--metrics-port={free_port()}", "--workers", str(workers)]
    serving = _Serving("--graphs", str(graphs), f"--http-port={http}", *ports)
    try:
        serving.wait_for("loading models and graphs")
        assert _status(f"http://127.0.0.1:{http}/v2/health/live") == 200
    finally:
        assert serving.stop() == 0  # within stop()'s 30 s, not after the 60 s load (else killed)
    assert any("stopped while loading" in line for line in serving.lines), serving.lines


@pytest.mark.slow
def test_an_empty_repository_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    http = free_port()
    serving = _Serving(
        "--model-repository", str(empty), f"--http-port={http}", "--grpc-port=-1", "--metrics-port=-1"
    )
    try:
        assert serving.wait_for("WARNING flowserve: nothing to serve").endswith(
            f"nothing to serve: no model directories or graph files in {empty}"
        )
        assert serving.printed(
            f"flowserve ready, serving nothing (no models or graphs were loaded): HTTP http://127.0.0.1:{http}"
        ), serving.lines
    finally:
        assert serving.stop() == 0


GATED_MODEL = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        gate = os.path.join(args["model_repository"], "..", "go")
        while not os.path.exists(gate):  # loads until the test opens the gate
            time.sleep(0.02)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(1, np.float32))]) for _ in requests]
"""


async def test_ready_only_from_the_end_of_the_initial_loads_until_shutdown_begins(tmp_path: Path) -> None:
    """/v2/health/ready says 400 from the moment the listeners answer until the models the server
    starts with have loaded (not only while the repository is loading: the listeners come up
    first), and again as soon as shutdown begins."""
    from flowserve.server import Server

    repo = tmp_path / "repo"
    (repo / "gated" / "1").mkdir(parents=True)
    (repo / "gated" / "1" / "model.py").write_text(GATED_MODEL)
    (repo / "gated" / "config.pbtxt").write_text(
        'backend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    http = free_port()
    options = Settings(  # HTTP answers while gRPC and metrics still start, then while the model loads
        model_repositories=[repo], host="127.0.0.1", http_port=http, grpc_port=free_port(),
        metrics_port=free_port(),
    )  # fmt: skip
    server = Server(options)
    ready_url = f"http://127.0.0.1:{http}/v2/health/ready"
    starting = asyncio.ensure_future(server.start())
    try:
        # until the HTTP listener is up (the others start next, then the model loads)
        while not server.addresses:  # noqa: ASYNC110 - nothing to wait on but the list
            await asyncio.sleep(0.01)
        plane = server.plane
        assert plane is not None and plane.live() and not plane.ready()
        assert await asyncio.to_thread(_status, ready_url) == 400
        (repo / "go").write_text("")
        assert await asyncio.wait_for(starting, 60) is plane
        assert plane.ready() and await asyncio.to_thread(_status, ready_url) == 200
        stopping = asyncio.ensure_future(server.stop())
        await asyncio.sleep(0)  # shutdown began: the listeners still wind down
        assert not plane.ready()
        await stopping
    finally:
        (repo / "go").write_text("")
        if not starting.done():
            await starting
        await server.stop()
