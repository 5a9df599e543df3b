"""``--workers 2`` with a KIND_GPU torch model (needs an NVIDIA GPU and a CUDA torch; skipped
elsewhere): every worker loads it on the GPU (its own CUDA context) and serves it from its own
connections, no request forwarded; the statistics count every request once."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from flowserve.nodes.backends._support import has_gpu
from tests.conftest import ServerProcess, start_server

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(
        not has_gpu() or not torch.cuda.is_available(), reason="needs an NVIDIA GPU and CUDA torch"
    ),
]

CONFIG = """
name: "gpu_net"
platform: "pytorch_libtorch"
max_batch_size: 32
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1000 ] } ]
instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0 ] } ]
dynamic_batching { preferred_batch_size: [ 16, 32 ] max_queue_delay_microseconds: 2000 }
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("gpu")
    (repo / "gpu_net" / "1").mkdir(parents=True)
    (repo / "gpu_net" / "config.pbtxt").write_text(CONFIG)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 7, stride=4),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(16, 1000),
    ).eval()
    with warnings.catch_warnings():  # torch.jit is deprecated (a DeprecationWarning since 2.11)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        torch.jit.trace(net, torch.zeros(1, 3, 224, 224)).save(str(repo / "gpu_net" / "1" / "model.pt"))
    server = start_server("--workers", "2", repositories=(repo,), graphs=(), timeout=300.0)
    try:
        yield server
    finally:
        assert server.stop(60.0) == 0, server.log()[-4000:]


def _uses_the_gpu(pid: int) -> bool:
    """Whether a process has the NVIDIA device files open (a CUDA context)."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if str(fd.readlink()).startswith("/dev/nvidia"):
                return True
        except OSError:
            continue
    return False


def test_every_worker_serves_the_gpu_model(cluster: ServerProcess) -> None:
    clients = [httpclient.InferenceServerClient(cluster.http_url) for _ in range(16)]
    image = np.random.default_rng(0).random((1, 3, 224, 224), dtype=np.float32)
    for client in clients:
        inp = httpclient.InferInput("INPUT__0", list(image.shape), "FP32")
        inp.set_data_from_numpy(image)
        out = client.infer("gpu_net", [inp]).as_numpy("OUTPUT__0")
        assert out.shape == (1, 1000)
    workers = [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _parent(int(p.name)) == cluster.process.pid
    ]
    assert len(workers) == 2 and all(_uses_the_gpu(pid) for pid in workers)
    stats = clients[0].get_inference_statistics("gpu_net")["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) == 16


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1
