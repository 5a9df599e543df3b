"""Remote nodes against real Triton 2.51 (issue 21 part 1): a flowserve graph whose node calls a
model served by the ``tritonserver`` of the ``nvidia-pytriton`` wheel.

Triton is what ``benchmarks/triton_setup.py`` installs into ``benchmarks/.work/triton-venv``
(``make test`` runs it, best effort); without that install every test here skips and says so.
Triton serves Python-backend models written into a temporary repository; the flowserve *front*
serves graphs written into tmp_path. Every server listens on 127.0.0.1 on free ports and is
stopped (its whole process group, Triton's Python stubs included) when its fixture ends. Every
request a test sends carries a client timeout, so a hang fails instead of blocking the suite.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import ROOT, ServerProcess, _Factory, free_port


def _triton_setup() -> ModuleType:
    spec = importlib.util.spec_from_file_location("triton_setup", ROOT / "benchmarks" / "triton_setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("triton_setup", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return sys.modules["triton_setup"]


_SETUP = _triton_setup()
_INSTALL = _SETUP.find_triton()
pytestmark = pytest.mark.skipif(
    _INSTALL is None,
    reason=f"Triton 2.51 is not set up in {_SETUP.VENV} (run `python benchmarks/triton_setup.py`; "
    "`make test` does it, best effort)",
)

# ----------------------------------------------------------------------------- Triton's models

_ADD_SUB_CONFIG = """
name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

_ADD_SUB = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
"""

# echoes its input and answers the request's parameters as JSON (a BYTES tensor)
_PARAMS_CONFIG = """
name: "params"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

_PARAMS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            params = np.array([request.parameters().encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("PARAMS", params)]))
        return responses
"""

# waits INPUT0[0] seconds in 20 ms steps, answering early when Triton cancels the request; a
# cancelled request appends its "marker" parameter to the file the model's parameter names
_WAIT_CONFIG = """
name: "wait"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
parameters { key: "cancel_log" value: { string_value: "%s" } }
"""

_WAIT = """
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.log = config["parameters"]["cancel_log"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            end = time.monotonic() + float(x[0])
            while time.monotonic() < end:
                if request.is_cancelled():
                    marker = json.loads(request.parameters() or "{}").get("marker", "?")
                    with open(self.log, "a") as out:
                        out.write(f"{marker}\\n")
                    break
                time.sleep(0.02)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""


def _write_model(repo: Path, name: str, config: str, model: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(model)


def _repository(root: Path) -> tuple[Path, Path]:
    """Triton's model repository and the file the ``wait`` model logs cancellations to."""
    repo = root / "triton_models"
    log = root / "cancelled.log"
    log.write_text("")
    _write_model(repo, "add_sub", _ADD_SUB_CONFIG, _ADD_SUB)
    _write_model(repo, "params", _PARAMS_CONFIG, _PARAMS)
    _write_model(repo, "wait", _WAIT_CONFIG % log, _WAIT)
    return repo, log


# ----------------------------------------------------------------------------- Triton's process


@dataclass
class Triton:
    process: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log: Path
    cancel_log: Path

    def url(self, scheme: str) -> str:
        return f"{scheme}://127.0.0.1:{self.grpc_port if scheme == 'grpc' else self.http_port}"

    def kill(self) -> None:
        """SIGKILL to the whole process group (the server and its Python stubs)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(20)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.kill()


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# Triton 2.51 aborts now and then while its Python backend starts a model's stub on a busy
# machine (seen once in a CI run of this suite): the stub's shared-memory lock throws
STUB_LOCK_CRASH = "boost::interprocess::lock_exception"


@pytest.fixture
def triton_factory(tmp_path: Path) -> Iterator[Any]:
    """Starts Tritons (each with the models above) and stops every one it started."""
    started: list[Triton] = []

    def launch(
        command: list[str], http_port: int, grpc_port: int, log: Path, cancel_log: Path, retry: bool
    ) -> Triton | None:
        """One Triton, waited for until ready; None when it died of ``STUB_LOCK_CRASH`` and
        ``retry`` (Triton's own start-up crash, not the test's subject: start it once more)."""
        assert _INSTALL is not None
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                env=_INSTALL.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        triton = Triton(process, http_port, grpc_port, log, cancel_log)
        started.append(triton)
        deadline = time.monotonic() + 120
        while not _ready(http_port):
            if process.poll() is not None:
                text = log.read_text()
                if retry and STUB_LOCK_CRASH in text:
                    with contextlib.suppress(ProcessLookupError):  # its stubs, if any are left
                        os.killpg(process.pid, signal.SIGKILL)
                    return None
                raise RuntimeError(f"Triton exited with {process.returncode}: {text[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Triton was not ready after 120 s: {log.read_text()[-3000:]}")
            time.sleep(0.25)
        return triton

    def start(http_port: int = 0, grpc_port: int = 0) -> Triton:
        assert _INSTALL is not None
        root = tmp_path / f"triton{len(started)}"
        root.mkdir()
        repo, cancel_log = _repository(root)
        http_port, grpc_port = http_port or free_port(), grpc_port or free_port()
        log = root / "triton.log"
        # a short exit timeout: Triton waits that long for open client connections at SIGTERM
        command = [*_INSTALL.command(repo, http_port, grpc_port), "--exit-timeout-secs=5"]
        given = (command, http_port, grpc_port, log, cancel_log)
        triton = launch(*given, retry=True) or launch(*given, retry=False)
        assert triton is not None  # without retry it is ready or has raised
        return triton

    try:
        yield start
    finally:
        for triton in started:
            triton.stop()


@pytest.fixture
def triton(triton_factory: Any) -> Triton:
    started: Triton = triton_factory()
    return started


# ----------------------------------------------------------------------------- the front


def _front(server_factory: type[_Factory], graphs: Path, *extra: str) -> ServerProcess:
    """A flowserve serving only the graphs of ``graphs`` (an empty model repository)."""
    empty = graphs / "empty_repository"
    empty.mkdir(exist_ok=True)
    if not extra:
        extra = ("--model-control-mode=explicit", "--load-model=*")
    return server_factory.start(*extra, repositories=(empty,), graphs=(graphs,))


def _graph(folder: Path, name: str, text: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(text)


def _add_sub_graph(url: str, dims: int = 16, dtype: str = "FP32", extra: str = "") -> str:
    return f"""
max_batch_size: 8
inputs:
  a: {{datatype: {dtype}, dims: [{dims}]}}
  b: {{datatype: {dtype}, dims: [{dims}]}}
outputs: {{sum: net.OUTPUT0, diff: net.OUTPUT1}}
nodes:
  net:
    remote: {{url: "{url}", model: add_sub}}
    inputs: {{INPUT0: $a, INPUT1: $b}}
{extra}"""


def _wait_graph(urls: list[str]) -> str:
    listed = ", ".join(f'"{u}"' for u in urls)
    return f"""
inputs: {{x: {{datatype: FP32, dims: [1]}}}}
outputs: {{y: net.OUTPUT0}}
nodes:
  net:
    remote: {{urls: [{listed}], model: wait, timeout_s: 10}}
    inputs: {{INPUT0: $x}}
"""


def _index(front: ServerProcess) -> dict[str, dict[str, Any]]:
    client = httpclient.InferenceServerClient(front.http_url)
    try:
        return {m["name"]: m for m in client.get_model_repository_index()}
    finally:
        client.close()


def _wait(
    front: ServerProcess,
    graph: str,
    seconds: float,
    marker: str = "",
    client_timeout: float = 60.0,
    timeout_us: int | None = None,
) -> float:
    tensor = grpcclient.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    client = grpcclient.InferenceServerClient(front.grpc_url)
    try:
        result = client.infer(
            graph,
            [tensor],
            client_timeout=client_timeout,
            timeout=timeout_us,
            parameters={"marker": marker} if marker else None,
        )
    finally:
        client.close()
    return float(result.as_numpy("y")[0])


def _until(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.1)


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_a_graph_calls_a_model_on_triton(
    triton: Triton, server_factory: type[_Factory], tmp_path: Path, scheme: str
) -> None:
    """Tensors go to Triton and back binary (FP32 rows; BYTES that are not UTF-8, which JSON
    could not carry), and the request's own parameters reach Triton's model while those the
    front consumes (priority, timeout, binary_data_output) do not appear among them."""
    graphs = tmp_path / "graphs"
    _graph(graphs, "sums", _add_sub_graph(triton.url(scheme)))
    _graph(
        graphs,
        "echo",
        f"""
inputs: {{text: {{datatype: BYTES, dims: [-1]}}}}
outputs: {{text: net.OUTPUT0, params: net.PARAMS}}
nodes:
  net:
    remote: {{url: "{triton.url(scheme)}", model: params}}
    inputs: {{INPUT0: $text}}
""",
    )
    front = _front(server_factory, graphs)
    a = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    client = httpclient.InferenceServerClient(front.http_url)
    try:
        inputs = []
        for name, array in (("a", a), ("b", b)):
            tensor = httpclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        result = client.infer("sums", inputs, timeout=20_000_000)
        np.testing.assert_array_equal(result.as_numpy("sum"), a + b)
        np.testing.assert_array_equal(result.as_numpy("diff"), a - b)

        raw = np.array([b"\x00\xff\xfe raw", "\u00e9t\u00e9".encode(), b""], dtype=np.object_)
        text = httpclient.InferInput("text", [3], "BYTES")
        text.set_data_from_numpy(raw, binary_data=True)
        result = client.infer(
            "echo",
            [text],
            priority=1,
            timeout=20_000_000,
            parameters={"colour": "red", "n": 3, "ratio": 0.5, "flag": True},
        )
    finally:
        client.close()
    assert list(result.as_numpy("text")) == list(raw)
    seen = json.loads(result.as_numpy("params")[0])
    assert seen == {"colour": "red", "n": 3, "ratio": 0.5, "flag": True}


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_types_are_checked_against_triton_at_load(
    triton: Triton, server_factory: type[_Factory], tmp_path: Path, scheme: str
) -> None:
    url = triton.url(scheme)
    graphs = tmp_path / "graphs"
    _graph(graphs, "good", _add_sub_graph(url))
    _graph(graphs, "mistyped", _add_sub_graph(url, dtype="INT32"))
    _graph(graphs, "misshapen", _add_sub_graph(url, dims=8))
    _graph(
        graphs,
        "misdeclared",
        _add_sub_graph(
            url, extra="    outputs: {OUTPUT0: {datatype: FP16, dims: [-1, 16]}, OUTPUT1: null}\n"
        ),
    )
    _graph(graphs, "missing", _add_sub_graph(url).replace("model: add_sub", "model: no_such_model"))
    front = _front(server_factory, graphs)
    index = _index(front)
    assert index["good"]["state"] == "READY"
    for name in ("mistyped", "misshapen", "misdeclared", "missing"):
        assert index[name]["state"] == "UNAVAILABLE", index[name]
        assert "node 'net'" in index[name]["reason"], index[name]
    assert "'$a' is INT32 but the input expects FP32" in index["mistyped"]["reason"]
    assert "shape mismatch" in index["misshapen"]["reason"] and "[-1, 16]" in index["misshapen"]["reason"]
    assert "declared FP16, but remote model 'add_sub'" in index["misdeclared"]["reason"]
    assert "no_such_model" in index["missing"]["reason"] and url in index["missing"]["reason"]


def test_deadline_and_cancellation_reach_triton(
    triton: Triton, server_factory: type[_Factory], tmp_path: Path
) -> None:
    """A request cancelled at the front (its gRPC deadline passed), and one whose own timeout
    runs out, cancel their call on Triton: Triton's model sees ``is_cancelled()``."""
    graphs = tmp_path / "graphs"
    _graph(graphs, "wait", _wait_graph([triton.url("grpc")]))
    front = _front(server_factory, graphs)
    assert _wait(front, "wait", 0.0) == 0.0

    with pytest.raises(InferenceServerException) as info:
        _wait(front, "wait", 30.0, marker="cancelled", client_timeout=1.0)
    assert info.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    _until(lambda: "cancelled" in triton.cancel_log.read_text(), "Triton's model sees the cancellation")

    with pytest.raises(InferenceServerException) as info:
        _wait(front, "wait", 30.0, marker="deadline", timeout_us=500_000)
    assert info.value.status() == "StatusCode.UNAVAILABLE" and "node 'net'" in str(info.value)
    _until(lambda: "deadline" in triton.cancel_log.read_text(), "the deadline cancels Triton's request")
    assert _wait(front, "wait", 0.0) == 0.0  # the endpoint is still up


def test_killed_triton_fails_fast_or_fails_over(
    triton_factory: Any, server_factory: type[_Factory], tmp_path: Path
) -> None:
    """Triton killed with calls in flight: a node whose only endpoint it was fails them at once
    with an error naming the node and Triton's address (gRPC and HTTP); a node with a second
    endpoint (a flowserve serving the same models) sends them there and they succeed."""
    triton = triton_factory()
    backup = server_factory.start(
        "--model-control-mode=explicit",
        "--load-model=wait",
        repositories=(triton.cancel_log.parent / "triton_models",),
        graphs=(),
    )
    graphs = tmp_path / "graphs"
    _graph(graphs, "solo", _wait_graph([triton.url("grpc")]))
    _graph(graphs, "solo_http", _wait_graph([triton.url("http")]))
    _graph(graphs, "pair", _wait_graph([triton.url("grpc"), f"grpc://{backup.grpc_url}"]))
    front = _front(server_factory, graphs)
    assert _wait(front, "solo", 0.0) == 0.0 and _wait(front, "solo_http", 0.0) == 0.0

    results: dict[str, list[object]] = {"solo": [], "solo_http": [], "pair": []}

    def call(graph: str, seconds: float) -> None:
        try:
            results[graph].append(_wait(front, graph, seconds))
        except BaseException as exc:
            results[graph].append(exc)

    threads = [
        threading.Thread(target=call, args=("solo", 20.0)),
        threading.Thread(target=call, args=("solo_http", 20.0)),
        *(threading.Thread(target=call, args=("pair", 1.0)) for _ in range(4)),
    ]
    for t in threads:
        t.start()
    time.sleep(0.5)
    triton.kill()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a call hangs after its remote died"
    for graph, scheme in (("solo", "grpc"), ("solo_http", "http")):
        (failure,) = results[graph]
        assert isinstance(failure, InferenceServerException), failure
        assert "node 'net'" in str(failure) and triton.url(scheme).split("://")[1] in str(failure)
    assert results["pair"] == [1.0] * 4, results["pair"]

    # later calls: the only endpoint is down (UNAVAILABLE at once), or the other one serves
    with pytest.raises(InferenceServerException) as info:
        _wait(front, "solo", 0.0, client_timeout=10)
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert "no endpoint is ready" in str(info.value) and "node 'net'" in str(info.value)
    assert _wait(front, "pair", 0.0, client_timeout=10) == 0.0


def test_graph_becomes_ready_when_triton_does(
    triton_factory: Any, server_factory: type[_Factory], tmp_path: Path
) -> None:
    """Poll mode: a graph whose Triton is down at load fails to load naming the node and the
    endpoint, and loads by itself once Triton answers."""
    http_port, grpc_port = free_port(), free_port()
    graphs = tmp_path / "graphs"
    _graph(graphs, "later", _add_sub_graph(f"grpc://127.0.0.1:{grpc_port}"))
    front = _front(server_factory, graphs, "--model-control-mode=poll", "--repository-poll-secs=1")
    entry = _index(front)["later"]
    assert entry["state"] == "UNAVAILABLE" and "node 'net'" in entry["reason"]
    assert f"127.0.0.1:{grpc_port}" in entry["reason"]
    triton_factory(http_port, grpc_port)
    _until(lambda: _index(front)["later"]["state"] == "READY", "the graph loads once Triton is up", 60)
    client = grpcclient.InferenceServerClient(front.grpc_url)
    try:
        a = np.ones((1, 16), dtype=np.float32)
        inputs = []
        for name in ("a", "b"):
            tensor = grpcclient.InferInput(name, [1, 16], "FP32")
            tensor.set_data_from_numpy(a)
            inputs.append(tensor)
        result = client.infer("later", inputs, client_timeout=20)
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("sum"), a + a)
