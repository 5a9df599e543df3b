"""CUDA shared memory with the real thing (needs an NVIDIA GPU, a CUDA torch and tritonclient's
``cuda_shared_memory`` module with its CUDA bindings; skipped elsewhere): the official client
allocates device memory, exports its cudaIpc handle and registers it with a server process
(CUDA refuses to open a handle in the process that made it), over HTTP and gRPC; ``simple``
reads its inputs from one region and writes its outputs into another. The same protocol paths
run on every machine through the registry's seam: tests/dataplane/test_cuda_shm.py."""

from __future__ import annotations

import importlib
from typing import Any

import numpy as np
import pytest

from flowserve.nodes.backends._support import has_gpu

# a GPU machine may lack tritonclient: skipped then, never an error at collection
grpcclient: Any = pytest.importorskip("tritonclient.grpc")
httpclient: Any = pytest.importorskip("tritonclient.http")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not has_gpu(), reason="needs an NVIDIA GPU")]

SIZE = 64


@pytest.fixture(scope="module")
def cudashm() -> Any:
    """tritonclient's CUDA shared-memory helpers, working here, else a skip saying why. Its
    module raises RuntimeError (not ImportError) without cuda-python, and cuda-python's
    bindings may be newer than the driver: both are the client's install, not the server."""
    try:
        module = importlib.import_module("tritonclient.utils.cuda_shared_memory")
        probe = module.create_shared_memory_region("probe", 64, 0)
        module.destroy_shared_memory_region(probe)
    except Exception as exc:
        pytest.skip(f"tritonclient's cuda_shared_memory does not work here: {type(exc).__name__}: {exc}")
    return module


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_simple_reads_and_writes_cuda_regions(server: Any, cudashm: Any, protocol: str) -> None:
    module: Any = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    x0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    x1 = np.full((1, 16), 5, np.int32)
    ins = cudashm.create_shared_memory_region(f"in-{protocol}", 2 * SIZE, 0)
    outs = cudashm.create_shared_memory_region(f"out-{protocol}", 2 * SIZE, 0)
    try:
        cudashm.set_shared_memory_region(ins, [x0, x1])
        client.register_cuda_shared_memory("in", cudashm.get_raw_handle(ins), 0, 2 * SIZE)
        client.register_cuda_shared_memory("out", cudashm.get_raw_handle(outs), 0, 2 * SIZE)
        status = client.get_cuda_shared_memory_status()
        names = [r["name"] for r in status] if protocol == "http" else list(status.regions)
        assert sorted(names) == ["in", "out"]
        i0 = module.InferInput("INPUT0", [1, 16], "INT32")
        i1 = module.InferInput("INPUT1", [1, 16], "INT32")
        i0.set_shared_memory("in", SIZE)
        i1.set_shared_memory("in", SIZE, offset=SIZE)
        o0, o1 = module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")
        o0.set_shared_memory("out", SIZE)
        o1.set_shared_memory("out", SIZE, offset=SIZE)
        client.infer("simple", [i0, i1], outputs=[o0, o1])
        got0 = cudashm.get_contents_as_numpy(outs, np.int32, [1, 16])
        np.testing.assert_array_equal(got0, x0 + x1)
        # the second output, read through a fresh view of the region at its offset
        whole = cudashm.get_contents_as_numpy(outs, np.int32, [2, 16])
        np.testing.assert_array_equal(whole[1], (x0 - x1)[0])
        client.unregister_cuda_shared_memory()
        status = client.get_cuda_shared_memory_status()
        assert (status == []) if protocol == "http" else (len(status.regions) == 0)
    finally:
        client.unregister_cuda_shared_memory()
        cudashm.destroy_shared_memory_region(ins)
        cudashm.destroy_shared_memory_region(outs)
        client.close()
