"""Issue 6 over the wire with tritonclient: sequences, streaming (gRPC and SSE), response cache,
and a poll-mode version swap under load."""

from __future__ import annotations

import http.client
import json
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parents[2]
BUNDLED_REPOSITORY = ROOT / "model_repository"
TEST_MODELS = ROOT / "tests" / "models"
ServerProcess = Any  # tests/conftest.py's ServerProcess (conftest modules are not importable)


def accumulate(
    client: Any, module: Any, corr: int, value: int, start: bool = False, end: bool = False
) -> int:
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], np.int32))
    result = client.infer(
        "sequence_accumulate", [inp], sequence_id=corr, sequence_start=start, sequence_end=end
    )
    return int(result.as_numpy("OUTPUT")[0, 0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences(server: ServerProcess, protocol: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    with module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url) as client:
        base = 1000 if protocol == "http" else 2000
        a, b = base + 1, base + 2
        assert accumulate(client, module, a, 1, start=True) == 1
        assert accumulate(client, module, b, 10, start=True) == 10
        assert accumulate(client, module, a, 2) == 3
        assert accumulate(client, module, b, 20) == 30
        assert accumulate(client, module, a, 3, end=True) == 6
        assert accumulate(client, module, b, 30, end=True) == 60
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            accumulate(client, module, a, 1)  # ended: a new request needs START


def test_idle_sequence_times_out(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        assert accumulate(client, httpclient, 3001, 5, start=True) == 5
        # the model's idle limit is 200 ms; each check touches the sequence, so wait longer each time
        for wait in (0.6, 1.2, 2.4, 4.8):
            time.sleep(wait)
            try:
                accumulate(client, httpclient, 3001, 1)
            except InferenceServerException as exc:
                assert "released after being idle" in str(exc)
                return
        pytest.fail("sequence 3001 never timed out")


def test_decoupled_repeat_over_model_stream_infer(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for request_id, n in (("a", 3), ("b", 2)):
            x = grpcclient.InferInput("x", [2], "INT32")
            x.set_data_from_numpy(np.array([1, 2], np.int32))
            count = grpcclient.InferInput("n", [1], "INT32")
            count.set_data_from_numpy(np.array([n], np.int32))
            client.async_stream_infer("repeat", [x, count], request_id=request_id)
        got: list[tuple[str, int, list[int]]] = []
        deadline = time.monotonic() + 30
        while len(got) < 5 and time.monotonic() < deadline:
            result, error = results.get(timeout=30)
            assert error is None, error
            index = result.as_numpy("index")
            if index is None:  # an empty final response
                continue
            got.append((result.get_response().id, int(index[0]), result.as_numpy("y").tolist()))
    finally:
        client.stop_stream()
    assert [g for g in got if g[0] == "a"] == [("a", 0, [10, 20]), ("a", 1, [10, 20]), ("a", 2, [10, 20])]
    assert [g for g in got if g[0] == "b"] == [("b", 0, [10, 20]), ("b", 1, [10, 20])]


def test_decoupled_repeat_over_sse(server: ServerProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    body = json.dumps({"id": "s", "x": [3, 4], "n": 3})
    conn.request("POST", "/v2/models/repeat/generate_stream", body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream; charset=utf-8"
    text = response.read().decode()
    conn.close()
    events = [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.startswith("data: ")]
    assert [(e["index"], e["y"], e["id"]) for e in events] == [(i, [30, 40], "s") for i in range(3)]
    assert all(e["model_name"] == "repeat" for e in events)
    # plain infer on a decoupled graph is refused with Triton's UNSUPPORTED error
    with httpclient.InferenceServerClient(server.http_url) as client:
        x = httpclient.InferInput("x", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        n = httpclient.InferInput("n", [1], "INT32")
        n.set_data_from_numpy(np.array([1], np.int32))
        with pytest.raises(InferenceServerException, match="decoupled"):
            client.infer("repeat", [x, n])


def test_generate_single_response(server: ServerProcess) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    conn.request("POST", "/v2/models/route/generate", json.dumps({"x": [1.0, 500.0]}))
    response = conn.getresponse()
    doc = json.loads(response.read())
    conn.close()
    assert response.status == 200
    assert doc["model_name"] == "route" and doc["y"] == pytest.approx([0.01, 5.0])


def cached(client: httpclient.InferenceServerClient, values: list[float]) -> int:
    inp = httpclient.InferInput("INPUT0", [len(values)], "FP32")
    inp.set_data_from_numpy(np.array(values, np.float32))
    result = client.infer("cached_counter", [inp])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
    return int(result.as_numpy("COUNT")[0])


def test_cache_hits_skip_execution(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        first = cached(client, [1.0, 2.0])
        assert cached(client, [1.0, 2.0]) == first  # a hit: the model did not run
        assert cached(client, [1.0, 3.0]) == first + 1  # a miss runs it
        assert cached(client, [1.0, 2.0]) == first
        stats = client.get_inference_statistics("cached_counter")["model_stats"][0]
        assert stats["inference_stats"]["cache_hit"]["count"] >= 2
        assert stats["execution_count"] == first + 1


def test_cache_respects_its_size_bound(server_factory: Any) -> None:
    # each entry holds 256 floats + a count (~1 KB): a 2.5 KB cache keeps two of them
    proc = server_factory.start(
        "--cache-size=2600", repositories=(_only(TEST_MODELS, "cached_counter"),), graphs=(), listeners="http"
    )
    with httpclient.InferenceServerClient(proc.http_url) as client:
        a, b, c = ([float(k)] * 256 for k in (1, 2, 3))
        assert cached(client, a) == 1
        assert cached(client, b) == 2
        assert cached(client, a) == 1  # hit
        assert cached(client, c) == 3  # evicts b, the least recently used
        assert cached(client, a) == 1  # still cached
        assert cached(client, b) == 4  # was evicted: runs again


_repos: dict[str, Path] = {}


def _only(root: Path, name: str) -> Path:
    """A repository folder holding just ``root/name`` (made once per session)."""
    if name not in _repos:
        import tempfile

        repo = Path(tempfile.mkdtemp(prefix="flowserve-test-repo-"))
        shutil.copytree(root / name, repo / name)
        _repos[name] = repo
    return _repos[name]


def test_poll_mode_swaps_versions_under_load(server_factory: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(BUNDLED_REPOSITORY / "simple", repo / "simple")
    proc = server_factory.start(
        "--model-control-mode=poll",
        "--repository-poll-secs=0.3",
        repositories=(repo,),
        graphs=(),
        listeners="http",
    )
    failures: list[str] = []
    seen: set[int] = set()
    stop = threading.Event()

    def load() -> None:
        client = httpclient.InferenceServerClient(proc.http_url)
        a = np.ones((1, 16), np.int32)
        inputs = [
            httpclient.InferInput("INPUT0", [1, 16], "INT32"),
            httpclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        for inp in inputs:
            inp.set_data_from_numpy(a)
        deadline = time.monotonic() + 30
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    seen.add(int(client.infer("simple", inputs).as_numpy("OUTPUT0")[0, 0]))
                except Exception as exc:
                    failures.append(str(exc))
        finally:
            client.close()  # in this thread: collected in another, its gevent pool cannot close

    workers = [threading.Thread(target=load) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        time.sleep(0.5)
        new = repo / "simple" / "2"
        shutil.copytree(repo / "simple" / "1", tmp_path / "v2")
        model = tmp_path / "v2" / "model.py"
        model.write_text(model.read_text().replace("(in0 + in1)", "(in0 + in1 + 100)"))
        (tmp_path / "v2").rename(new)  # the version appears complete, in one step
        deadline = time.monotonic() + 20
        while 102 not in seen and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # keep the load going across and after the swap
    finally:
        stop.set()
        for w in workers:
            w.join(30)
    assert failures == []
    assert seen == {2, 102}


def test_decoupled_python_model_over_model_stream_infer(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        inp = grpcclient.InferInput("IN", [3], "INT32")
        inp.set_data_from_numpy(np.array([7, 8, 9], np.int32))
        client.async_stream_infer("decoupled_repeat", [inp], request_id="r")
        got: list[tuple[int, int]] = []
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            result, error = results.get(timeout=30)
            assert error is None, error
            if result.as_numpy("OUT") is None:
                continue
            got.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
    finally:
        client.stop_stream()
    assert got == [(7, 0), (8, 1), (9, 2)]


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_triton_grpc_error_header_ends_the_stream_with_the_status(
    server_factory: Any, transport: str
) -> None:
    """Triton's ``triton_grpc_error: true`` stream header: the first failing request closes the
    stream with its gRPC status (without it, the error is that request's error_message and the
    stream goes on)."""
    proc = server_factory.start(
        f"--grpc-server={transport}", "--model-control-mode=explicit", "--load-model=simple"
    )
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(proc.grpc_url)
    client.start_stream(
        callback=lambda result, error: results.put((result, error)), headers={"triton_grpc_error": "true"}
    )
    try:
        client.async_stream_infer("no_such_model", [])
        _, error = results.get(timeout=30)
        assert error is not None and error.status() == "StatusCode.NOT_FOUND", error
        assert "Request for unknown model: 'no_such_model'" in error.message()
    finally:
        client.stop_stream()
    plain: queue.Queue[tuple[Any, Any]] = queue.Queue()  # without the header: the stream goes on
    client.start_stream(callback=lambda result, error: plain.put((result, error)))
    try:
        client.async_stream_infer("no_such_model", [])
        _, error = plain.get(timeout=30)
        assert error is not None and "no_such_model" in error.message()
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for inp in inputs:
            inp.set_data_from_numpy(np.ones((1, 16), np.int32))
        client.async_stream_infer("simple", inputs)
        result, error = plain.get(timeout=30)
        assert error is None and (result.as_numpy("OUTPUT0") == 2).all()
    finally:
        client.stop_stream()
