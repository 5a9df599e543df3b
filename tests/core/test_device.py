"""The device abstraction: where a tensor lives, host views vs copies, and the ordering rule
against the fake device (which refuses a read on another stream without an event wait)."""

from __future__ import annotations

import numpy as np
import pytest

from flowserve.core.device import (
    CPU,
    Device,
    DeviceTensor,
    FakeDevice,
    OrderingError,
    device_of,
    host_map,
    take,
    to_host,
    wrap,
)


def test_numpy_is_on_the_cpu_and_needs_no_copy() -> None:
    x = np.arange(4, dtype=np.float32)
    assert device_of(x) == CPU
    same, copied = to_host(x)
    assert same is x and copied == 0


def test_a_cpu_torch_tensor_is_viewed_not_copied() -> None:
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    tensor = wrap(t)
    assert (tensor.dtype, tensor.shape, tensor.device) == (np.dtype(np.float32), (2, 3), CPU)
    array, copied = tensor.host()
    assert copied == 0
    assert array.ctypes.data == t.data_ptr()  # the same memory
    np.testing.assert_array_equal(array, t.numpy())
    # rows of it (a batch's split) are views of the framework's tensor
    rows = tensor[1:]
    assert rows.shape == (1, 3) and rows.value.data_ptr() == t[1:].data_ptr()


def test_an_ortvalue_is_described_without_its_framework() -> None:
    ort = pytest.importorskip("onnxruntime")
    x = np.ones((2, 5), np.float32)
    tensor = wrap(ort.OrtValue.ortvalue_from_numpy(x))
    assert (tensor.dtype, tensor.shape, tensor.device) == (np.dtype(np.float32), (2, 5), CPU)
    array, copied = tensor.host()
    assert copied == 0 and array.ctypes.data == x.ctypes.data


def test_take_on_the_producing_stream_needs_no_wait() -> None:
    dev = FakeDevice()
    s = dev.stream(dev.device)
    out = dev.tensor(dev.upload(np.ones(3, np.float32), s), s)
    assert take(out, s) is out.value
    assert dev.ops("wait") == []


def test_take_on_another_stream_waits_on_the_producers_event() -> None:
    dev = FakeDevice()
    a, b = dev.stream(dev.device), dev.stream(dev.device)
    out = dev.tensor(dev.upload(np.ones(3, np.float32), a), a)
    take(out, b)
    assert dev.ops("wait") == [("wait", b, out.event)]
    # the wait comes before the read, and the read is allowed
    kinds = [entry[0] for entry in dev.log]
    assert kinds.index("wait") < kinds.index("read")


def test_the_fake_refuses_a_read_on_another_stream_without_a_wait() -> None:
    dev = FakeDevice()
    a, b = dev.stream(dev.device), dev.stream(dev.device)
    out = dev.tensor(dev.upload(np.ones(3, np.float32), a), a)
    with pytest.raises(OrderingError, match="without waiting"):
        dev.use(out.value, b)
    # a wait on an unrelated event does not order it either
    other = dev.tensor(dev.upload(np.ones(1, np.float32), a), a)
    dev.wait(b, other.event)
    with pytest.raises(OrderingError):
        dev.use(out.value, b)


def test_a_host_copy_waits_for_the_event_only_and_counts_its_bytes() -> None:
    dev = FakeDevice()
    s = dev.stream(dev.device)
    x = np.arange(10, dtype=np.float32)
    out = dev.tensor(dev.upload(x, s), s)
    array, copied = to_host(out)
    np.testing.assert_array_equal(array, x)
    assert copied == x.nbytes
    assert dev.ops("host_wait") == [("host_wait", out.event)]  # this event, not the device
    assert dev.ops("to_host") == [("to_host", x.nbytes)]
    mixed, total = host_map({"a": x, "b": out})
    assert mixed["a"] is x and total == x.nbytes


def test_views_of_a_device_tensor_keep_its_ordering() -> None:
    dev = FakeDevice()
    a, b = dev.stream(dev.device), dev.stream(dev.device)
    out = dev.tensor(dev.upload(np.zeros((4, 2), np.float32), a), a)
    part = out[2:]
    assert isinstance(part, DeviceTensor) and part.shape == (2, 2) and part.event is out.event
    take(part, b)  # waits on the producer's event, so the read is allowed
    assert part.reshape(4).shape == (4,)
    assert Device("cuda", 1) != dev.device and str(dev.device) == "cuda:0"
