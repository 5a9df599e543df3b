"""Remote nodes (issue 21 part 1): a graph step served by a model on another V2 server.

The YAML side is checked in-process; the rest runs two (or three) real ``flowserve serve``
processes on loopback: the *remote* serves the bundled ``simple`` model and a few test models,
the *front* serves a graph (written into tmp_path) whose node calls the remote over gRPC or
HTTP. Every request a test sends carries a client timeout, so a hang fails instead of
blocking the suite.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from flowserve.core.errors import InternalError, InvalidArgument, NotFound, SpecError, Unavailable
from flowserve.core.node import Context
from flowserve.nodes.remote import error_class, forwarded
from flowserve.spec.graph_yaml import load_graph_file
from flowserve.spec.kinds import KINDS, remote_spec
from tests.conftest import BUNDLED_REPOSITORY, TEST_MODELS, ServerProcess, _Factory, free_port

# ----------------------------------------------------------------------------- YAML


def _graph(tmp_path: Path, remote: str, name: str = "remote_graph", extra: str = "") -> Path:
    """A graph ``a, b -> sum, diff`` whose one node is the ``remote`` value (YAML flow text)."""
    text = f"""
name: {name}
max_batch_size: 8
inputs:
  a: {{datatype: INT32, dims: [16]}}
  b: {{datatype: INT32, dims: [16]}}
outputs:
  sum: net.OUTPUT0
  diff: net.OUTPUT1
nodes:
  net:
    remote: {remote}
    inputs: {{INPUT0: $a, INPUT1: $b}}
{extra}"""
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_yaml_remote_node_parses(tmp_path: Path) -> None:
    spec = load_graph_file(
        _graph(
            tmp_path,
            '{urls: ["grpc://10.0.0.1:8001", "http://gpu-b:8000/"], model: simple, version: "1", '
            "max_in_flight: 4, timeout_s: 2.5}",
        )
    )
    node = spec.nodes["net"]
    assert node.kind == "remote" and node.version == "1"
    remote = remote_spec(node)
    assert remote.urls == ("grpc://10.0.0.1:8001", "http://gpu-b:8000")
    assert (remote.model, remote.version, remote.max_in_flight, remote.timeout_s) == ("simple", "1", 4, 2.5)
    assert KINDS["remote"].label(node, None) == [
        "remote: simple v1",
        "@ grpc://10.0.0.1:8001",
        "@ http://gpu-b:8000",
    ]
    single = load_graph_file(_graph(tmp_path, "{url: grpc://h:1, model: m}", name="one")).nodes["net"]
    assert remote_spec(single).urls == ("grpc://h:1",) and remote_spec(single).version == ""


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{model: simple}", "exactly one of 'url"),
        ("{url: grpc://h:1, urls: [grpc://h:2], model: m}", "exactly one of 'url"),
        ("{url: ftp://h:1, model: m}", "grpc://host:port"),
        ("{url: grpc://h, model: m}", "grpc://host:port"),
        ("{url: grpc://h:1}", "must name the remote model"),
        ("{url: grpc://h:1, model: m, max_in_flight: 0}", "integer between 1 and 65536"),
        ("{url: grpc://h:1, model: m, colour: red}", "unknown keys"),
        ("grpc://h:1", "must be a mapping"),
    ],
)
def test_yaml_remote_node_errors_name_the_node(tmp_path: Path, value: str, says: str) -> None:
    with pytest.raises(SpecError) as info:
        load_graph_file(_graph(tmp_path, value))
    assert says in str(info.value) and "node 'net'" in str(info.value)


def test_remote_status_maps_to_the_engine_errors() -> None:
    assert error_class("StatusCode.INVALID_ARGUMENT") is InvalidArgument
    assert error_class("StatusCode.NOT_FOUND") is NotFound
    assert error_class("StatusCode.UNAVAILABLE") is Unavailable
    assert error_class("400") is InvalidArgument
    assert error_class("503") is Unavailable
    assert error_class("500") is InternalError
    assert error_class("StatusCode.INTERNAL") is InternalError
    assert error_class(None) is InternalError


def test_request_parameters_are_forwarded_except_those_the_call_sets() -> None:
    ctx = Context(
        request_id="r",
        parameters={
            "colour": "red",
            "n": 3,
            "ratio": 0.5,
            "flag": True,
            "binary_data_output": True,
            "priority": 9,
            "timeout": 1000,
            "sequence_id": "s1",
            "sequence_start": True,
            "triton_x": "reserved",
            "headers": "no",
        },
        priority=2,
    )
    assert forwarded(ctx, 0.25) == {
        "parameters": {"colour": "red", "n": 3, "ratio": 0.5, "flag": True},
        "sequence_id": "s1",
        "sequence_start": True,
        "sequence_end": False,
        "priority": 2,
        "timeout": 250_000,
    }
    assert forwarded(Context(), None) == {}
    assert forwarded(Context(parameters={"sequence_id": 0}), 1e-9) == {"timeout": 1}


# ----------------------------------------------------------------------------- two servers


def _start_remote(server_factory: type[_Factory]) -> ServerProcess:
    return server_factory.start(
        "--model-control-mode=explicit",
        "--load-model=simple",
        "--load-model=grpc_slow",
        "--load-model=failing",
        repositories=(BUNDLED_REPOSITORY, TEST_MODELS),
        graphs=(),
    )


def _start_front(server_factory: type[_Factory], graphs: Path) -> ServerProcess:
    empty = graphs / "empty_repository"
    empty.mkdir(exist_ok=True)
    return server_factory.start(
        "--model-control-mode=explicit", "--load-model=*", repositories=(empty,), graphs=(graphs,)
    )


def _inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    out = []
    for name, array in (("a", a), ("b", b)):
        tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def _add_sub(front: ServerProcess, graph: str = "remote_graph", rows: int = 2) -> None:
    a = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16)
    b = np.full((rows, 16), 3, dtype=np.int32)
    client = grpcclient.InferenceServerClient(front.grpc_url)
    try:
        result = client.infer(graph, _inputs(a, b), client_timeout=20)
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("sum"), a + b)
    np.testing.assert_array_equal(result.as_numpy("diff"), a - b)


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_a_graph_calls_a_model_on_another_server(
    server_factory: type[_Factory], tmp_path: Path, scheme: str
) -> None:
    remote = _start_remote(server_factory)
    port = remote.grpc_port if scheme == "grpc" else remote.http_port
    _graph(tmp_path, f'{{url: "{scheme}://127.0.0.1:{port}", model: simple, version: "1"}}')
    front = _start_front(server_factory, tmp_path)
    _add_sub(front)
    # node-level batching in front of the remote: concurrent requests merge into one call
    _graph(
        tmp_path,
        f'{{url: "{scheme}://127.0.0.1:{port}", model: simple}}',
        name="batched",
        extra="    batching: {max_batch_size: 8, max_queue_delay_us: 20000}\n",
    )
    client = httpclient.InferenceServerClient(front.http_url)
    try:
        client.load_model("batched")
        threads = [threading.Thread(target=_add_sub, args=(front, "batched", 1)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        stats = client.get_inference_statistics("batched")["model_stats"][0]
        assert stats["inference_count"] == 6
        # the remote saw fewer executions than requests: the front merged them
        remote_client = httpclient.InferenceServerClient(remote.http_url)
        remote_stats = remote_client.get_inference_statistics("simple")["model_stats"][0]
        remote_client.close()
        assert remote_stats["inference_count"] == 2 + 6
        assert remote_stats["execution_count"] < 1 + 6
    finally:
        client.close()


def test_types_are_checked_against_the_remote_at_load(server_factory: type[_Factory], tmp_path: Path) -> None:
    remote = _start_remote(server_factory)
    url = f"grpc://127.0.0.1:{remote.grpc_port}"
    # the graph feeds FP32 where the remote model takes INT32
    (tmp_path / "mistyped.yaml").write_text(
        f"""
inputs: {{x: {{datatype: FP32, dims: [16]}}}}
max_batch_size: 8
outputs: {{y: net.OUTPUT0}}
nodes:
  net:
    remote: {{url: "{url}", model: simple}}
    inputs: {{INPUT0: $x, INPUT1: $x}}
"""
    )
    _graph(tmp_path, f'{{url: "{url}", model: no_such_model}}', name="missing")
    dead = free_port()
    _graph(tmp_path, f'{{url: "grpc://127.0.0.1:{dead}", model: simple}}', name="down")
    front = _start_front(server_factory, tmp_path)
    client = httpclient.InferenceServerClient(front.http_url)
    try:
        index = {m["name"]: m for m in client.get_model_repository_index()}
    finally:
        client.close()
    assert all(index[n]["state"] == "UNAVAILABLE" for n in ("mistyped", "missing", "down"))
    assert "node 'net'" in index["mistyped"]["reason"] and "FP32" in index["mistyped"]["reason"]
    assert "node 'net'" in index["missing"]["reason"] and "no_such_model" in index["missing"]["reason"]
    assert "node 'net'" in index["down"]["reason"] and f"127.0.0.1:{dead}" in index["down"]["reason"]


def test_down_remote_then_explicit_load_picks_it_up(server_factory: type[_Factory], tmp_path: Path) -> None:
    """A remote down at load fails the graph's load; loading it again once the remote is up works.
    A node that declares its outputs' types loads while the remote is down and fails fast."""
    port = free_port()
    _graph(tmp_path, f'{{url: "grpc://127.0.0.1:{port}", model: simple}}', name="strict")
    _graph(
        tmp_path,
        f'{{url: "grpc://127.0.0.1:{port}", model: simple}}',
        name="declared",
        extra="    outputs: {OUTPUT0: {datatype: INT32, dims: [-1, 16]}, "
        "OUTPUT1: {datatype: INT32, dims: [-1, 16]}}\n",
    )
    front = _start_front(server_factory, tmp_path)
    client = httpclient.InferenceServerClient(front.http_url)
    try:
        assert not client.is_model_ready("strict") and client.is_model_ready("declared")
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as info:
            _add_sub(front, "declared")
        assert time.monotonic() - started < 5
        assert "node 'net'" in str(info.value) and f"127.0.0.1:{port}" in str(info.value)
        assert info.value.status() == "StatusCode.UNAVAILABLE"
        # the remote comes up on that port (a later --grpc-port overrides the one conftest picks)
        server_factory.start(
            "--model-control-mode=explicit",
            "--load-model=simple",
            f"--grpc-port={port}",
            repositories=(BUNDLED_REPOSITORY,),
            graphs=(),
        )
        client.load_model("strict")
        assert client.is_model_ready("strict")
        _add_sub(front, "strict")
        deadline = time.monotonic() + 10  # the declared node's probe finds the endpoint ready
        while True:
            try:
                _add_sub(front, "declared")
                break
            except InferenceServerException:
                assert time.monotonic() < deadline
                time.sleep(0.2)
    finally:
        client.close()


def _slow_graph(tmp_path: Path, urls: list[str]) -> None:
    listed = ", ".join(f'"{u}"' for u in urls)
    (tmp_path / "slow.yaml").write_text(
        f"""
inputs: {{x: {{datatype: FP32, dims: [1]}}}}
outputs: {{y: net.OUTPUT0}}
nodes:
  net:
    remote: {{urls: [{listed}], model: grpc_slow}}
    inputs: {{INPUT0: $x}}
"""
    )


def _slow(front: ServerProcess, seconds: float, timeout_us: int = 0) -> np.ndarray:
    tensor = grpcclient.InferInput("x", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    client = grpcclient.InferenceServerClient(front.grpc_url)
    try:
        result = client.infer("slow", [tensor], client_timeout=30, timeout=timeout_us or None)
    finally:
        client.close()
    return np.asarray(result.as_numpy("y"))


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_deadline_becomes_the_remote_call_timeout(
    server_factory: type[_Factory], tmp_path: Path, scheme: str
) -> None:
    remote = _start_remote(server_factory)
    port = remote.grpc_port if scheme == "grpc" else remote.http_port
    _slow_graph(tmp_path, [f"{scheme}://127.0.0.1:{port}"])
    front = _start_front(server_factory, tmp_path)
    assert _slow(front, 0.0)[0] == 0.0
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        _slow(front, 3.0, timeout_us=300_000)
    assert time.monotonic() - started < 2.5
    assert "node 'net'" in str(info.value)


def test_remote_errors_keep_their_code(server_factory: type[_Factory], tmp_path: Path) -> None:
    remote = _start_remote(server_factory)
    (tmp_path / "fails.yaml").write_text(
        f"""
inputs: {{x: {{datatype: INT32, dims: [-1]}}}}
outputs: {{y: net.OUTPUT0}}
nodes:
  net:
    remote: {{url: "grpc://127.0.0.1:{remote.grpc_port}", model: failing}}
    inputs: {{INPUT0: $x}}
"""
    )
    front = _start_front(server_factory, tmp_path)
    bad = np.array([-1, 2], dtype=np.int32)
    errors = []
    for server, model, name in ((remote, "failing", "INPUT0"), (front, "fails", "x")):
        tensor = grpcclient.InferInput(name, [2], "INT32")
        tensor.set_data_from_numpy(bad)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as info:
            client.infer(model, [tensor], client_timeout=20)
        client.close()
        errors.append(info.value)
    direct, through = errors
    assert through.status() == direct.status()
    assert "node 'net'" in str(through) and f"127.0.0.1:{remote.grpc_port}" in str(through)
    assert "remote model 'failing'" in str(through)


def test_killed_remote_fails_fast_and_names_node_and_remote(
    server_factory: type[_Factory], tmp_path: Path
) -> None:
    remote = _start_remote(server_factory)
    _slow_graph(tmp_path, [f"grpc://127.0.0.1:{remote.grpc_port}"])
    front = _start_front(server_factory, tmp_path)
    failures: list[BaseException] = []

    def in_flight() -> None:
        try:
            _slow(front, 10.0)
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=in_flight)
    thread.start()
    time.sleep(1.0)
    started = time.monotonic()
    remote.process.kill()
    thread.join(10)
    assert not thread.is_alive(), "the in-flight call hangs after its remote died"
    assert time.monotonic() - started < 5
    assert len(failures) == 1 and isinstance(failures[0], InferenceServerException)
    message = str(failures[0])
    assert "node 'net'" in message and f"127.0.0.1:{remote.grpc_port}" in message
    # later calls fail at once: the endpoint is down
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as info:
        _slow(front, 0.0)
    assert time.monotonic() - started < 2
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    assert "no endpoint is ready" in str(info.value) and "node 'net'" in str(info.value)


def test_failover_to_the_other_endpoint(server_factory: type[_Factory], tmp_path: Path) -> None:
    first, second = _start_remote(server_factory), _start_remote(server_factory)
    urls = [f"grpc://127.0.0.1:{first.grpc_port}", f"grpc://127.0.0.1:{second.grpc_port}"]
    _slow_graph(tmp_path, urls)
    front = _start_front(server_factory, tmp_path)
    for _ in range(4):
        assert _slow(front, 0.0)[0] == 0.0
    counts = []
    for server in (first, second):
        client = httpclient.InferenceServerClient(server.http_url)
        counts.append(client.get_inference_statistics("grpc_slow")["model_stats"][0]["inference_count"])
        client.close()
    assert counts == [2, 2]  # balanced
    results: list[object] = []

    def in_flight() -> None:
        try:
            results.append(_slow(front, 2.0)[0])
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=in_flight) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    first.process.kill()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads)
    # the calls in flight on the dead endpoint were sent again to the live one
    assert results == [2.0] * 4, results
    for _ in range(4):
        started = time.monotonic()
        assert _slow(front, 0.0)[0] == 0.0
        assert time.monotonic() - started < 2


def test_poll_mode_loads_the_graph_when_its_remote_answers(
    server_factory: type[_Factory], tmp_path: Path
) -> None:
    """A graph whose remote is down at load fails to load, and the next repository poll after
    the remote comes up loads it (the graph's file never changed)."""
    port = free_port()
    _graph(tmp_path, f'{{url: "grpc://127.0.0.1:{port}", model: simple}}', name="later")
    empty = tmp_path / "empty_repository"
    empty.mkdir()
    front = server_factory.start(
        "--model-control-mode=poll", "--repository-poll-secs=1", repositories=(empty,), graphs=(tmp_path,)
    )
    client = httpclient.InferenceServerClient(front.http_url)
    try:
        assert not client.is_model_ready("later")
        server_factory.start(
            "--model-control-mode=explicit",
            "--load-model=simple",
            f"--grpc-port={port}",
            repositories=(BUNDLED_REPOSITORY,),
            graphs=(),
        )
        deadline = time.monotonic() + 60
        while not client.is_model_ready("later"):
            assert time.monotonic() < deadline, "the graph never loaded after its remote came up"
            time.sleep(0.2)
        _add_sub(front, "later")
    finally:
        client.close()


def test_loading_a_graph_whose_remote_never_answers_does_not_stall_the_server(
    server_factory: type[_Factory], tmp_path: Path
) -> None:
    """The remote's address accepts connections and never answers: the load waits out the node's
    ``timeout_s`` (off the event loop) while the server goes on answering requests."""
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # never accepted: the kernel completes connections, nobody answers
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        _graph(tmp_path, f'{{url: "grpc://{address}", model: simple, timeout_s: 10}}', name="stuck")
        front = server_factory.start(
            "--model-control-mode=explicit",
            "--load-model=simple",
            repositories=(BUNDLED_REPOSITORY,),
            graphs=(tmp_path,),
        )
        failures: list[BaseException] = []

        def load() -> None:
            client = httpclient.InferenceServerClient(front.http_url, network_timeout=120)
            try:
                client.load_model("stuck")
            except BaseException as exc:
                failures.append(exc)
            finally:
                client.close()

        loading = threading.Thread(target=load)
        loading.start()
        try:
            time.sleep(1.0)  # the load is under way, waiting on the silent remote
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = []
            for name in ("INPUT0", "INPUT1"):
                tensor = grpcclient.InferInput(name, [1, 16], "INT32")
                tensor.set_data_from_numpy(a)
                inputs.append(tensor)
            client = grpcclient.InferenceServerClient(front.grpc_url)
            try:
                result = client.infer("simple", inputs, client_timeout=5)
                assert client.is_server_live(client_timeout=5)
            finally:
                client.close()
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
            assert loading.is_alive(), "the load ended before the request: nothing was shown"
        finally:
            loading.join(60)
        assert not loading.is_alive()
        (failure,) = failures
        assert "node 'net'" in str(failure) and address in str(failure)
    finally:
        silent.close()
