"""TensorRT backend (``tensorrt_plan`` platform, ``model.plan``). GPU only.

Before anything touches TensorRT, the CUDA driver is probed (``libcuda.so.1`` + ``cuInit``):
TensorRT's runtime created without CUDA crashes the process when asked to deserialize an
engine, so without a GPU the model fails to load with a message naming the model, the
backend and what is missing, and nothing else is disturbed. The full ``tensorrt`` package is
used when installed, else the lean runtime (``tensorrt_lean``), which can run engines.

Per instance: the engine deserialized once, one execution context and one CUDA stream, on the
instance's GPU (its primary context made current on the instance's thread). Tensors are bound
by name (``set_input_shape`` / ``set_tensor_address``, TensorRT 10's API); for dynamic shapes
the first optimization profile whose [min, max] range holds the request's shapes is selected.
Device buffers grow as needed and are reused. CUDA is driven through the driver API with
ctypes, so no CUDA Python package is needed.

Tensors stay on the device (flowserve/core/device.py) when a CUDA torch is there to own them:
a CUDA input from the node before is bound where it is (``set_tensor_address`` on its memory),
after the instance's stream waited on its producer's event; outputs are allocated as torch
tensors on the instance's GPU and handed on with an event recorded on the instance's stream,
with no synchronize. Host inputs are copied in through the instance's pinned staging
(flowserve/nodes/backends/staging.py: a reused pinned block, then an asynchronous copy on the
instance's stream; counted as bytes copied), and outputs read on the host come back through it.
Without torch the engine's outputs are copied back to numpy and the stream synchronised, as
before (pageable buffers).
"""

from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flowserve.core.device import Device, DeviceTensor, EdgeMap, edges, host_map, take, tensor_map
from flowserve.core.errors import InternalError, InvalidArgument, Unsupported
from flowserve.core.node import TensorMap
from flowserve.nodes.backends._support import gpu_count, model_file, no_gpu_reason, placement
from flowserve.nodes.backends.base import BackendNode

Shape = tuple[int, ...]
# per profile: input name -> (min shape, max shape)
Profiles = list[dict[str, tuple[Shape, Shape]]]


def fits(shape: Shape, low: Shape, high: Shape) -> bool:
    return len(shape) == len(low) == len(high) and all(
        lo <= s <= hi for s, lo, hi in zip(shape, low, high, strict=True)
    )


def select_profile(shapes: dict[str, Shape], profiles: Profiles) -> int:
    """Index of the first optimization profile that admits every input shape, else -1."""
    for index, profile in enumerate(profiles):
        if all(name not in profile or fits(shape, *profile[name]) for name, shape in shapes.items()):
            return index
    return -1


class CudaDriver:
    """The few CUDA driver calls the backend needs, through ctypes."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        self._lib = lib
        lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        lib.cuMemcpyHtoDAsync_v2.argtypes = [
            ctypes.c_uint64,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_void_p,
        ]
        lib.cuMemcpyDtoHAsync_v2.argtypes = [
            ctypes.c_void_p,
            ctypes.c_uint64,
            ctypes.c_size_t,
            ctypes.c_void_p,
        ]
        lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        lib.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        lib.cuDevicePrimaryCtxRelease_v2.argtypes = [ctypes.c_int]
        lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        self.check(lib.cuInit(0), "cuInit")

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise InternalError(f"CUDA driver call {what} failed with error {status}")

    def use_device(self, device: int) -> ctypes.c_void_p:
        """Retain ``device``'s primary context (once per instance: each retain counts, and
        :meth:`release_device` releases one) and make it current on the calling thread."""
        ctx = ctypes.c_void_p()
        self.check(self._lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain")
        self.set_current(ctx)
        return ctx

    def set_current(self, ctx: ctypes.c_void_p) -> None:
        """Make a retained context current on the calling thread (an instance's thread)."""
        self.check(self._lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def release_device(self, device: int) -> None:
        self._lib.cuDevicePrimaryCtxRelease_v2(device)

    def stream(self) -> ctypes.c_void_p:
        s = ctypes.c_void_p()
        self.check(self._lib.cuStreamCreate(ctypes.byref(s), 0), "cuStreamCreate")
        return s

    def destroy_stream(self, stream: ctypes.c_void_p) -> None:
        self._lib.cuStreamDestroy_v2(stream)

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self.check(self._lib.cuMemAlloc_v2(ctypes.byref(ptr), max(nbytes, 1)), "cuMemAlloc")
        return int(ptr.value)

    def free(self, ptr: int) -> None:
        self._lib.cuMemFree_v2(ptr)

    def to_device(self, dst: int, array: np.ndarray, stream: ctypes.c_void_p) -> None:
        self.check(
            self._lib.cuMemcpyHtoDAsync_v2(dst, array.ctypes.data, array.nbytes, stream), "cuMemcpyHtoDAsync"
        )

    def to_host(self, array: np.ndarray, src: int, stream: ctypes.c_void_p) -> None:
        self.check(
            self._lib.cuMemcpyDtoHAsync_v2(array.ctypes.data, src, array.nbytes, stream), "cuMemcpyDtoHAsync"
        )

    def sync(self, stream: ctypes.c_void_p) -> None:
        self.check(self._lib.cuStreamSynchronize(stream), "cuStreamSynchronize")


@dataclass
class TrtInstance:
    cuda: CudaDriver
    device: int
    engine: Any
    context: Any
    stream: ctypes.c_void_p
    inputs: list[str]
    outputs: list[str]
    dtypes: dict[str, np.dtype[Any]]
    profiles: Profiles
    profile: int = 0
    runtime: Any = None  # kept alive as long as its engine
    buffers: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (ptr, bytes)
    # with a CUDA torch: the device driver and a torch view of the instance's stream
    ops: Any = None
    torch_stream: Any = None
    staging: Any = None  # pinned staging (flowserve/nodes/backends/staging.py), with torch
    ctx: Any = None  # the device's primary context, retained once at load


# TensorRT's DataType names with a numpy type (what trt.nptype maps, by name: tensorrt_lean
# may not ship nptype)
_TRT_NUMPY = {
    "FLOAT": "float32",
    "HALF": "float16",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "UINT8": "uint8",
}


def numpy_dtype_of(trt: Any, dtype: Any, model: str, name: str) -> np.dtype[Any]:
    """The numpy dtype of a TensorRT tensor type: ``trt.nptype`` (float32, float16, int8,
    int32, int64, bool, uint8), bfloat16 as ``ml_dtypes.bfloat16`` (``nptype`` has no numpy
    type for it and raises TypeError); others (FP8, FP4, INT4) are a clear load error."""
    if dtype == getattr(getattr(trt, "DataType", None), "BF16", object()):
        import ml_dtypes

        bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
        return bf16
    try:
        nptype = getattr(trt, "nptype", None)
        if nptype is None:
            found: np.dtype[Any] = np.dtype(_TRT_NUMPY[str(getattr(dtype, "name", dtype))])
        else:
            found = np.dtype(nptype(dtype))
    except (TypeError, KeyError):
        raise Unsupported(
            f"model '{model}': engine tensor '{name}' is of TensorRT type {dtype}, which has no "
            "numpy type (and no Triton datatype)"
        ) from None
    return found


def import_tensorrt(model: str) -> Any:
    errors = []
    for name in ("tensorrt", "tensorrt_lean"):
        try:
            return importlib.import_module(name)
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    raise Unsupported(
        f"model '{model}': backend 'tensorrt' needs TensorRT's Python runtime ('tensorrt' or "
        f"'tensorrt_lean'), which cannot be imported here ({'; '.join(errors)}); install TensorRT "
        "for this machine's CUDA version (pip install 'flowserve[tensorrt]' on a GPU machine)"
    )


class TensorRTBackend(BackendNode):
    # takes DLPack tensors as they come and leaves its outputs on the GPU (core/device.py)
    device_tensors = True

    def load_instance(self, index: int) -> TrtInstance:
        model = self.model
        if gpu_count() == 0:  # before TensorRT is touched: its runtime crashes without CUDA
            raise Unsupported(
                f"model '{model.name}': backend 'tensorrt' runs only on an NVIDIA GPU, and there is "
                f"none here: {no_gpu_reason()}"
            )
        place = placement(model, index, "tensorrt")
        path = model_file(model, self.version_path, "model.plan")
        trt = import_tensorrt(model.name)
        cuda = CudaDriver()
        ctx = cuda.use_device(place.device)
        logger = trt.Logger(trt.Logger.WARNING)
        runtime = trt.Runtime(logger)
        engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if engine is None:
            raise InvalidArgument(
                f"model '{model.name}': TensorRT cannot deserialize {path} (built for another TensorRT "
                "version or GPU?)"
            )
        context = engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if n not in inputs]
        for n in inputs:
            if engine.is_shape_inference_io(n):
                raise Unsupported(f"model '{model.name}': shape tensor input '{n}' is not supported")
        dtypes = {n: numpy_dtype_of(trt, engine.get_tensor_dtype(n), model.name, n) for n in names}
        profiles: Profiles = []
        for p in range(engine.num_optimization_profiles):
            profile = {}
            for n in inputs:
                low, _opt, high = engine.get_tensor_profile_shape(n, p)
                profile[n] = (tuple(int(d) for d in low), tuple(int(d) for d in high))
            profiles.append(profile)
        self._check_names(inputs, outputs)
        stream = cuda.stream()
        if profiles:
            context.set_optimization_profile_async(0, stream.value or 0)
        instance = TrtInstance(
            cuda,
            place.device,
            engine,
            context,
            stream,
            inputs,
            outputs,
            dtypes,
            profiles,
            runtime=runtime,
            ctx=ctx,
        )
        from flowserve.nodes.backends.cuda import cuda_ops, staging_for

        ops = cuda_ops()
        if ops is not None:
            where = Device("cuda", place.device)
            instance.ops = ops
            instance.torch_stream = ops.external(int(stream.value or 0), where)
            instance.staging = staging_for(model, ops, where, instance.torch_stream)
        return instance

    def _check_names(self, inputs: list[str], outputs: list[str]) -> None:
        for what, configured, actual in (
            ("input", [t.name for t in self.model.inputs], inputs),
            ("output", [t.name for t in self.model.outputs], outputs),
        ):
            unknown = [n for n in configured if n not in actual]
            if unknown:
                raise InvalidArgument(
                    f"model '{self.model.name}': config {what}(s) {unknown} are not tensors of the "
                    f"engine, whose {what}s are {actual}"
                )

    def _buffer(self, instance: TrtInstance, name: str, nbytes: int) -> int:
        held = instance.buffers.get(name)
        if held is not None and held[1] >= nbytes:
            return held[0]
        if held is not None:
            instance.cuda.free(held[0])
        ptr = instance.cuda.alloc(nbytes)
        instance.buffers[name] = (ptr, nbytes)
        return ptr

    def execute(self, instance: TrtInstance, inputs: TensorMap) -> TensorMap:
        if instance.ops is not None:
            return tensor_map(self._execute_on_device(instance, edges(inputs)))
        inputs, copied = host_map(inputs)  # a CUDA tensor without torch to bind it: via the host
        if copied:
            self.stats.add_copied(copied)
        return self._execute_host(instance, inputs)

    def _select(self, instance: TrtInstance, shapes: dict[str, Shape]) -> None:
        if instance.profiles:
            chosen = select_profile(shapes, instance.profiles)
            if chosen < 0:
                raise InvalidArgument(
                    f"model '{self.model.name}': input shapes {shapes} fit no optimization profile of "
                    f"the engine ({instance.profiles})"
                )
            if chosen != instance.profile:
                instance.context.set_optimization_profile_async(chosen, instance.stream.value or 0)
                instance.profile = chosen

    def _execute_on_device(self, instance: TrtInstance, inputs: EdgeMap) -> EdgeMap:
        """Inputs bound where they are (CUDA) or copied in (host); outputs torch tensors on the
        instance's GPU with an event recorded on its stream; no synchronize."""
        import torch

        from flowserve.nodes.backends.cuda import cuda_tensor, torch_dtype, torch_tensor

        context, where = instance.context, Device("cuda", instance.device)
        instance.cuda.set_current(instance.ctx)
        self._select(instance, {n: tuple(int(d) for d in a.shape) for n, a in inputs.items()})
        held: list[Any] = []  # alive until the engine's work is queued
        copied = 0
        with torch.cuda.device(instance.device), torch.cuda.stream(instance.torch_stream):
            for name in instance.inputs:
                if name not in inputs:
                    raise InvalidArgument(f"model '{self.model.name}': engine input '{name}' is missing")
                value = inputs[name]
                if isinstance(value, DeviceTensor) and value.device == where:
                    tensor = torch_tensor(take(value, instance.torch_stream), torch).contiguous()
                    wanted_type = torch_dtype(torch, instance.dtypes[name])
                    if tensor.dtype != wanted_type:  # the engine reads its own type's bytes
                        tensor = tensor.to(wanted_type)  # on the instance's stream, as the host path's astype
                else:
                    array, n = value.host() if isinstance(value, DeviceTensor) else (value, 0)
                    if instance.staging is not None:
                        if array.dtype != instance.dtypes[name]:
                            array = array.astype(instance.dtypes[name])
                        tensor = instance.staging.upload(array)
                    else:
                        array = np.ascontiguousarray(array, dtype=instance.dtypes[name])
                        tensor = torch.from_numpy(array).to(f"cuda:{instance.device}", non_blocking=False)
                    copied += n + array.nbytes
                held.append(tensor)
                context.set_input_shape(name, tuple(tensor.shape))
                context.set_tensor_address(name, tensor.data_ptr())
            results: dict[str, Any] = {}
            for name in instance.outputs:
                shape = tuple(int(d) for d in context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise Unsupported(
                        f"model '{self.model.name}': output '{name}' has a data-dependent shape {shape}"
                    )
                dtype = torch_dtype(torch, instance.dtypes[name])  # BF16 included
                out = torch.empty(shape, dtype=dtype, device=f"cuda:{instance.device}")
                context.set_tensor_address(name, out.data_ptr())
                results[name] = out
            if not context.execute_async_v3(instance.stream.value or 0):
                raise InternalError(f"model '{self.model.name}': TensorRT execution failed")
        if copied:
            self.stats.add_copied(copied)
        wanted = [t.name for t in self.model.outputs] or instance.outputs
        to_numpy = instance.staging.to_numpy if instance.staging is not None else None
        stream = instance.torch_stream
        return {n: cuda_tensor(results[n], stream, instance.ops, where, to_numpy) for n in wanted}

    def _execute_host(self, instance: TrtInstance, inputs: TensorMap) -> TensorMap:
        cuda, context, stream = instance.cuda, instance.context, instance.stream
        cuda.set_current(instance.ctx)
        shapes = {n: tuple(int(d) for d in a.shape) for n, a in inputs.items()}
        self._select(instance, shapes)
        for name in instance.inputs:
            if name not in inputs:
                raise InvalidArgument(f"model '{self.model.name}': engine input '{name}' is missing")
            array = np.ascontiguousarray(inputs[name], dtype=instance.dtypes[name])
            context.set_input_shape(name, array.shape)
            ptr = self._buffer(instance, name, array.nbytes)
            cuda.to_device(ptr, array, stream)
            context.set_tensor_address(name, ptr)
        results: TensorMap = {}
        for name in instance.outputs:
            shape = tuple(int(d) for d in context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise Unsupported(
                    f"model '{self.model.name}': output '{name}' has a data-dependent shape {shape}"
                )
            host = np.empty(shape, dtype=instance.dtypes[name])
            ptr = self._buffer(instance, name, host.nbytes)
            context.set_tensor_address(name, ptr)
            results[name] = host
        if not context.execute_async_v3(stream.value or 0):
            raise InternalError(f"model '{self.model.name}': TensorRT execution failed")
        for name, host in results.items():
            cuda.to_host(host, instance.buffers[name][0], stream)
        cuda.sync(stream)
        wanted = [t.name for t in self.model.outputs] or instance.outputs
        return {n: results[n] for n in wanted}

    def unload_instance(self, instance: TrtInstance) -> None:
        if instance.ctx is not None:  # this thread's driver calls (free, destroy) need the context
            instance.cuda.set_current(instance.ctx)
        instance.cuda.sync(instance.stream)
        for ptr, _ in instance.buffers.values():
            instance.cuda.free(ptr)
        instance.buffers.clear()
        instance.context = None
        instance.engine = None
        instance.cuda.destroy_stream(instance.stream)
        instance.cuda.release_device(instance.device)
