"""``flowserve serve --workers 2``: two worker processes that clients see as one server.

Every test talks to a real server through tritonclient over many connections; with
SO_REUSEPORT the kernel spreads connections over the workers by their addresses, so 16
connections reach both workers but for a chance of 2 in 65536 (``_spread`` checks it where a
test depends on it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException

from flowserve.spec.triton import parse_config_text
from tests.conftest import ROOT, ServerProcess, start_server

CONNECTIONS = 16


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces") / "trace.json"


@pytest.fixture(scope="module")
def cluster(trace_file: Path) -> Iterator[ServerProcess]:
    server = start_server(
        "--workers", "2", "--allow-shm", "--trace-config", f"triton,file={trace_file}", "--model-control-mode=explicit", "--load-model=simple",
        "--load-model=sequence_accumulate", "--load-model=grpc_slow", "--load-model=cpu_burn", timeout=180.0,
    )  # fmt: skip
    try:
        yield server
    finally:
        assert server.stop(60.0) == 0, server.log()[-4000:]


def _workers(server: ServerProcess) -> list[int]:
    """The worker processes' pids (the supervisor's children)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == server.process.pid:
                found.append(int(entry.name))
    return sorted(found)


def _spread(server: ServerProcess, port: int) -> list[int]:
    """Established connections to ``port`` held by each worker (from /proc: the workers'
    socket inodes matched against the kernel's TCP table)."""
    established: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                established[fields[9]] = 1
    counts = []
    for pid in _workers(server):
        inodes = set()
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = str(fd.readlink())
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        counts.append(sum(1 for inode in inodes if inode in established))
    return counts


def _simple_inputs(client_module: Any, value: int) -> list[Any]:
    a = np.full((1, 16), value, np.int32)
    b = np.ones((1, 16), np.int32)
    inputs = [
        client_module.InferInput("INPUT0", [1, 16], "INT32"),
        client_module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _http_clients(server: ServerProcess, n: int = CONNECTIONS) -> list[httpclient.InferenceServerClient]:
    return [
        httpclient.InferenceServerClient(server.http_url, connection_timeout=60, network_timeout=60)
        for _ in range(n)
    ]


def _grpc_clients(server: ServerProcess, n: int = CONNECTIONS) -> list[grpcclient.InferenceServerClient]:
    # a separate channel each (grpc shares one connection between clients of equal arguments)
    return [
        grpcclient.InferenceServerClient(
            server.grpc_url, channel_args=[("grpc.use_local_subchannel_pool", 1), ("x-client", i)]
        )
        for i in range(n)
    ]


def _metric(server: ServerProcess, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(server.metrics_url, timeout=30).read().decode()
    total = 0.0
    for line in text.splitlines():
        wanted = line.startswith((name + "{", name + " "))
        if wanted and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _success(server: ServerProcess, model: str) -> int:
    stats = httpclient.InferenceServerClient(server.http_url).get_inference_statistics(model)
    return sum(int(m["inference_stats"]["success"]["count"]) for m in stats["model_stats"])


def test_a_model_loaded_through_one_connection_is_served_through_every_other(cluster: ServerProcess) -> None:
    loader = httpclient.InferenceServerClient(cluster.http_url)
    loader.unload_model("simple")
    clients = _http_clients(cluster)
    for client in clients:  # unloaded everywhere before the call returned
        assert not client.is_model_ready("simple")
    grpcclient.InferenceServerClient(cluster.grpc_url).load_model("simple")
    for i, client in enumerate(clients):  # loaded everywhere before the call returned
        result = client.infer("simple", _simple_inputs(httpclient, i))
        assert (result.as_numpy("OUTPUT0") == i + 1).all()
    spread = _spread(cluster, cluster.http_port)  # the connections did reach both workers
    assert len(spread) == 2 and all(spread) and sum(spread) >= CONNECTIONS, spread


def test_statistics_and_metrics_count_every_request_whatever_worker_served_it(cluster: ServerProcess) -> None:
    before, metric_before = (
        _success(cluster, "simple"),
        _metric(cluster, "nv_inference_request_success", model="simple"),
    )
    http_clients, grpc_clients = _http_clients(cluster), _grpc_clients(cluster)
    sent = 0
    for round_ in range(3):
        for client in http_clients:
            client.infer("simple", _simple_inputs(httpclient, round_))
            sent += 1
        for gclient in grpc_clients:
            gclient.infer("simple", _simple_inputs(grpcclient, round_))
            sent += 1
    assert _success(cluster, "simple") - before == sent
    assert _metric(cluster, "nv_inference_request_success", model="simple") - metric_before == sent
    grpc_stats = grpc_clients[0].get_inference_statistics("simple", as_json=True)
    assert (
        sum(int(m["inference_stats"]["success"]["count"]) for m in grpc_stats["model_stats"]) - before == sent
    )
    assert _metric(cluster, "flowserve_workers", state="up") == 2


def test_the_ui_shows_the_whole_server(cluster: ServerProcess) -> None:
    for i, client in enumerate(_http_clients(cluster)):
        client.infer("simple", _simple_inputs(httpclient, i))
    total = _success(cluster, "simple")
    base = f"http://{cluster.http_url}/ui/api"
    for _ in range(8):  # new connections each time: both workers answer, alike
        models = json.loads(urllib.request.urlopen(f"{base}/models", timeout=30).read())["models"]
        assert next(m for m in models if m["name"] == "simple")["success"] == total
        stats = json.loads(urllib.request.urlopen(f"{base}/graphs/simple/stats", timeout=30).read())
        assert stats["model"]["success"] == total and stats["nodes"][0]["inference_count"] >= total


def test_shared_memory_registered_once_serves_every_connection(cluster: ServerProcess) -> None:
    import tritonclient.utils.shared_memory as shm

    key = f"/fs-cluster-{os.getpid()}"
    handle = shm.create_shared_memory_region("cluster_in", key, 128 + 64)
    try:
        shm.set_shared_memory_region(handle, [np.full((1, 16), 5, np.int32), np.ones((1, 16), np.int32)])
        httpclient.InferenceServerClient(cluster.http_url).register_system_shared_memory(
            "cluster_in", key, 128 + 64
        )
        try:
            for client in _grpc_clients(cluster):
                inputs = [
                    grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                    grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
                ]
                inputs[0].set_shared_memory("cluster_in", 64, 0)
                inputs[1].set_shared_memory("cluster_in", 64, 64)
                outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
                outputs[0].set_shared_memory("cluster_in", 64, 128)
                client.infer("simple", inputs, outputs=outputs)
                got = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=128)
                assert (got == 6).all()
                assert (
                    client.get_system_shared_memory_status("cluster_in").regions["cluster_in"].byte_size
                    == 192
                )
        finally:
            grpcclient.InferenceServerClient(cluster.grpc_url).unregister_system_shared_memory("cluster_in")
        for client in _http_clients(cluster, 4):  # gone everywhere
            assert client.get_system_shared_memory_status() == []
    finally:
        shm.destroy_shared_memory_region(handle)


def test_trace_settings_apply_everywhere_and_one_file_holds_every_workers_traces(
    cluster: ServerProcess, trace_file: Path
) -> None:
    setter = grpcclient.InferenceServerClient(cluster.grpc_url)
    setter.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    try:
        for client in _http_clients(cluster):  # the new settings everywhere
            assert client.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]
        for i, client in enumerate(_http_clients(cluster)):
            client.infer("simple", _simple_inputs(httpclient, i), request_id=f"traced-{i}")
    finally:
        setter.update_trace_settings(settings={"trace_level": ["OFF"]})
    deadline = time.monotonic() + 10
    ids: set[str] = set()
    while time.monotonic() < deadline:
        if trace_file.is_file():
            records = json.loads(trace_file.read_text())
            ids = {r["request_id"] for r in records if r.get("request_id", "").startswith("traced-")}
            if len(ids) == CONNECTIONS:
                break
        time.sleep(0.1)
    assert ids == {f"traced-{i}" for i in range(CONNECTIONS)}  # both workers' traces, one file
    for _ in range(4):  # and the UI lists every worker's, whichever answers
        listed = json.loads(
            urllib.request.urlopen(f"http://{cluster.http_url}/ui/api/traces?limit=500").read()
        )
        assert {t["request_id"] for t in listed["traces"]} >= ids
    # a trace count is the whole server's, not one per worker
    setter.update_trace_settings(
        settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "4"}
    )
    try:
        for i, client in enumerate(_http_clients(cluster)):
            client.infer("simple", _simple_inputs(httpclient, i), request_id=f"counted-{i}")
            time.sleep(0.05)  # the count's news reaches every worker
        left = [c.get_trace_settings()["trace_count"] for c in _http_clients(cluster, 4)]
    finally:
        setter.update_trace_settings(settings={"trace_level": ["OFF"], "trace_count": "-1"})
    time.sleep(0.5)
    records = json.loads(trace_file.read_text())
    counted = {r["request_id"] for r in records if r.get("request_id", "").startswith("counted-")}
    assert len(counted) == 4, counted
    assert left == ["0"] * 4
    assert len({r["id"] for r in records if r.get("model_name")}) == len(
        [r for r in records if r.get("model_name")]
    )


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


BURNS = 60  # requests of cpu_burn: 5 ms of CPU each (its burn_ms), 300 ms in all


def _burn_over_one_connection(cluster: ServerProcess, stream: bool) -> None:
    """Send BURNS requests over one gRPC connection (one stream when ``stream``) and check that
    the worker without the connection ran a good share of the model's work."""
    client = grpcclient.InferenceServerClient(cluster.grpc_url)
    assert client.is_model_ready("cpu_burn")  # the connection is open from here on
    spread = _spread(cluster, cluster.grpc_port)
    assert sorted(spread) == [0, 1], spread  # one connection, held by one worker
    other = _workers(cluster)[spread.index(0)]
    before = _cpu_s(other)
    done: list[Any] = []
    lock = threading.Condition()

    def finished(result: Any, error: Any) -> None:
        with lock:
            done.append(error if error is not None else result)
            lock.notify_all()

    if stream:
        client.start_stream(callback=finished)
    try:
        for i in range(BURNS):
            inp = grpcclient.InferInput("INPUT0", [1], "FP32")
            inp.set_data_from_numpy(np.array([float(i)], np.float32))
            if stream:
                client.async_stream_infer("cpu_burn", [inp])
            else:
                client.async_infer("cpu_burn", [inp], callback=finished)
        with lock:
            assert lock.wait_for(lambda: len(done) == BURNS, timeout=60)
    finally:
        if stream:
            client.stop_stream()
    values = sorted(float(r.as_numpy("OUTPUT0")[0]) for r in done)  # an error has no as_numpy
    assert values == [float(i) for i in range(BURNS)]
    assert _cpu_s(other) - before > 0.06


def test_one_grpc_connection_uses_every_worker(cluster: ServerProcess) -> None:
    """perf_analyzer's and tritonclient's gRPC default: every request over one HTTP/2
    connection, which one worker accepted; a CPU-bound model's requests spill to the other."""
    _burn_over_one_connection(cluster, stream=False)


def test_one_grpc_stream_uses_every_worker(cluster: ServerProcess) -> None:
    """ModelStreamInfer (perf_analyzer --streaming): a model that is not decoupled answers each
    request of the stream once, from whichever worker is less busy."""
    _burn_over_one_connection(cluster, stream=True)


def test_interleaved_sequences_over_many_connections_keep_their_sums(cluster: ServerProcess) -> None:
    """Eight sequences stepped in turn, every step through another connection (so either
    worker): each keeps its own running sum. The model's idle limit (200 ms, for the idle tests
    elsewhere) is raised to 30 s here: seven other calls run between two steps of a sequence,
    and on a busy machine they can take longer than 200 ms."""
    config = (ROOT / "tests" / "models" / "sequence_accumulate" / "config.pbtxt").read_text()
    patient = config.replace(
        "max_sequence_idle_microseconds: 200000", "max_sequence_idle_microseconds: 30000000"
    )
    assert patient != config
    loader = grpcclient.InferenceServerClient(cluster.grpc_url)
    loader.load_model("sequence_accumulate", config=json.dumps(_config_json(patient)))
    try:
        _interleaved_sequences(cluster)
    finally:
        loader.load_model("sequence_accumulate")  # its own config.pbtxt again


def _config_json(text: str) -> dict[str, Any]:
    return json_format.MessageToDict(parse_config_text(text), preserving_proto_field_name=True)


def _interleaved_sequences(cluster: ServerProcess) -> None:
    clients = _grpc_clients(cluster, 8)
    sequences = {1000 + s: list(range(1, 6 + s)) for s in range(8)}
    sums = dict.fromkeys(sequences, 0)
    steps = max(len(v) for v in sequences.values())
    for step in range(steps):
        for i, (corr, values) in enumerate(sequences.items()):
            if step >= len(values):
                continue
            client = clients[(i + step) % len(clients)]  # every step through another connection
            value = np.array([[values[step]]], np.int32)
            inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            inp.set_data_from_numpy(value)
            result = client.infer(
                "sequence_accumulate", [inp], sequence_id=corr, sequence_start=step == 0,
                sequence_end=step == len(values) - 1,
            )  # fmt: skip
            sums[corr] += values[step]
            assert int(result.as_numpy("OUTPUT")[0][0]) == sums[corr], (corr, step)
            assert int(result.as_numpy("CORRID_OUT")[0][0]) == corr


def test_a_killed_worker_loses_no_request_silently_and_the_server_recovers(cluster: ServerProcess) -> None:
    workers = _workers(cluster)
    assert len(workers) == 2
    restarts = _metric(cluster, "flowserve_worker_restarts_total")
    stop = threading.Event()
    outcomes: list[str] = []

    def load() -> None:
        # clients are closed in this thread: one collected in another cannot close its pool
        client = httpclient.InferenceServerClient(cluster.http_url, network_timeout=30)
        try:
            while not stop.is_set():
                try:
                    result = client.infer("simple", _simple_inputs(httpclient, 1))
                    assert (result.as_numpy("OUTPUT0") == 2).all()
                    outcomes.append("ok")
                except InferenceServerException as exc:
                    outcomes.append(f"error: {exc}")
                except Exception as exc:  # a connection the dead worker held: the client sees it end
                    outcomes.append(f"connection: {type(exc).__name__}")
                    with contextlib.suppress(Exception):
                        client.close()
                    client = httpclient.InferenceServerClient(cluster.http_url, network_timeout=30)
        finally:
            with contextlib.suppress(Exception):
                client.close()

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(load) for _ in range(4)]
        time.sleep(1.0)
        os.kill(workers[0], signal.SIGKILL)
        # while it is down the server says so: not ready, one worker up (the other answers)
        seen_down = False
        probe = httpclient.InferenceServerClient(cluster.http_url)
        down_until = time.monotonic() + 10
        while time.monotonic() < down_until and not seen_down:
            try:
                seen_down = (
                    not probe.is_server_ready() and _metric(cluster, "flowserve_workers", state="up") == 1
                )
            except Exception:
                probe = httpclient.InferenceServerClient(cluster.http_url)
            time.sleep(0.05)
        assert seen_down
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # restarted, caught up, ready again
            pids = _workers(cluster)
            if len(pids) == 2 and workers[0] not in pids and _ready(cluster):
                break
            time.sleep(0.5)
        time.sleep(1.0)
        stop.set()
        for future in futures:
            future.result(timeout=60)  # none hangs
    assert len(_workers(cluster)) == 2 and workers[0] not in _workers(cluster)
    assert "ok" in outcomes
    assert all(o == "ok" or o.startswith(("error", "connection")) for o in outcomes)
    assert _metric(cluster, "flowserve_worker_restarts_total") == restarts + 1
    # the restarted worker caught up: the models loaded through the API, the shm state
    for client in _http_clients(cluster):
        assert client.is_model_ready("sequence_accumulate") and client.is_model_ready("simple")
        assert (client.infer("simple", _simple_inputs(httpclient, 3)).as_numpy("OUTPUT0") == 4).all()


def _ready(server: ServerProcess) -> bool:
    try:
        return all(c.is_server_ready() for c in _http_clients(server, 8))
    except Exception:
        return False


def test_sigterm_drains_every_worker() -> None:
    server = start_server(
        "--workers", "2", "--model-control-mode=explicit", "--load-model=grpc_slow", timeout=180.0
    )
    try:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
        inp = httpclient.InferInput("INPUT0", [1], "FP32")
        inp.set_data_from_numpy(np.array([1.5], np.float32))
        pending = client.async_infer("grpc_slow", [inp])
        time.sleep(0.5)
        server.process.send_signal(signal.SIGTERM)
        result = pending.get_result(timeout=30)  # finished, not cut off
        assert float(result.as_numpy("OUTPUT0")[0]) == 1.5
        assert server.process.wait(60) == 0
        assert _workers(server) == []
    finally:
        server.stop()


def test_a_worker_that_cannot_start_stops_the_server_with_one_clear_error() -> None:
    """A port another process holds (without SO_REUSEPORT): the workers cannot listen, and the
    server exits with status 1 saying so instead of restarting them forever."""
    import socket
    import subprocess
    import sys

    from tests.conftest import ROOT, free_port

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cmd = [
            sys.executable, "-m", "flowserve.cli", "serve", "--host", "127.0.0.1", "--workers", "2",
            f"--http-port={port}", f"--grpc-port={free_port()}", "--metrics-port=-1",
            "--model-repository", str(ROOT / "model_repository"), "--model-control-mode=explicit",
        ]  # fmt: skip
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "failed to start" in out and "cannot serve" in out and "Traceback" not in out, out


def test_workers_need_fixed_ports() -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    cmd = [sys.executable, "-m", "flowserve.cli", "serve", "--workers", "2", "--http-port=0", "--grpc-port=-1",
           "--metrics-port=-1", "--model-repository", str(ROOT / "model_repository")]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--workers needs fixed ports" in done.stderr + done.stdout
