"""Pinned staging with torch.cuda (needs an NVIDIA GPU and a CUDA torch; skipped elsewhere): the
same Staging logic as test_staging.py's fake device, with TorchCopier's pinned blocks, events
and asynchronous copies; and the GPU backends using it (host inputs through a reused pinned
block, outputs read on the host through one), with no device-wide synchronize anywhere."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flowserve.core.device import Device, to_host
from flowserve.nodes.backends._support import has_gpu
from tests.benchmark_module import load_benchmark

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not has_gpu() or not torch.cuda.is_available(), reason="needs an NVIDIA GPU and CUDA torch"
    ),
]

WHERE = Device("cuda", 0)


def _staging(limit: int = 64 << 20) -> Any:
    from flowserve.nodes.backends.cuda import TorchCopier, cuda_ops
    from flowserve.nodes.backends.staging import Staging

    ops = cuda_ops()
    assert ops is not None
    return Staging(TorchCopier(torch, WHERE), ops, WHERE, ops.stream(WHERE), limit)


def _refuse_device_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on a device-wide synchronize anywhere fails the test (the ordering rule)."""

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("torch.cuda.synchronize() called: a device-wide synchronize")

    monkeypatch.setattr(torch.cuda, "synchronize", refuse)


@pytest.fixture
def no_device_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    _refuse_device_sync(monkeypatch)


def test_blocks_are_pinned_and_uploads_land(no_device_sync: None) -> None:
    staging = _staging()
    for array in (
        np.arange(1 << 16, dtype=np.float32),
        np.arange(12, dtype=np.int64).reshape(3, 4).T,  # strided
        np.frombuffer(np.arange(8, dtype=np.int32).tobytes(), dtype=np.int32),  # read-only
        np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16),
        np.array([True, False, True]),
    ):
        value = staging.upload(array)
        assert value.is_cuda and tuple(value.shape) == array.shape
        done = staging.ops.record(staging.stream)
        done.synchronize()
        back = value.cpu()
        if array.dtype == ml_dtypes.bfloat16:
            assert back.dtype == torch.bfloat16 and back.float().tolist() == array.astype(np.float32).tolist()
        else:
            np.testing.assert_array_equal(back.numpy(), array)
    block = staging.inputs.acquire(10)
    assert block is not None and torch.from_numpy(block.memory).is_pinned()


def test_a_block_is_reused_only_after_its_upload_completed(no_device_sync: None) -> None:
    staging = _staging()
    with torch.cuda.stream(staging.stream):
        torch.cuda._sleep(100_000_000)  # the stream is busy: the upload queued after it waits
    first = staging.upload(np.ones(1000, np.float32))
    second = staging.upload(np.full(1000, 2.0, np.float32))  # the first block is still in flight
    assert staging.inputs.allocations == 2
    staging.ops.record(staging.stream).synchronize()
    assert float(first.sum()) == 1000 and float(second.sum()) == 2000
    staging.upload(np.zeros(1000, np.float32))
    assert staging.inputs.allocations == 2  # reused once the events completed


def test_outputs_come_back_through_a_pinned_block_after_a_slow_producer(no_device_sync: None) -> None:
    from flowserve.nodes.backends.cuda import cuda_tensor

    staging = _staging()
    producer = staging.ops.stream(WHERE)
    with torch.cuda.stream(producer):
        torch.cuda._sleep(100_000_000)  # a slow producer: the copy must not race it
        x = torch.full((1 << 20,), 3.0, device="cuda")
    tensor = cuda_tensor(x, producer, staging.ops, WHERE, staging.to_numpy)
    host, copied = to_host(tensor)
    assert copied == x.numel() * 4 and np.all(host == 3.0)
    assert staging.outputs.free == 0  # lent while the array lives
    del host
    gc.collect()
    assert staging.outputs.free == 1
    out = np.empty(1 << 20, np.float32)
    got, _ = staging.download(tensor, out)
    assert got is out and np.all(out == 3.0)


@pytest.mark.parametrize("model", ["zc_pre", "zc_mid"])
async def test_gpu_backends_stage_host_inputs_and_outputs(
    tmp_path: Path, model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flowserve.dataplane.engine import Engine

    if model == "zc_mid":
        ort = pytest.importorskip("onnxruntime")
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            pytest.skip("needs onnxruntime-gpu")
    bench = load_benchmark("zero_copy_cpu")
    repo, graphs = bench.write_pipeline(tmp_path)
    config = repo / model / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_CPU", "KIND_GPU"))
    engine = await Engine.start([repo], [graphs])
    try:
        servable = engine.registry.get(model)
        node = servable.executor.nodes[0]
        staging = getattr(node, "inner", node).pool.instances[0].staging
        assert staging is not None
        _refuse_device_sync(monkeypatch)  # loading may synchronize; requests never do
        x = np.random.default_rng(0).random(1 << 20, dtype=np.float32)
        expected = x * 2.0 if model == "zc_pre" else x + 1.0
        for _ in range(3):
            out = await engine.infer(model, {"x": x})
            np.testing.assert_allclose(out["y"], expected, rtol=1e-6)
        assert staging.inputs.allocations == 1  # one pinned block, reused
        assert staging.outputs.allocations <= 2
        # each request: x in, y out, as before staging
        assert (
            servable.stats.bytes_copied + sum(s.bytes_copied for s in servable.executor.stats) == 6 * x.nbytes
        )
    finally:
        await engine.stop()
