"""The real device path (needs an NVIDIA GPU and a CUDA torch; skipped elsewhere): the same
ordering rule as the fake device's tests, with torch.cuda streams and events; a torch ->
ONNX Runtime (CUDA EP) -> torch graph whose tensors stay on the GPU; CUDA IPC regions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flowserve.core.device import Device, DeviceTensor, take, to_host
from flowserve.nodes.backends._support import has_gpu
from tests.benchmark_module import load_benchmark

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not has_gpu() or not torch.cuda.is_available(), reason="needs an NVIDIA GPU and CUDA torch"
    ),
]

ROOT = Path(__file__).resolve().parents[3]


def test_a_consumer_stream_waits_on_the_producers_event() -> None:
    from flowserve.nodes.backends.cuda import cuda_ops, cuda_tensor

    ops = cuda_ops()
    assert ops is not None
    where = Device("cuda", 0)
    producer, consumer = ops.stream(where), ops.stream(where)
    with torch.cuda.stream(producer):
        torch.cuda._sleep(50_000_000)  # a slow producer: the consumer must not race it
        x = torch.full((1 << 20,), 3.0, device="cuda")
    tensor = cuda_tensor(x, producer, ops, where)
    with torch.cuda.stream(consumer):
        y = take(tensor, consumer) * 2
    done = ops.record(consumer)
    done.synchronize()  # the host waits for the consumer's event only
    assert float(y[0]) == 6.0 and float(y[-1]) == 6.0
    array, copied = to_host(cuda_tensor(y, consumer, ops, where))
    assert copied == y.numel() * 4 and np.all(array == 6.0)


async def test_torch_ort_cuda_torch_stays_on_the_gpu(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs onnxruntime-gpu")
    from flowserve.dataplane.engine import Engine

    bench = load_benchmark("zero_copy_cpu")
    repo, graphs = bench.write_pipeline(tmp_path)
    for name in ("zc_pre", "zc_mid", "zc_post"):
        config = repo / name / "config.pbtxt"
        config.write_text(config.read_text().replace("KIND_CPU", "KIND_GPU"))
    engine = await Engine.start([repo], [graphs])
    try:
        x = np.random.default_rng(0).random(1 << 20, dtype=np.float32)
        out = await engine.infer("zc_pipeline", {"x": x})
        np.testing.assert_allclose(out["y"], bench.expected(x), rtol=1e-5)
        mid = engine.registry.get("zc_mid")
        result = await mid.infer({"x": x}, _ctx(), host=False)
        assert isinstance(result["y"], DeviceTensor) and result["y"].device == Device("cuda", 0)
        # host copies: x to the GPU once (pre), y back once (post's output for the front end);
        # none between the three models
        assert engine.registry.get("zc_mid").stats.bytes_copied == x.nbytes  # the direct call above
        pipeline = engine.registry.get("zc_pipeline")
        assert sum(s.bytes_copied for s in pipeline.executor.stats) == 0
    finally:
        await engine.stop()


async def test_a_merged_batch_of_a_gpu_onnx_model_is_split_on_the_device(
    bk: Any, make_models: Any, tmp_path: Path
) -> None:
    """Requests merged into one batch, run by ONNX Runtime on the GPU, cut back into rows per
    request where the outputs are (an OrtValue has no rows to cut: its torch view has)."""
    import asyncio

    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("needs onnxruntime-gpu")
    pytest.importorskip("onnx")
    config = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { kind: KIND_GPU count: 1 } ]
dynamic_batching { max_queue_delay_microseconds: 200000 }
"""
    model_dir = bk.write_model(tmp_path, "add_sub_gpu", config)
    make_models.make_onnx_add_sub(model_dir / "1" / "model.onnx")
    rows = [np.full((1, 16), i, np.float32) for i in range(4)]
    async with bk.engine_for(tmp_path) as engine:
        outs = await asyncio.gather(*(engine.infer("add_sub_gpu", {"INPUT0": r, "INPUT1": r}) for r in rows))
        stats = engine.registry.get("add_sub_gpu").stats
    for r, out in zip(rows, outs, strict=True):
        np.testing.assert_array_equal(out["OUTPUT0"], r * 2)
        np.testing.assert_array_equal(out["OUTPUT1"], r * 0)
    assert max(stats.batches) > 1  # at least one batch merged requests (and was split again)


def test_cuda_ipc_region_round_trip() -> None:
    """A region another process exported (as a Triton client does) opened here by its handle
    (CUDA refuses to open a handle in the process that made it)."""
    import subprocess
    import sys

    from flowserve.nodes.backends.cuda import cuda_ops, cuda_tensor, open_ipc_region

    exporter = (
        "import sys, time, torch\n"
        "from flowserve.nodes.backends.cuda import ipc_handle\n"
        "t = torch.arange(256, dtype=torch.float32, device='cuda')\n"
        "print(ipc_handle(t).hex(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", exporter], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert child.stdout is not None
        handle = bytes.fromhex(child.stdout.readline().strip())
        assert len(handle) == 64
        region = open_ipc_region(handle, 0, 256 * 4)
        try:
            view = region.tensor(0, 64 * 4, np.dtype(np.float32), (64,))
            assert isinstance(view, DeviceTensor) and view.device == Device("cuda", 0)
            assert torch.equal(view.value.cpu(), torch.arange(64, dtype=torch.float32))
            region.write(0, np.full(4, 7.0, np.float32))  # host -> device into the region
            assert region.read(0, 16) == np.full(4, 7.0, np.float32).tobytes()
            # BF16 (numpy has none: the array interface cannot name it) viewed in torch's dtype
            halves = region.tensor(64, 8, np.dtype(ml_dtypes.bfloat16), (2, 2))
            assert halves.value.dtype == torch.bfloat16 and tuple(halves.value.shape) == (2, 2)
            expected = torch.arange(16, 18, dtype=torch.float32).view(torch.bfloat16).reshape(2, 2)
            assert torch.equal(halves.value.cpu(), expected)
            # a read-only host output (a front end's buffer) and a device output into the region
            region.write(128, np.frombuffer(np.full(4, 3.0, np.float32).tobytes(), np.float32))
            assert region.read(128, 16) == np.full(4, 3.0, np.float32).tobytes()
            ops = cuda_ops()
            assert ops is not None
            producer = ops.stream(Device("cuda", 0))
            with torch.cuda.stream(producer):
                torch.cuda._sleep(50_000_000)  # a slow producer: the copy into the region waits
                y = torch.full((4,), 5.0, device="cuda")
            region.write(256, cuda_tensor(y, producer, ops, Device("cuda", 0)))
            assert region.read(256, 16) == np.full(4, 5.0, np.float32).tobytes()
        finally:
            region.close()
    finally:
        child.communicate("", timeout=30)


def _ctx() -> Any:
    from flowserve.core.node import Context

    return Context()
