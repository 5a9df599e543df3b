"""A real ``flowserve serve --ray-address`` against the two-node Ray cluster, queried with
tritonclient: a YAML graph whose heavy node has two KIND_RAY instances (one per Ray node) and
the ``ray_double`` python model. One Ray node is killed while both instances run a request:
the request on that node fails with UNAVAILABLE naming the node and saying its Ray actor died,
the other completes, and once a node is back the restarted actor serves again.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray")

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import start_server
from tests.ray.conftest import RayCluster

MODELS = Path(__file__).resolve().parent / "models"
GRAPH = """
name: ray_heavy
inputs: {seconds: {datatype: FP32, dims: [1]}}
outputs: {pid: heavy.pid, node: heavy.node}
nodes:
  heavy:
    python: tests.ray.ray_nodes:Where
    inputs: {seconds: $seconds}
    instances: {count: 2, kind: KIND_RAY, resources: {num_cpus: 0, slot: 1}}
"""
TIMEOUT_S = 120.0


def _heavy(client: grpcclient.InferenceServerClient, seconds: float) -> tuple[int, bytes]:
    x = grpcclient.InferInput("seconds", [1], "FP32")
    x.set_data_from_numpy(np.array([seconds], np.float32))
    result = client.infer("ray_heavy", [x], client_timeout=TIMEOUT_S)
    return int(result.as_numpy("pid")[0]), bytes(result.as_numpy("node")[0])


def _double(url: str) -> np.ndarray:
    with httpclient.InferenceServerClient(url, network_timeout=TIMEOUT_S) as client:
        x = httpclient.InferInput("INPUT0", [2, 4], "FP32")
        x.set_data_from_numpy(np.arange(8, dtype=np.float32).reshape(2, 4))
        out = client.infer("ray_double", [x]).as_numpy("OUTPUT0")
        assert out is not None
        return out


def test_server_serves_ray_instances_and_survives_a_killed_ray_node(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    (tmp_path / "ray_heavy.yaml").write_text(GRAPH)
    server = start_server(
        "--ray-address", ray_cluster.address, repositories=(MODELS,), graphs=(tmp_path,), timeout=180
    )
    try:
        np.testing.assert_array_equal(
            _double(server.http_url), np.arange(8, dtype=np.float32).reshape(2, 4) * 2
        )
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with ThreadPoolExecutor(2) as pool:
            before = list(pool.map(lambda s: _heavy(client, s), [0.5, 0.5]))
            assert len({node for _, node in before}) == 2  # one instance on each Ray node

            running: list[Future[tuple[int, bytes]]] = [pool.submit(_heavy, client, 8.0) for _ in range(2)]
            time.sleep(2.0)  # both calls are in their actors now
            ray_cluster.kill_worker()
            failed, served = [], []
            for future in running:
                try:
                    served.append(future.result(TIMEOUT_S))
                except InferenceServerException as exc:
                    failed.append(exc)
            assert len(failed) == 1 and len(served) == 1, [str(e) for e in failed]
            error = failed[0]
            assert error.status() == "StatusCode.UNAVAILABLE"
            message = str(error.message())
            assert "graph 'ray_heavy', node 'heavy'" in message
            assert "its Ray actor" in message and "died while running the request" in message

            # every request after the kill is served: by the surviving instance while the other
            # waits for room to restart, then by both once a node is back
            ray_cluster.add_worker()
            deadline = time.monotonic() + TIMEOUT_S
            after = list(pool.map(lambda s: _heavy(client, s), [0.5, 0.5]))
            while len({node for _, node in after}) < 2 and time.monotonic() < deadline:
                after = list(pool.map(lambda s: _heavy(client, s), [0.5, 0.5]))
        assert len({node for _, node in after}) == 2, "the actor that died never came back"
        assert {node for _, node in after} != {node for _, node in before}  # restarted on the new node
        np.testing.assert_array_equal(
            _double(server.http_url), np.arange(8, dtype=np.float32).reshape(2, 4) * 2
        )
    finally:
        assert server.stop() == 0, server.log()[-3000:]
