"""The GPU-only code paths, run here without a GPU against fakes of the libraries they call:
which libcudart is loaded for CUDA IPC, the region's views (bfloat16 too), the stream a copy
between two GPUs must order, the device made current for torch's DLPack export, DALI's output
clones against its next run, TensorRT's retained context and its dtypes. The real device runs
the same paths in the ``gpu`` tests (test_device_gpu.py, test_staging_gpu.py)."""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from flowserve.core.device import Device, DeviceTensor, FakeBuffer, FakeDevice, numpy_dtype, produced
from flowserve.nodes.backends import cuda
from flowserve.nodes.backends.cuda import cuda_error, cudart_candidates, declare_ipc, for_peer_copy

GPU0, GPU1 = Device("cuda", 0), Device("cuda", 1)


# ----------------------------------------------------------------------------- libcudart


def _lib(tmp_path: Path, relative: str) -> Path:
    path = tmp_path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_the_runtime_torch_mapped_comes_first_and_the_dev_link_last(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    wheel12 = _lib(site, "nvidia/cuda_runtime/lib/libcudart.so.12")
    _lib(site, "nvidia/cu13/lib/libcudart.so.13")  # another CUDA's wheel beside it
    maps = (
        "7f0000-7f1000 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
        f"7f2000-7f3000 r-xp 00000000 08:01 43 {wheel12}\n"
        f"7f3000-7f4000 r--p 00010000 08:01 43 {wheel12}\n"
        "7f5000-7f6000 rw-p 00000000 00:00 0 \n"
    )
    found = cudart_candidates(maps, site / "torch" / "lib", site, "12.8")
    assert found[0] == str(wheel12)  # the one already in the process, once
    assert found.count(str(wheel12)) == 1
    assert not any(name.endswith("libcudart.so.13") and name.startswith("/") for name in found)
    assert found.index("libcudart.so.12") < found.index("libcudart.so.13") < found.index("libcudart.so")
    assert found[-1] == "libcudart.so"  # a toolkit's development link, never first


def test_without_a_mapped_runtime_the_wheels_of_torchs_cuda_are_tried(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    torch_lib = site / "torch" / "lib"
    bundled = _lib(torch_lib.parent, "lib/libcudart-1a2b3c.so.13")  # a build that ships its own
    wheel13 = _lib(site, "nvidia/cu13/lib/libcudart.so.13")
    found = cudart_candidates("", torch_lib, site, "13.0")
    assert found[:3] == [str(bundled), str(wheel13), "libcudart.so.13"]


def test_the_runtimes_error_text_is_declared_as_a_pointer() -> None:
    class Fn:
        argtypes: list[Any] = []
        restype: Any = None

        def __call__(self, status: int) -> bytes:
            return b"invalid argument"

    lib = SimpleNamespace(
        cudaIpcOpenMemHandle=Fn(), cudaIpcCloseMemHandle=Fn(), cudaGetErrorString=Fn(), cudaSetDevice=Fn()
    )
    declare_ipc(lib)
    assert lib.cudaSetDevice.argtypes == [ctypes.c_int] and lib.cudaSetDevice.restype is ctypes.c_int
    assert lib.cudaGetErrorString.restype is ctypes.c_char_p  # an int restype truncates a 64-bit pointer
    assert lib.cudaGetErrorString.argtypes == [ctypes.c_int]
    assert cuda_error(lib, 1) == "cudaError 1: invalid argument"
    assert cuda_error(SimpleNamespace(), 201) == "cudaError 201"


def test_a_handle_opens_on_its_device_and_a_failure_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    calls: list[tuple[Any, ...]] = []

    class Runtime:
        status = 0

        def cudaSetDevice(self, device: int) -> int:  # noqa: N802 (CUDA's name)
            calls.append(("set", device))
            return 0

        def cudaIpcOpenMemHandle(self, pointer: Any, handle: Any, flags: int) -> int:  # noqa: N802 (CUDA's name)
            calls.append(("open", ctypes.string_at(ctypes.addressof(handle), 64), flags))
            if not self.status:
                ctypes.cast(pointer, ctypes.POINTER(ctypes.c_void_p))[0] = 0x7000
            return self.status

        def cudaGetErrorString(self, status: int) -> bytes:  # noqa: N802 (CUDA's name)
            return b"invalid device context"

        def cudaIpcCloseMemHandle(self, pointer: Any) -> int:  # noqa: N802 (CUDA's name)
            calls.append(("close", pointer.value))
            return 0

        def cudaGetLastError(self) -> int:  # noqa: N802 (CUDA's name)
            calls.append(("last error",))
            return self.status

    runtime = Runtime()
    monkeypatch.setattr(cuda, "_cudart", lambda: runtime)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    handle = bytes(range(64))  # a NUL byte first: the struct goes whole
    region = cuda.IpcRegion(handle, 1, 4096)
    assert calls[:2] == [("set", 1), ("open", handle, 1)] and region.pointer == 0x7000
    region.close()
    assert calls[-1] == ("close", 0x7000) and region.pointer == 0
    runtime.status = 201
    with pytest.raises(
        RuntimeError, match=r"cudaIpcOpenMemHandle failed \(cudaError 201: invalid device context\)"
    ):
        cuda.IpcRegion(handle, 1, 4096)
    # the failure is cleared as the thread's last error, which torch reads after its next kernel
    assert calls[-1] == ("last error",) and ("last error",) not in calls[:-1]


def test_a_region_closed_while_a_tensor_views_it_is_unmapped_after_that_tensor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch = pytest.importorskip("torch")
    closed: list[int] = []

    class Runtime:
        def cudaSetDevice(self, device: int) -> int:  # noqa: N802 (CUDA's name)
            return 0

        def cudaIpcOpenMemHandle(self, pointer: Any, handle: Any, flags: int) -> int:  # noqa: N802 (CUDA's name)
            ctypes.cast(pointer, ctypes.POINTER(ctypes.c_void_p))[0] = 0x7000
            return 0

        def cudaIpcCloseMemHandle(self, pointer: Any) -> int:  # noqa: N802 (CUDA's name)
            closed.append(pointer.value)
            return 0

    monkeypatch.setattr(cuda, "_cudart", lambda: Runtime())
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    # torch holds the object whose __cuda_array_interface__ it views until the memory is freed
    monkeypatch.setattr(cuda._CudaView, "as_torch", lambda view, _torch: SimpleNamespace(held=view))
    region = cuda.IpcRegion(bytes(64), 0, 4096)
    tensor = region._bytes(16, 64)  # an input still on its way through a graph
    region.close()  # unregistered meanwhile
    assert closed == [] and region.pointer == 0
    with pytest.raises(RuntimeError, match="closed"):
        region._bytes(0, 8)
    del tensor
    assert closed == [0x7000]
    idle = cuda.IpcRegion(bytes(64), 0, 4096)
    idle.close()
    assert closed == [0x7000, 0x7000]  # nothing viewed it: unmapped at once


def test_torch_2_13s_version_3_handle_is_unwrapped() -> None:
    handle = bytes(range(64))
    assert cuda.raw_ipc_handle(b"\x03c" + handle) == handle


# ----------------------------------------------------------------------------- region views


class _HostRegion(cuda.IpcRegion):
    """An IpcRegion over host memory: ``_CudaView.as_torch`` replaced by a CPU view of the
    same pointer, so the real torch view code (bytes, then torch's dtype) runs here."""

    def __init__(self, buffer: np.ndarray) -> None:
        import torch

        self._buffer = buffer
        self.pointer = int(buffer.ctypes.data)
        self.byte_size = int(buffer.nbytes)
        self.device_id = 0
        self._torch = torch
        self._keeper = None


@pytest.fixture
def host_views(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    torch = pytest.importorskip("torch")
    seen: list[dict[str, Any]] = []

    def as_torch(view: Any, _torch: Any) -> Any:
        interface = view.__cuda_array_interface__
        seen.append(interface)
        (n,) = interface["shape"]
        pointer = interface["data"][0]
        raw = (ctypes.c_uint8 * n).from_address(pointer)
        return torch.from_numpy(np.frombuffer(raw, np.uint8))

    monkeypatch.setattr(cuda._CudaView, "as_torch", as_torch)
    yield seen


def test_a_region_is_viewed_as_bytes_then_as_torchs_dtype(host_views: list[dict[str, Any]]) -> None:
    import torch

    values = np.array([1.5, -2.0, 3.25, 0.5], dtype=ml_dtypes.bfloat16)
    buffer = np.zeros(64, np.uint8)
    buffer[8:16] = values.view(np.uint8)
    region = _HostRegion(buffer)
    tensor = region.tensor(8, 8, np.dtype(ml_dtypes.bfloat16), (2, 2))
    assert host_views[-1]["typestr"] == "|u1" and host_views[-1]["shape"] == (8,)
    assert tensor.value.dtype == torch.bfloat16 and tuple(tensor.value.shape) == (2, 2)
    assert tensor.value.float().flatten().tolist() == values.astype(np.float32).tolist()
    ints = region._view(0, 16, np.dtype(np.int32), (4,))
    assert ints.dtype == torch.int32 and ints.data_ptr() == buffer.ctypes.data


def test_a_misaligned_input_is_copied_and_an_output_is_written_as_bytes(
    host_views: list[dict[str, Any]],
) -> None:
    values = np.array([1.5, -2.0, 3.25], np.float32)
    buffer = np.zeros(64, np.uint8)
    buffer[5:17] = values.view(np.uint8)  # offset 5: no float32 starts on a multiple of 4
    region = _HostRegion(buffer)
    copied = region._view(5, 12, np.dtype(np.float32), (3,))
    assert copied.tolist() == values.tolist() and copied.data_ptr() % 4 == 0
    assert copied.data_ptr() != buffer.ctypes.data + 5  # its own memory, not the region's
    assert (
        region._view(8, 12, np.dtype(np.float32), (3,)).data_ptr() == buffer.ctypes.data + 8
    )  # aligned: a view
    region.write(33, np.array([7.0, 8.0], np.float32))
    assert buffer[33:41].view(np.float32).tolist() == [7.0, 8.0]
    assert region.read(33, 8) == np.array([7.0, 8.0], np.float32).tobytes()


# ----------------------------------------------------------------------------- copies between GPUs


def _on(device: FakeDevice, where: Device, data: np.ndarray) -> DeviceTensor:
    """A tensor produced on a stream of GPU ``where`` of the fake device."""
    stream = device.stream(where)
    buffer = device.upload(data, stream)
    out = produced(buffer, stream, device, buffer.dtype, buffer.shape, where)
    buffer.guard = out.event.number
    return out


def test_a_peer_copy_orders_the_source_gpus_current_stream() -> None:
    device = FakeDevice()
    tensor = _on(device, GPU1, np.arange(4, dtype=np.float32))
    for_peer_copy(tensor, device)
    (wait,) = device.ops("wait")
    assert wait[1] is device.current(GPU1) and wait[2] == tensor.event


class _FakeTorch:
    """What torch.py's GPU input path touches: ``Tensor``, ``from_dlpack``, ``cuda.device``."""

    def __init__(self) -> None:
        self.current: list[int] = []
        fake = self

        class Tensor:
            pass

        class _Cuda:
            @staticmethod
            @contextlib.contextmanager
            def device(index: int) -> Iterator[None]:
                fake.current.append(int(index))
                yield
                fake.current.pop()

        self.Tensor = Tensor
        self.cuda = _Cuda()
        self.exported: list[tuple[Any, list[int]]] = []

    def from_dlpack(self, value: Any) -> Any:
        self.exported.append((value, list(self.current)))
        return SimpleNamespace(to=lambda device, non_blocking: ("copied", value, device, non_blocking))


def test_torch_input_from_another_gpu_waits_on_that_gpus_stream() -> None:
    from flowserve.nodes.backends.torch import TorchBackend, TorchInstance

    device, torch = FakeDevice(), _FakeTorch()
    backend = TorchBackend.__new__(TorchBackend)
    backend._torch = torch
    mine = device.stream(GPU0)
    instance = TorchInstance(None, "cuda:0", mine, [0], True, GPU0, device)
    tensor = _on(device, GPU1, np.ones(3, np.float32))
    value, copied = backend._on_gpu(instance, "x", tensor)
    assert value[0] == "copied" and value[2] == "cuda:0" and copied == 12
    (wait,) = device.ops("wait")
    assert wait[1] is device.current(GPU1)  # not the instance's stream: torch copies on GPU 1's
    assert torch.exported == [(tensor.value, [1])]  # exported while GPU 1 was current


def test_ort_binds_a_gpu_tensor_while_its_gpu_is_current() -> None:
    from flowserve.nodes.backends._support import Placement
    from flowserve.nodes.backends.onnxruntime import OnnxRuntimeBackend, OrtInstance

    torch = _FakeTorch()
    seen: list[list[int]] = []
    ort = SimpleNamespace(
        OrtValue=SimpleNamespace(from_dlpack=lambda value: seen.append(list(torch.current)) or "ortvalue")
    )
    instance = OrtInstance(None, Placement("GPU", 1), [], frozenset(), True, SimpleNamespace(torch=torch))
    assert OnnxRuntimeBackend._on_device(ort, instance, object()) == "ortvalue"
    assert seen == [[1]] and torch.current == []


def test_a_pb_tensor_exports_while_its_gpu_is_current() -> None:
    from flowserve.nodes.backends.pb.tensor import Tensor

    torch = _FakeTorch()
    seen: list[list[int]] = []

    class Value:
        def __dlpack__(self, stream: Any = None) -> str:
            seen.append(list(torch.current))
            return "capsule"

        def __dlpack_device__(self) -> tuple[int, int]:
            return (2, 1)

    ops = SimpleNamespace(torch=torch, current=lambda where: None, wait=None, use=lambda v, s: None)
    tensor = Tensor._of_device("x", DeviceTensor(Value(), np.dtype(np.float32), (2,), GPU1, ops=ops))
    assert tensor.to_dlpack() == "capsule" and seen == [[1]]


def test_ort_outputs_flow_on_as_torch_tensors_a_batch_can_split() -> None:
    """An OrtValue has no rows to cut (``value[a:b]``: a merged batch's split) nor a reshape;
    the torch view of it has both, over the same memory; bool stays bool."""
    torch = pytest.importorskip("torch")
    ort = pytest.importorskip("onnxruntime")
    from flowserve.core.device import wrap
    from flowserve.nodes.backends.onnxruntime import as_torch

    floats = np.arange(6, dtype=np.float32).reshape(3, 2)
    flags = np.array([[True], [False], [True]])
    values = [ort.OrtValue.ortvalue_from_numpy(floats), ort.OrtValue.ortvalue_from_numpy(flags)]
    with pytest.raises(TypeError):
        wrap(values[0])[1:3]  # what a batch's split did to an OrtValue
    tensors = as_torch(torch, values)
    assert tensors[0].data_ptr() == values[0].data_ptr()  # a view, no copy
    assert tensors[1].dtype == torch.bool
    rows = wrap(tensors[0])[1:3]
    assert rows.shape == (2, 2) and rows.value.tolist() == floats[1:3].tolist()
    assert wrap(tensors[1]).dtype == np.bool_


# ----------------------------------------------------------------------------- DALI


def test_dalis_next_run_waits_for_the_last_runs_clones(monkeypatch: pytest.MonkeyPatch) -> None:
    from flowserve.nodes.backends._support import Placement
    from flowserve.nodes.backends.dali import DaliBackend, DaliInstance

    device = FakeDevice()
    stream = device.stream(GPU0)

    class TensorListGPU:  # no as_array: a GPU output
        pass

    class Pipeline:
        def feed_input(self, name: str, data: Any) -> None:
            pass

        def run(self) -> list[Any]:
            device.log.append(("run",))
            return [TensorListGPU()]

    backend = DaliBackend.__new__(DaliBackend)
    backend.model = SimpleNamespace(name="m", max_batch_size=0, outputs=[SimpleNamespace(name="y")])

    def clone(instance: Any, name: str, tensor_list: Any, batched: bool) -> str:
        device.log.append(("clone", instance.stream))
        return "y"

    monkeypatch.setattr(backend, "_on_device", clone)
    instance = DaliInstance(Pipeline(), Placement("GPU", 0), device, stream)
    backend.execute(instance, {})
    backend.execute(instance, {})
    kinds = [entry[0] for entry in device.log]
    assert kinds == ["run", "clone", "record", "host_wait", "run", "clone", "record"]
    assert device.log[3][1] == device.log[2][2]  # the second run waited for the first clones' event


def test_a_dali_tensor_comes_to_the_host_whether_a_list_or_one_tensor() -> None:
    class TensorCPU:  # DALI's: the array interface, no as_array
        def __init__(self, data: np.ndarray) -> None:
            self.__array_interface__ = data.__array_interface__
            self._data = data

    data = np.arange(6, dtype=np.int16).reshape(2, 3)
    one = SimpleNamespace(as_cpu=lambda: TensorCPU(data))
    many = SimpleNamespace(as_cpu=lambda: SimpleNamespace(as_array=lambda: data))
    for value in (one, many):
        host = cuda.cuda_to_numpy(value)
        np.testing.assert_array_equal(host, data)
        assert not np.shares_memory(host, data)


# ----------------------------------------------------------------------------- TensorRT


class _Trt:
    """``tensorrt``'s dtype surface: ``nptype`` raises TypeError for BF16 and FP8, as TRT 10's."""

    class DataType:
        FLOAT, HALF, BF16, FP8 = "FLOAT", "HALF", "BF16", "FP8"

    @staticmethod
    def nptype(dtype: str) -> Any:
        known = {"FLOAT": np.float32, "HALF": np.float16}
        if dtype not in known:
            raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")
        return known[dtype]


def test_tensorrt_dtypes_bfloat16_and_a_clear_refusal() -> None:
    from flowserve.core.errors import Unsupported
    from flowserve.nodes.backends.tensorrt import numpy_dtype_of

    assert numpy_dtype_of(_Trt, "FLOAT", "m", "x") == np.float32
    assert numpy_dtype_of(_Trt, "BF16", "m", "x") == np.dtype(ml_dtypes.bfloat16)
    with pytest.raises(Unsupported, match=r"model 'm': engine tensor 'x' is of TensorRT type FP8"):
        numpy_dtype_of(_Trt, "FP8", "m", "x")
    lean = SimpleNamespace(DataType=_Trt.DataType)  # a runtime without nptype: by the type's name
    assert numpy_dtype_of(lean, SimpleNamespace(name="INT64"), "m", "x") == np.int64
    with pytest.raises(Unsupported):
        numpy_dtype_of(lean, SimpleNamespace(name="FP8"), "m", "x")


def test_tensorrt_retains_its_context_once_and_makes_it_current_per_call() -> None:
    from flowserve.nodes.backends.tensorrt import TensorRTBackend, TrtInstance

    calls: list[tuple[Any, ...]] = []

    class Driver:
        def use_device(self, device: int) -> str:
            calls.append(("retain", device))
            return "ctx"

        def set_current(self, ctx: Any) -> None:
            calls.append(("current", ctx))

        def alloc(self, nbytes: int) -> int:
            return 0x1000 * (len(calls) + 1)

        def to_device(self, dst: int, array: np.ndarray, stream: Any) -> None:
            calls.append(("h2d", int(array.nbytes)))

        def to_host(self, array: np.ndarray, src: int, stream: Any) -> None:
            array[...] = 7
            calls.append(("d2h", int(array.nbytes)))

        def sync(self, stream: Any) -> None:
            calls.append(("sync",))

    class Context:
        def set_input_shape(self, name: str, shape: Any) -> None:
            self.shape = tuple(shape)

        def set_tensor_address(self, name: str, ptr: int) -> None:
            pass

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return self.shape

        def execute_async_v3(self, stream: int) -> bool:
            calls.append(("execute", stream))
            return True

    backend = TensorRTBackend.__new__(TensorRTBackend)
    backend.model = SimpleNamespace(name="m", outputs=[SimpleNamespace(name="y")])
    dtypes = {"x": np.dtype(np.float32), "y": np.dtype(np.float32)}
    stream = ctypes.c_void_p(0x55)
    instance = TrtInstance(Driver(), 0, None, Context(), stream, ["x"], ["y"], dtypes, [], ctx="ctx")  # type: ignore[arg-type]
    for _ in range(2):
        out = backend._execute_host(instance, {"x": np.ones((2, 3), np.float64)})
        assert out["y"].dtype == np.float32 and np.all(out["y"] == 7)
    assert ("retain", 0) not in calls  # retained once, at load: every retain needs its release
    assert calls.count(("current", "ctx")) == 2 and calls.count(("execute", 0x55)) == 2


# ----------------------------------------------------------------------------- torch.export on a device


def test_an_exported_programs_own_tensors_move_with_it(tmp_path: Path) -> None:
    """A factory call in forward (``torch.ones``) is exported with ``device=cpu``; loaded for
    another device (here ``meta``, which needs no GPU), the program still runs there."""
    torch = pytest.importorskip("torch")
    from flowserve.nodes.backends.torch import load_exported

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("bias", torch.ones(4))

        def forward(self, x: Any) -> Any:
            return x + self.bias + torch.ones(4)

    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(Net(), (torch.zeros(4),)), str(path))
    with pytest.raises(RuntimeError):  # what loading did before: the graph's ones() stay on the CPU
        torch.export.load(str(path)).module().to("meta")(torch.zeros(4, device="meta"))
    module = load_exported(torch, path, torch.device("meta"))
    assert module(torch.zeros(4, device="meta")).device.type == "meta"
    on_cpu = load_exported(torch, path, torch.device("cpu"))
    assert on_cpu(torch.zeros(4)).tolist() == [2.0] * 4


# ----------------------------------------------------------------------------- dtypes


def test_onnx_runtimes_bfloat16_type_name() -> None:
    assert numpy_dtype("tensor(bfloat16)") == np.dtype(ml_dtypes.bfloat16)
    assert numpy_dtype("tensor(float)") == np.float32
    assert numpy_dtype("torch.bfloat16") == np.dtype(ml_dtypes.bfloat16)


def test_fake_buffers_are_what_the_fakes_above_order() -> None:
    device = FakeDevice()
    tensor = _on(device, GPU1, np.zeros(2, np.float32))
    assert isinstance(tensor.value, FakeBuffer) and tensor.device == GPU1
