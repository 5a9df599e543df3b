"""Pinned staging (flowserve/nodes/backends/staging.py) on the fake device: blocks are reused,
grow, stay under their bound, and are never handed out again before the event of their last
copy has completed; uploads go on the instance's stream with an event after them; downloads go
on the copy stream and the host waits on that copy's event only; a lent host array keeps its
block out of the pool while it lives. The torch.cuda copier behind the same logic is tested
in test_device_gpu.py (marked gpu)."""

from __future__ import annotations

import gc
import threading

import ml_dtypes
import numpy as np
import pytest

from flowserve.core.device import Device, DeviceTensor, FakeDevice, OrderingError, to_host
from flowserve.nodes.backends.staging import MIN_BLOCK, FakeCopier, PinnedPool, Staging, block_size


def _staging(limit: int = 1 << 20) -> tuple[FakeDevice, FakeCopier, Staging]:
    device = FakeDevice()
    copier = FakeCopier(device)
    stream = device.stream(device.device)
    return device, copier, Staging(copier, device, device.device, stream, limit)


def test_block_sizes_are_powers_of_two_from_the_minimum() -> None:
    assert block_size(0) == block_size(1) == block_size(MIN_BLOCK) == MIN_BLOCK
    assert block_size(MIN_BLOCK + 1) == 2 * MIN_BLOCK
    assert block_size(3 << 20) == 4 << 20


def test_a_block_comes_back_once_its_copy_has_completed() -> None:
    device = FakeDevice()
    copier = FakeCopier(device)
    pool = PinnedPool(copier, 1 << 20)
    stream = device.stream(device.device)
    first = pool.acquire(1000)
    assert first is not None
    event = device.record(stream)
    pool.release(first, event)
    # its copy is still in flight: a second request gets a block of its own
    second = pool.acquire(1000)
    assert second is not None and second is not first and copier.allocated == [MIN_BLOCK, MIN_BLOCK]
    pool.release(second, device.record(stream))
    copier.complete(event)
    # now the first is reused: nothing more allocated
    assert pool.acquire(500) is first and len(copier.allocated) == 2
    assert pool.held == 2 * MIN_BLOCK


def test_the_smallest_ready_block_that_fits_is_reused() -> None:
    device = FakeDevice()
    copier = FakeCopier(device)
    pool = PinnedPool(copier, 1 << 20)
    small, large = pool.acquire(MIN_BLOCK), pool.acquire(4 * MIN_BLOCK)
    assert small is not None and large is not None
    pool.release(large, None)
    pool.release(small, None)
    assert pool.acquire(10) is small
    assert pool.acquire(2 * MIN_BLOCK) is large


def test_the_pool_grows_by_dropping_idle_blocks_and_stays_under_its_bound() -> None:
    device = FakeDevice()
    copier = FakeCopier(device)
    pool = PinnedPool(copier, 4 * MIN_BLOCK)
    stream = device.stream(device.device)
    small = pool.acquire(MIN_BLOCK)
    assert small is not None
    pool.release(small, device.record(stream))
    # a larger request: the small block is still in flight, so the larger one cannot fit yet
    assert pool.acquire(4 * MIN_BLOCK) is None and pool.refused == 1
    copier.complete()
    grown = pool.acquire(4 * MIN_BLOCK)  # the completed small block was dropped for it
    assert grown is not None and grown.nbytes == 4 * MIN_BLOCK
    assert pool.held == 4 * MIN_BLOCK <= pool.limit
    # bigger than the bound: never pinned
    assert pool.acquire(8 * MIN_BLOCK) is None and pool.refused == 2


def test_a_failed_pinned_allocation_falls_back_and_frees_its_reservation() -> None:
    device = FakeDevice()
    copier = FakeCopier(device)
    pool = PinnedPool(copier, 1 << 20)
    copier.fail_pinned = True
    assert pool.acquire(100) is None and pool.held == 0 and pool.refused == 1


def test_upload_copies_through_a_pinned_block_on_the_instance_stream() -> None:
    device, copier, staging = _staging()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    value = staging.upload(x.T)  # strided: made contiguous by the one host copy into the block
    np.testing.assert_array_equal(value.data, x.T)
    assert copier.log == [("upload", staging.stream, x.nbytes, True)]
    # an event was recorded on the instance's stream after the upload, and guards the block
    (record,) = device.ops("record")
    assert record[1] is staging.stream
    again = staging.upload(np.ones(4, np.float32))  # the first block's copy is in flight
    assert len(copier.allocated) == 2 and again.data.tolist() == [1, 1, 1, 1]
    copier.complete()
    staging.upload(np.zeros(8, np.float32))
    assert len(copier.allocated) == 2  # reused


def test_upload_of_a_read_only_or_bfloat16_request_buffer() -> None:
    _device, copier, staging = _staging()
    frozen = np.frombuffer(np.arange(6, dtype=np.int64).tobytes(), dtype=np.int64)
    assert not frozen.flags.writeable
    np.testing.assert_array_equal(staging.upload(frozen).data, np.arange(6))
    bf16 = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    out = staging.upload(bf16).data
    assert out.dtype == ml_dtypes.bfloat16 and out.tolist() == bf16.tolist()
    assert [entry[3] for entry in copier.log] == [True, True]
    with pytest.raises(TypeError, match="BYTES"):
        staging.upload(np.array([b"a"], dtype=object))


def test_upload_past_the_bound_goes_through_pageable_memory() -> None:
    _device, copier, staging = _staging(limit=MIN_BLOCK)
    big = np.ones(MIN_BLOCK, np.float32)  # 4 x MIN_BLOCK bytes
    assert staging.upload(big).data.sum() == MIN_BLOCK
    assert copier.log == [("upload", staging.stream, big.nbytes, False)] and staging.inputs.refused == 1


def test_to_numpy_lends_a_pinned_block_until_the_array_is_gone() -> None:
    device, copier, staging = _staging()
    producer = device.stream(device.device)
    made = device.launch(producer, "make", lambda: np.arange(6, dtype=np.float32).reshape(2, 3))
    tensor = device.tensor(made, producer)
    tensor.to_numpy_fn = staging.to_numpy  # as a backend with staging makes its outputs
    host, copied = to_host(tensor)
    assert copied == 24 and host.tolist() == [[0, 1, 2], [3, 4, 5]]
    # the host waited on the producer's event, then on the copy's event (on the copy stream)
    waits = device.ops("host_wait")
    assert [w[1] for w in waits] == [tensor.event, device.ops("record")[-1][2]]
    assert device.ops("record")[-1][1] is staging.copy_stream() is not producer
    assert copier.log == [("download", staging.copy_stream(), 24, True)]
    assert staging.outputs.free == 0  # lent
    view = host[1]
    del host
    gc.collect()
    assert staging.outputs.free == 0  # a view still holds the block
    assert view.tolist() == [3, 4, 5]
    del view
    gc.collect()
    assert staging.outputs.free == 1
    again, _ = to_host(
        device.tensor(device.launch(producer, "make", lambda: np.ones(3, np.float32)), producer)
    )
    assert again.tolist() == [1, 1, 1]


def test_to_numpy_reuses_the_returned_block() -> None:
    device, copier, staging = _staging()
    producer = device.stream(device.device)
    for i in range(5):
        buffer = device.launch(producer, "make", lambda i=i: np.full(100, i, np.int32))
        out = staging.to_numpy(buffer)
        assert out.tolist() == [i] * 100
        del out
    assert len(copier.allocated) == 1


def test_download_into_a_callers_buffer_waits_on_the_producer_on_the_device() -> None:
    device, copier, staging = _staging()
    producer = device.stream(device.device)
    tensor = device.tensor(device.launch(producer, "make", lambda: np.arange(8, dtype=np.int16)), producer)
    out = np.empty(8, np.int16)
    got, copied = staging.download(tensor, out)
    assert got is out and copied == 16 and out.tolist() == list(range(8))
    assert copier.allocated == []  # straight into the caller's buffer
    copy_stream = staging.copy_stream()
    assert ("wait", copy_stream, tensor.event) in device.log  # device side, not the host
    assert [w[1].stream for w in device.ops("host_wait")] == [copy_stream]
    with pytest.raises(ValueError, match="cannot take"):
        staging.download(tensor, np.empty(4, np.int16))


def test_download_without_a_buffer_lends_a_pinned_block() -> None:
    device, _copier, staging = _staging()
    producer = device.stream(device.device)
    tensor = device.tensor(device.launch(producer, "make", lambda: np.arange(4.0)), producer)
    host, copied = staging.download(tensor)
    assert copied == 32 and host.tolist() == [0, 1, 2, 3] and staging.outputs.free == 0


def test_a_read_without_the_producers_event_is_refused() -> None:
    """The fake device itself refuses a read on the copy stream that skipped the wait, so the
    download path's wait above is what makes it pass."""
    device, _copier, staging = _staging()
    producer = device.stream(device.device)
    buffer = device.launch(producer, "make", lambda: np.zeros(2))
    tensor = device.tensor(buffer, producer)
    with pytest.raises(OrderingError):
        device.use(buffer, staging.copy_stream())
    staging.download(tensor)


def test_concurrent_downloads_share_the_pool_safely() -> None:
    device, copier, staging = _staging(limit=16 * MIN_BLOCK)
    producer = device.stream(device.device)
    buffers = [device.launch(producer, "make", lambda i=i: np.full(1000, i, np.float64)) for i in range(8)]
    errors: list[BaseException] = []

    def work(index: int) -> None:
        try:
            for _ in range(50):
                out = staging.to_numpy(buffers[index])
                assert float(out[0]) == index and float(out[-1]) == index
                del out
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    gc.collect()
    assert staging.outputs.held <= staging.outputs.limit and len(copier.allocated) <= 16


def test_a_device_tensor_keeps_its_staging_through_a_batch_split() -> None:
    device, _copier, staging = _staging()
    producer = device.stream(device.device)
    tensor = device.tensor(device.launch(producer, "make", lambda: np.arange(6.0).reshape(3, 2)), producer)
    tensor.to_numpy_fn = staging.to_numpy
    row = tensor[1:2]
    assert isinstance(row, DeviceTensor) and row.device == Device("cuda", 0)
    host, copied = to_host(row)
    assert host.tolist() == [[2.0, 3.0]] and copied == 16


def test_the_models_parameter_bounds_or_turns_off_its_staging() -> None:
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from flowserve.core.errors import InvalidArgument
    from flowserve.nodes.backends.cuda import TorchCudaOps, staging_for, torch_dtype
    from flowserve.nodes.backends.staging import DEFAULT_LIMIT, LIMIT_PARAMETER

    ops = TorchCudaOps(torch)  # nothing here touches CUDA: streams are made when first needed

    def model(**parameters: str) -> object:
        return SimpleNamespace(name="m", parameters=parameters)

    made = staging_for(model(), ops, Device("cuda", 0), None)  # type: ignore[arg-type]
    assert made is not None and made.inputs.limit == made.outputs.limit == DEFAULT_LIMIT
    small = staging_for(model(**{LIMIT_PARAMETER: "1048576"}), ops, Device("cuda", 0), None)  # type: ignore[arg-type]
    assert small is not None and small.inputs.limit == 1 << 20
    assert staging_for(model(**{LIMIT_PARAMETER: "0"}), ops, Device("cuda", 0), None) is None  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=LIMIT_PARAMETER):
        staging_for(model(**{LIMIT_PARAMETER: "lots"}), ops, Device("cuda", 0), None)  # type: ignore[arg-type]
    assert torch_dtype(torch, np.dtype(np.float16)) == torch.float16
    assert torch_dtype(torch, np.dtype(ml_dtypes.bfloat16)) == torch.bfloat16
    assert torch_dtype(torch, np.dtype(np.bool_)) == torch.bool


def test_download_into_a_region_through_the_producers_staging_or_the_host() -> None:
    from flowserve.nodes.backends.staging import download_into

    device, copier, staging = _staging()
    producer = device.stream(device.device)
    tensor = device.tensor(device.launch(producer, "make", lambda: np.arange(4, dtype=np.int32)), producer)
    tensor.to_numpy_fn = staging.to_numpy  # made by an instance with staging
    region = np.zeros(16, np.uint8)  # raw bytes, as a shared-memory region's view
    assert download_into(tensor, region) == 16
    assert region.view(np.int32).tolist() == [0, 1, 2, 3] and copier.allocated == []
    # without staging (the fake's own host copy), and a host tensor (no bytes off a device)
    plain = device.tensor(device.launch(producer, "make", lambda: np.ones(4, np.int32)), producer)
    assert download_into(plain, region) == 16 and region.view(np.int32).tolist() == [1, 1, 1, 1]
    host = DeviceTensor(np.full(4, 7, np.int32), np.dtype(np.int32), (4,))
    assert download_into(host, region) == 0 and region.view(np.int32).tolist() == [7] * 4
    with pytest.raises(ValueError, match="cannot take"):
        download_into(host, np.zeros(8, np.uint8))
