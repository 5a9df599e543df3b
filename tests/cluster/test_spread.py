"""``--workers 2`` and ONE gRPC connection: the requests run in both workers (the models say
which process ran them), large tensors cross between the workers in shared memory (the model
finds its input's memory is a mapping, not a copy), and a batching model's batches reach the
preferred size under load (the merged statistics say so)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import ServerProcess, start_server

PROBE = """
import mmap, os, time
import numpy as np
import triton_python_backend_utils as pb_utils


def _shared(array):
    base = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    return isinstance(base, mmap.mmap)


class TritonPythonModel:
    def initialize(self, args):
        self.burn_s, self.sleep_s = BURN_S, SLEEP_S

    def execute(self, requests):
        end = time.thread_time() + self.burn_s
        while time.thread_time() < end:
            sum(range(200))
        time.sleep(self.sleep_s)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            rows = x.shape[0]
            out = [
                pb_utils.Tensor("PID", np.full((rows, 1), os.getpid(), np.int64)),
                pb_utils.Tensor("SHARED", np.full((rows, 1), _shared(x), np.int32)),
                pb_utils.Tensor("SUM", x.reshape(rows, -1).sum(axis=1, keepdims=True).astype(np.float32)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 32
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [
  {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }},
  {{ name: "SHARED" data_type: TYPE_INT32 dims: [ 1 ] }},
  {{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
{batching}
"""

# name -> (CPU burn per execute, sleep per execute, dynamic_batching)
MODELS = {
    "probe": (0.003, 0.0, ""),
    "batched": (
        0.0,
        0.15,
        "dynamic_batching { preferred_batch_size: [ 16, 32 ] max_queue_delay_microseconds: 300000 }",
    ),
}
IMAGE = 3 * 224 * 224  # FP32 elements of a decoded 224x224 image: 588 KiB, through shared memory


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("spread")
    for name, (burn, sleep, batching) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, batching=batching))
        code = PROBE.replace("BURN_S", repr(burn)).replace("SLEEP_S", repr(sleep))
        (repo / name / "1" / "model.py").write_text(code)
    server = start_server("--workers", "2", repositories=(repo,), graphs=(), timeout=180.0)
    try:
        yield server
    finally:
        assert server.stop(60.0) == 0, server.log()[-4000:]


def _workers(server: ServerProcess) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == server.process.pid:
                found.add(int(entry.name))
    return found


def _over_one_connection(server: ServerProcess, model: str, elements: int, count: int) -> list[Any]:
    """``count`` requests sent at once over one gRPC connection; their results."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    done: list[Any] = []
    lock = threading.Condition()

    def finished(result: Any, error: Any) -> None:
        with lock:
            done.append(error if error is not None else result)
            lock.notify_all()

    for i in range(count):
        inp = grpcclient.InferInput("INPUT0", [1, elements], "FP32")
        inp.set_data_from_numpy(np.full((1, elements), float(i), np.float32))
        client.async_infer(model, [inp], callback=finished)
    with lock:
        assert lock.wait_for(lambda: len(done) == count, timeout=120)
    client.close()
    errors = [d for d in done if not hasattr(d, "as_numpy")]
    assert not errors, errors[:3]
    return done


def test_one_connection_runs_in_both_workers(cluster: ServerProcess) -> None:
    results = _over_one_connection(cluster, "probe", 4, 40)
    pids = {int(r.as_numpy("PID")[0, 0]) for r in results}
    assert pids == _workers(cluster)  # both worker processes ran some
    sums = sorted(float(r.as_numpy("SUM")[0, 0]) for r in results)
    assert sums == [4.0 * i for i in range(40)]


def test_large_tensors_cross_to_the_other_worker_in_shared_memory(cluster: ServerProcess) -> None:
    results = _over_one_connection(cluster, "probe", IMAGE, 24)
    by_pid: dict[int, set[int]] = {}
    for r in results:
        by_pid.setdefault(int(r.as_numpy("PID")[0, 0]), set()).add(int(r.as_numpy("SHARED")[0, 0]))
    assert len(by_pid) == 2, by_pid
    # where the connection is, the input is the decoded request; in the other worker it is the
    # shared block the link put it in (no copy through the socket or a pickle)
    # (a set of sets: sorted() orders frozensets by inclusion, so it kept the answers' order)
    assert {frozenset(v) for v in by_pid.values()} == {frozenset({0}), frozenset({1})}, by_pid
    sums = sorted(float(r.as_numpy("SUM")[0, 0]) for r in results)
    assert sums == pytest.approx([float(i * IMAGE) for i in range(24)])


def test_batches_reach_the_preferred_size_under_load(cluster: ServerProcess) -> None:
    _over_one_connection(cluster, "batched", 4, 128)
    stats = grpcclient.InferenceServerClient(cluster.grpc_url).get_inference_statistics(
        "batched", as_json=True
    )
    batches = {
        int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["model_stats"][0]["batch_stats"]
    }
    rows = sum(size * n for size, n in batches.items())
    assert rows == 128
    preferred = sum(size * n for size, n in batches.items() if size in (16, 32))
    assert preferred >= 0.75 * rows, batches
