"""CUDA shared memory over HTTP and gRPC with tritonclient, on the CPU through the registry's
seam (flowserve/dataplane/cudashm.py ``HostMemoryOpener``: a "handle" names a host buffer seen
as fake-GPU memory). Proves: register/status/unregister (one and all) over both protocols with
tritonclient's own calls; inputs read from a region reach the model as device tensors (the
numpy Python model gets them through a host copy the executor counts: 128 bytes for two
INT32[1,16] inputs) and outputs are written into a region; bounds and unknown-region errors with
the right status codes and messages naming the region, tensor and sizes; one namespace with
system shared memory; regions are closed on unregister and on shutdown; and without CUDA the
registry keeps Triton's no-GPU answers. The real CUDA path is tests/conformance/test_cuda_shm_gpu.py."""

from __future__ import annotations

import asyncio
import base64
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from flowserve.core.device import DeviceTensor
from flowserve.core.errors import AlreadyExists, InvalidArgument, NotFound, ResourceExhausted, Unsupported
from flowserve.core.limits import Limits
from flowserve.dataplane.cudashm import NO_CUDA_SHM, CudaSharedMemoryRegistry, HostMemoryOpener
from flowserve.dataplane.engine import Engine
from flowserve.dataplane.plane import DataPlane
from flowserve.dataplane.shm import SharedMemoryRegistry
from flowserve.frontends.grpc import start_grpc
from flowserve.frontends.http import start_http

ROOT = Path(__file__).resolve().parents[2]
SIZE = 64  # one INT32[1, 16] tensor


@dataclass
class Served:
    plane: DataPlane
    opener: HostMemoryOpener
    http: str
    grpc: str


# a graph whose one node takes tensors as they come and hands its input back: its output is
# the region's own device tensor, which goes into an output region device to device
PASS_NODE = """
from flowserve.core.device import Device, DeviceTensor


class Pass:
    tensors = "dlpack"
    outputs = {"y": {"datatype": "INT32", "dims": [-1, 16]}}

    def execute(self, inputs):
        buffer = inputs["x"]  # the fake device's memory (a torch CUDA tensor on a GPU)
        device = Device("cuda", 0)
        return {"y": DeviceTensor(buffer, buffer.dtype, buffer.shape, device, stream=buffer.stream)}
"""

PASS_GRAPH = """
name: cs_pass
inputs:
  x: {datatype: INT32, dims: [-1, 16]}
outputs:
  y: keep.y
nodes:
  keep: {python: "cs_pass_node:Pass", inputs: {x: $x}}
"""


@pytest.fixture
async def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    repo = tmp_path / "models"
    shutil.copytree(ROOT / "model_repository" / "simple", repo / "simple")
    graphs = tmp_path / "graphs"
    graphs.mkdir()
    (graphs / "cs_pass.yaml").write_text(PASS_GRAPH)
    (tmp_path / "cs_pass_node.py").write_text(PASS_NODE)
    monkeypatch.syspath_prepend(str(tmp_path))
    engine = await Engine.start([repo], [graphs])
    opener = HostMemoryOpener()
    plane = DataPlane(engine, SharedMemoryRegistry(), cuda_shm=CudaSharedMemoryRegistry(opener))
    http = await start_http(plane, "127.0.0.1", 0)
    grpc = await start_grpc(plane, "127.0.0.1", 0)
    try:
        yield Served(plane, opener, f"127.0.0.1:{http.port}", f"127.0.0.1:{grpc.port}")
    finally:
        await grpc.stop(grace_s=0)
        await http.stop(grace_s=0)
        await plane.stop()
    assert all(region.closed for region in opener.opened)  # closed on unregister or at stop


def _with_client(served: Served, protocol: str, body: Callable[[Any, Served, str], None]) -> None:
    """``body`` with a tritonclient client, in one thread (the HTTP client is gevent's)."""
    c: Any = (
        httpclient.InferenceServerClient(served.http)
        if protocol == "http"
        else grpcclient.InferenceServerClient(served.grpc)
    )
    try:
        body(c, served, protocol)
    finally:
        c.close()


def handle_b64(opener: HostMemoryOpener, buffer: np.ndarray) -> bytes:
    """What tritonclient's ``cuda_shared_memory.get_raw_handle`` gives: the handle, base64."""
    return base64.b64encode(opener.export(buffer))


def status_names(status: Any, protocol: str) -> dict[str, int]:
    if protocol == "http":
        return {r["name"]: int(r["byte_size"]) for r in status}
    return {name: int(r.byte_size) for name, r in status.regions.items()}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_register_status_unregister(served: Served, protocol: str) -> None:
    await asyncio.to_thread(_with_client, served, protocol, _register_status_unregister)


def _register_status_unregister(c: Any, served: Served, protocol: str) -> None:
    meta = c.get_server_metadata()
    extensions = meta["extensions"] if protocol == "http" else list(meta.extensions)
    assert "cuda_shared_memory" in extensions  # said where it works (here: the CI seam)
    a, b = np.zeros(128, np.uint8), np.zeros(256, np.uint8)
    c.register_cuda_shared_memory("a", handle_b64(served.opener, a), 0, 128)
    c.register_cuda_shared_memory("b", handle_b64(served.opener, b), 0, 256)
    assert status_names(c.get_cuda_shared_memory_status(), protocol) == {"a": 128, "b": 256}
    assert status_names(c.get_cuda_shared_memory_status("a"), protocol) == {"a": 128}
    with pytest.raises(InferenceServerException, match="'a' is already registered"):
        c.register_cuda_shared_memory("a", handle_b64(served.opener, a), 0, 128)
    c.unregister_cuda_shared_memory("a")
    assert status_names(c.get_cuda_shared_memory_status(), protocol) == {"b": 256}
    with pytest.raises(InferenceServerException, match="unable to find CUDA shared memory region: 'a'"):
        c.get_cuda_shared_memory_status("a")
    c.unregister_cuda_shared_memory()  # all
    assert status_names(c.get_cuda_shared_memory_status(), protocol) == {}
    assert [r.closed for r in served.opener.opened] == [True, True]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_bad_handles_are_invalid_arguments_naming_the_region(served: Served, protocol: str) -> None:
    await asyncio.to_thread(
        _with_client, served, protocol, _bad_handles_are_invalid_arguments_naming_the_region
    )


def _bad_handles_are_invalid_arguments_naming_the_region(c: Any, served: Served, protocol: str) -> None:
    unknown = base64.b64encode(b"\x01" * 64)
    with pytest.raises(InferenceServerException) as info:
        c.register_cuda_shared_memory("r", unknown, 0, 64)
    assert "unable to open CUDA shared memory region 'r' on device 0" in info.value.message()
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    short = base64.b64encode(b"\x01" * 8)
    with pytest.raises(InferenceServerException, match="raw_handle is 8 bytes"):
        c.register_cuda_shared_memory("r", short, 0, 64)
    buffer = np.zeros(64, np.uint8)
    with pytest.raises(InferenceServerException, match="no device 3"):
        c.register_cuda_shared_memory("r", handle_b64(served.opener, buffer), 3, 64)
    assert status_names(c.get_cuda_shared_memory_status(), protocol) == {}


def _inputs(protocol: str) -> tuple[Any, Any]:
    module: Any = httpclient if protocol == "http" else grpcclient
    return module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")


def _outputs(protocol: str) -> tuple[Any, Any]:
    module: Any = httpclient if protocol == "http" else grpcclient
    return module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_infer_from_and_into_cuda_regions(served: Served, protocol: str) -> None:
    await asyncio.to_thread(_with_client, served, protocol, _infer_from_and_into_cuda_regions)


def _infer_from_and_into_cuda_regions(c: Any, served: Served, protocol: str) -> None:
    x0 = np.arange(16, dtype=np.int32).reshape(1, 16)
    x1 = np.full((1, 16), 5, np.int32)
    ins = np.concatenate([x0.reshape(-1), x1.reshape(-1)]).view(np.uint8).copy()
    outs = np.zeros(2 * SIZE, np.uint8)
    c.register_cuda_shared_memory("in", handle_b64(served.opener, ins), 0, 2 * SIZE)
    c.register_cuda_shared_memory("out", handle_b64(served.opener, outs), 0, 2 * SIZE)
    i0, i1 = _inputs(protocol)
    i0.set_shared_memory("in", SIZE)
    i1.set_shared_memory("in", SIZE, offset=SIZE)
    o0, o1 = _outputs(protocol)
    o0.set_shared_memory("out", SIZE)
    o1.set_shared_memory("out", SIZE, offset=SIZE)
    result = c.infer("simple", [i0, i1], outputs=[o0, o1])
    got = result.get_output("OUTPUT0")
    assert got is not None  # described in the response, its data in the region
    if protocol == "grpc":
        assert got.parameters["shared_memory_region"].string_param == "out"
        assert got.parameters["shared_memory_byte_size"].int64_param == SIZE
    np.testing.assert_array_equal(outs[:SIZE].view(np.int32), (x0 + x1).reshape(-1))
    np.testing.assert_array_equal(outs[SIZE:].view(np.int32), (x0 - x1).reshape(-1))
    # the inputs reached the engine as fake-GPU tensors: the numpy model got a counted copy
    stats = served.plane.engine.registry.get("simple").executor.stats[0]
    assert stats.bytes_copied == 2 * SIZE
    device = served.opener.device
    assert [n for _, n in device.ops("to_host")] == [SIZE, SIZE]
    assert [e[2] for e in device.ops("upload")] == [SIZE, SIZE]  # outputs host -> "device"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_an_output_left_on_the_device_goes_into_its_region_device_to_device(
    served: Served, protocol: str
) -> None:
    await asyncio.to_thread(_with_client, served, protocol, _device_to_device)


def _device_to_device(c: Any, served: Served, protocol: str) -> None:
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    ins = x.reshape(-1).view(np.uint8).copy()
    outs = np.zeros(SIZE, np.uint8)
    c.register_cuda_shared_memory("in", handle_b64(served.opener, ins), 0, SIZE)
    c.register_cuda_shared_memory("out", handle_b64(served.opener, outs), 0, SIZE)
    module = httpclient if protocol == "http" else grpcclient
    i = module.InferInput("x", [1, 16], "INT32")
    i.set_shared_memory("in", SIZE)
    o = module.InferRequestedOutput("y")
    o.set_shared_memory("out", SIZE)
    result = c.infer("cs_pass", [i], outputs=[o])
    assert result.get_output("y") is not None
    np.testing.assert_array_equal(outs.view(np.int32), x.reshape(-1))
    device = served.opener.device
    # never through the host: no host copy, no upload; the copy read the tensor on its stream
    assert device.ops("to_host") == [] and device.ops("upload") == []
    assert served.plane.engine.registry.get("cs_pass").executor.stats[0].bytes_copied == 0
    c.unregister_cuda_shared_memory()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
async def test_bounds_and_unknown_regions(served: Served, protocol: str) -> None:
    await asyncio.to_thread(_with_client, served, protocol, _bounds_and_unknown_regions)


def _bounds_and_unknown_regions(c: Any, served: Served, protocol: str) -> None:
    small = np.zeros(SIZE, np.uint8)
    c.register_cuda_shared_memory("small", handle_b64(served.opener, small), 0, SIZE)
    i0, i1 = _inputs(protocol)
    i0.set_shared_memory("small", SIZE, offset=SIZE)  # past the end
    i1.set_shared_memory("small", SIZE)
    with pytest.raises(InferenceServerException) as info:
        c.infer("simple", [i0, i1])
    message = info.value.message()
    assert "tensor 'INPUT0'" in message and "CUDA shared memory region 'small' has 64 bytes" in message
    assert "offset 64 + byte_size 64 does not fit" in message
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    i0.set_shared_memory("nowhere", SIZE)
    with pytest.raises(InferenceServerException, match=r"unable to find .*shared memory region: 'nowhere'"):
        c.infer("simple", [i0, i1])
    # an output bigger than what the client gave it
    i0, i1 = _inputs(protocol)
    i0.set_data_from_numpy(np.zeros((1, 16), np.int32))
    i1.set_data_from_numpy(np.zeros((1, 16), np.int32))
    o0, _ = _outputs(protocol)
    o0.set_shared_memory("small", 16)
    with pytest.raises(InferenceServerException) as info:
        c.infer("simple", [i0, i1], outputs=[o0])
    assert "output 'OUTPUT0' needs 64 bytes, but CUDA shared memory region 'small' was given 16" in (
        info.value.message()
    )


async def test_one_namespace_with_system_shared_memory(served: Served, tmp_path: Path) -> None:
    from multiprocessing import shared_memory

    system = shared_memory.SharedMemory(create=True, size=64)
    try:
        served.plane.shm.register("shared", "/" + system.name, 0, 64)
        with pytest.raises(AlreadyExists):
            served.plane.cuda_shm.register("shared", served.opener.export(np.zeros(64, np.uint8)), 0, 64)
        served.plane.cuda_shm.register("cuda", served.opener.export(np.zeros(64, np.uint8)), 0, 64)
        with pytest.raises(AlreadyExists):
            served.plane.shm.register("cuda", "/" + system.name, 0, 64)
        served.plane.shm.unregister()
    finally:
        system.close()
        system.unlink()


def test_the_number_of_cuda_regions_is_bounded() -> None:
    opener = HostMemoryOpener()
    registry = CudaSharedMemoryRegistry(opener, max_regions=2)
    buffers = [np.zeros(64, np.uint8) for _ in range(3)]
    registry.register("a", opener.export(buffers[0]), 0, 64)
    registry.register("b", opener.export(buffers[1]), 0, 64)
    with pytest.raises(ResourceExhausted, match="region 'c': 2 CUDA regions are registered"):
        registry.register("c", opener.export(buffers[2]), 0, 64)
    registry.unregister("a")
    registry.register("c", opener.export(buffers[2]), 0, 64)  # room again
    assert sorted(r["name"] for r in registry.status("")) == ["b", "c"]


def test_a_cuda_input_is_a_device_tensor_view_of_the_region() -> None:
    opener = HostMemoryOpener()
    registry = CudaSharedMemoryRegistry(opener)
    buffer = np.arange(16, dtype=np.float32).view(np.uint8).copy()
    registry.register("r", opener.export(buffer), 0, buffer.nbytes)
    tensor = registry.read_tensor("r", 16, 32, "x", "FP32", [2, 4], Limits())
    assert isinstance(tensor, DeviceTensor) and str(tensor.device) == "cuda:0"
    assert tensor.shape == (2, 4) and tensor.dtype == np.float32
    buffer[16:20] = np.array([9.0], np.float32).view(np.uint8)  # the same memory, not a copy
    host, copied = tensor.host()
    assert host[0, 0] == 9.0 and copied == 32
    with pytest.raises(InvalidArgument, match=r"input 'x': got 16 bytes of shared memory .* needs 32"):
        registry.read_tensor("r", 0, 16, "x", "FP32", [2, 4], Limits())
    registry.close()


def test_without_cuda_the_answers_are_tritons_without_gpu_support() -> None:
    registry = CudaSharedMemoryRegistry(opener=None)
    assert not registry.available
    with pytest.raises(Unsupported, match="CUDA shared memory is not supported"):
        registry.register("r", b"\0" * 64, 0, 64)
    assert registry.status() == []
    with pytest.raises(NotFound) as info:
        registry.status("r")
    assert NO_CUDA_SHM in info.value.message
    registry.unregister("r")
    registry.unregister()


def test_the_auto_opener_finds_no_cuda_on_a_machine_without_a_gpu() -> None:
    from flowserve.nodes.backends._support import has_gpu

    if has_gpu():
        pytest.skip("a GPU is present")
    assert not CudaSharedMemoryRegistry().available
