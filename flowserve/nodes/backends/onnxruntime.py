"""ONNX Runtime backend (``onnxruntime_onnx`` platform, ``model.onnx``).

One ``InferenceSession`` per instance. The CPU execution provider always; the CUDA (and, when
``optimization.execution_accelerators.gpu_execution_accelerator`` names ``tensorrt``, the
TensorRT) execution provider only when the instance is placed on a GPU, which needs a GPU to
be present *and* onnxruntime-gpu's providers to be available: onnxruntime-gpu on a machine
without CUDA logs loud errors when asked, so it is never asked there. After the session is
made, ``get_providers()`` is what counts (a provider that failed to load falls back to CPU).

Tensors stay where they are (flowserve/core/device.py). On the CPU, numpy inputs go to
``session.run`` (ONNX Runtime reads contiguous numpy in place) and DLPack inputs (a torch
tensor from the node before) are bound as ``OrtValue.from_dlpack`` views through I/O binding;
outputs are numpy views of ONNX Runtime's buffers. On a GPU (CUDA EP) each instance owns a CUDA
stream handed to ONNX Runtime as ``user_compute_stream``: device inputs are bound where they
are after the instance's stream waited on their producer's event, host inputs are copied in
through the instance's pinned staging (flowserve/nodes/backends/staging.py: a pinned block, then
an asynchronous copy on the instance's stream; counted as bytes copied), outputs stay on the
device (ONNX Runtime's OrtValues seen as torch tensors through DLPack and copied on the
instance's stream into torch's memory, whose lifetime across streams torch tracks; a batch can
split them by rows) with an event recorded on the stream (read on the host through the same staging), and
the run does not synchronise the device (``disable_synchronize_execution_providers``).
Without a CUDA torch to make streams and events, a GPU instance copies its outputs back as
before. Session options come from config ``parameters`` with Triton's ORT backend names:
``intra_op_thread_count``, ``inter_op_thread_count``, ``execution_mode`` (0 sequential,
1 parallel), ``enable_mem_arena``, ``enable_mem_pattern``, any ``session.*`` config entry, and
``optimization { graph { level } }`` (-1 basic, 1 extended, else all). Without
``intra_op_thread_count``, a process held to fewer CPUs than the machine has (``--cpu-affinity
spread``, taskset, a container's cpuset) runs one intra-op thread per CPU it may use
(:func:`held_threads`), not ONNX Runtime's one per core of the machine.

ONNX Runtime's intra-op threads spin while they wait for work (its default, kept): on a quiet
machine that is faster (compare.py's ``mlp_onnx`` at c=8: 0.80x over gRPC and 0.95x over HTTP with
spinning off), on a machine whose cores are shared it is slower (a conv net in-process under load:
1.5-1.7x faster with spinning off); ``parameters { key: "session.intra_op.allow_spinning" value:
{ string_value: "0" } }`` turns it off (docs/reference/performance.md).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from flowserve.core.device import Device, DeviceTensor, EdgeMap, edges, take, tensor_map
from flowserve.core.errors import InvalidArgument, Unsupported
from flowserve.core.node import TensorMap
from flowserve.nodes.backends._support import Parameters, Placement, model_file, placement, require
from flowserve.nodes.backends.base import BackendNode

log = logging.getLogger("flowserve.onnxruntime")

GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")


@dataclass
class OrtInstance:
    session: Any
    place: Placement
    outputs: list[str]
    string_inputs: frozenset[str]
    io_binding: bool
    # on a GPU with a CUDA torch: the device driver, the instance's stream, and run options
    # that leave the outputs on the device without synchronising it
    ops: Any = None
    stream: Any = None
    run_options: Any = None
    staging: Any = None  # pinned staging for host inputs and outputs read on the host


def held_threads(allowed: int | None = None, machine: int | None = None) -> int | None:
    """The intra-op thread count for a process held to fewer CPUs than the machine has
    (``--cpu-affinity spread``, taskset, a container's cpuset): one per CPU it may use. None
    (ONNX Runtime's own default, a thread per physical core of the machine) otherwise.
    ONNX Runtime sizes its pool from the machine, not the process's CPUs: on one CPU of two
    its two spinning threads ran a 4-layer MLP 2.9x slower than unpinned."""
    if allowed is None:
        allowed = len(os.sched_getaffinity(0))
    if machine is None:
        machine = os.cpu_count() or allowed
    return allowed if 0 < allowed < machine else None


def session_options(ort: Any, model: Any, params: Parameters) -> Any:
    opts = ort.SessionOptions()
    opts.log_severity_level = params.integer("log_severity_level", 3)
    if params.has("intra_op_thread_count"):
        opts.intra_op_num_threads = params.integer("intra_op_thread_count", 0)
    else:
        threads = held_threads()
        if threads is not None:
            opts.intra_op_num_threads = threads
    if params.has("inter_op_thread_count"):
        opts.inter_op_num_threads = params.integer("inter_op_thread_count", 0)
    if params.has("execution_mode"):
        mode = params.integer("execution_mode", 0)
        opts.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL if mode == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
        )
    if params.has("enable_mem_arena"):
        opts.enable_cpu_mem_arena = params.flag("enable_mem_arena", True)
    if params.has("enable_mem_pattern"):
        opts.enable_mem_pattern = params.flag("enable_mem_pattern", True)
    for key, value in params.prefixed("session.").items():
        opts.add_session_config_entry(key, value)
    config = model.config
    if config is not None and config.HasField("optimization") and config.optimization.HasField("graph"):
        level = int(config.optimization.graph.level)
        levels = ort.GraphOptimizationLevel
        opts.graph_optimization_level = {-1: levels.ORT_ENABLE_BASIC, 1: levels.ORT_ENABLE_EXTENDED}.get(
            level, levels.ORT_ENABLE_ALL
        )
    return opts


def providers_for(ort: Any, model: Any, place: Placement, stream: int = 0) -> list[Any]:
    """Execution providers to ask for, most preferred first (CPU always last). ``stream``: a
    ``cudaStream_t`` (as an int) the CUDA provider runs on (``user_compute_stream``)."""
    cpu: list[Any] = ["CPUExecutionProvider"]
    if not place.gpu:
        return cpu
    available = set(ort.get_available_providers())
    if "CUDAExecutionProvider" not in available:
        if place.required:
            raise Unsupported(
                f"model '{model.name}': KIND_GPU needs onnxruntime's CUDA execution provider, which "
                f"this onnxruntime does not have (providers: {sorted(available)}); install onnxruntime-gpu"
            )
        return cpu
    chosen: list[Any] = []
    if "TensorrtExecutionProvider" in available and _wants_tensorrt(model):
        # on the instance's stream too: runs do not synchronize the providers, so nodes the
        # TensorRT provider takes must be ordered with the outputs read on that stream
        chosen.append(("TensorrtExecutionProvider", cuda_options(place.device, stream)))
    chosen.append(("CUDAExecutionProvider", cuda_options(place.device, stream)))
    return chosen + cpu


def cuda_options(device: int, stream: int = 0) -> dict[str, Any]:
    """The CUDA execution provider's options: its device and, when given, the instance's own
    stream (``user_compute_stream``; ONNX Runtime refuses stream 0, the legacy default)."""
    options: dict[str, Any] = {"device_id": device}
    if stream:
        options["has_user_compute_stream"] = "1"
        options["user_compute_stream"] = str(stream)
    return options


def _wants_tensorrt(model: Any) -> bool:
    config = model.config
    if config is None or not config.HasField("optimization"):
        return False
    accel = config.optimization.execution_accelerators.gpu_execution_accelerator
    return any(a.name.lower() == "tensorrt" for a in accel)


def _to_ort(array: np.ndarray) -> np.ndarray:
    """BYTES (object arrays of bytes) -> object arrays of str, as ORT's string tensors want."""
    flat = [v.decode("utf-8") if isinstance(v, bytes | bytearray) else str(v) for v in array.reshape(-1)]
    return np.array(flat, dtype=object).reshape(array.shape)


def _from_ort(array: Any) -> np.ndarray:
    out = np.asarray(array)
    if out.dtype.kind in "OU":
        flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in out.reshape(-1)]
        out = np.array(flat, dtype=object).reshape(out.shape)
    return out


def as_torch(torch: Any, values: list[Any]) -> list[Any]:
    """OrtValues as torch tensors over the same memory (DLPack, no copy; each keeps its OrtValue
    alive). What flows on from a GPU instance: a merged batch is split by rows and an output may
    be reshaped, which an OrtValue cannot be (it has no ``__getitem__`` nor ``reshape``), and a
    torch tensor merges on the device. A bool output that DLPack carried as uint8 is bool again."""
    out = []
    for value in values:
        tensor = torch.from_dlpack(value)
        if tensor.dtype == torch.uint8 and value.data_type() == "tensor(bool)":
            tensor = tensor.view(torch.bool)
        out.append(tensor)
    return out


class OnnxRuntimeBackend(BackendNode):
    # takes DLPack tensors as they come (flowserve/core/device.py)
    device_tensors = True

    def load_instance(self, index: int) -> OrtInstance:
        model = self.model
        ort = require("onnxruntime", model.name, "onnxruntime", "onnx")
        path = model_file(model, self.version_path, "model.onnx")
        if path.is_dir():
            path = path / "model.onnx"
        place = placement(model, index, "onnxruntime")
        params = Parameters(model)
        ops, stream = self._stream(place)
        providers = providers_for(ort, model, place, int(stream.cuda_stream) if stream is not None else 0)
        try:
            session = ort.InferenceSession(
                str(path), sess_options=session_options(ort, model, params), providers=providers
            )
        except Exception as exc:
            raise InvalidArgument(f"model '{model.name}': onnxruntime cannot load {path}: {exc}") from None
        active = session.get_providers()
        on_gpu = any(p in active for p in GPU_PROVIDERS)
        if place.gpu and not on_gpu:
            if place.required:
                raise Unsupported(
                    f"model '{model.name}': KIND_GPU asked for, but onnxruntime fell back to {active} "
                    "(CUDA provider failed to load)"
                )
            log.warning("model '%s': GPU providers failed to load; running on %s", model.name, active)
        names_in = {i.name: i.type for i in session.get_inputs()}
        names_out = [o.name for o in session.get_outputs()]
        self._check_names("input", [t.name for t in model.inputs], list(names_in))
        self._check_names("output", [t.name for t in model.outputs], names_out)
        outputs = [t.name for t in model.outputs] or names_out
        strings = frozenset(n for n, typ in names_in.items() if typ == "tensor(string)")
        if not on_gpu:
            return OrtInstance(session, Placement("CPU"), outputs, strings, False)
        run_options = staging = None
        if ops is not None:
            from flowserve.nodes.backends.cuda import staging_for

            run_options = ort.RunOptions()
            run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
            staging = staging_for(model, ops, Device("cuda", place.device), stream)
        return OrtInstance(session, place, outputs, strings, True, ops, stream, run_options, staging)

    def _stream(self, place: Placement) -> tuple[Any, Any]:
        """(device driver, a new stream) for a GPU instance when a CUDA torch makes them."""
        if not place.gpu:
            return None, None
        from flowserve.nodes.backends.cuda import cuda_ops

        ops = cuda_ops()
        if ops is None:
            return None, None
        ort = self._ort()
        if not (hasattr(ort.OrtValue, "from_dlpack") and hasattr(ort.OrtValue, "__dlpack__")):
            log.warning(
                "model '%s': onnxruntime %s has no OrtValue.from_dlpack (1.26 and later do): its GPU "
                "instances copy inputs and outputs through host memory",
                self.model.name,
                getattr(ort, "__version__", "?"),
            )
            return None, None
        return ops, ops.stream(Device("cuda", place.device))

    def _check_names(self, what: str, configured: list[str], actual: list[str]) -> None:
        unknown = [n for n in configured if n not in actual]
        if unknown:
            raise InvalidArgument(
                f"model '{self.model.name}': config {what}(s) {unknown} not found in the ONNX model, "
                f"whose {what}s are {actual}"
            )

    def execute(self, instance: OrtInstance, inputs: TensorMap) -> TensorMap:
        if instance.io_binding:
            return tensor_map(self._execute_gpu(instance, edges(inputs)))
        for value in inputs.values():
            if type(value) is not np.ndarray:
                return self._execute_bound(instance, edges(inputs))
        feed = {
            name: _to_ort(array) if name in instance.string_inputs else array
            for name, array in inputs.items()
        }
        results = instance.session.run(instance.outputs, feed)
        return {name: _from_ort(value) for name, value in zip(instance.outputs, results, strict=True)}

    def _execute_bound(self, instance: OrtInstance, inputs: EdgeMap) -> TensorMap:
        """CPU, with DLPack inputs: each bound as an OrtValue over its own memory (no copy);
        a device tensor (a CPU instance fed from a GPU) is copied to the host first."""
        ort = self._ort()
        binding = instance.session.io_binding()
        copied = 0
        for name, value in inputs.items():
            if isinstance(value, DeviceTensor) and value.device.is_cpu and name not in instance.string_inputs:
                binding.bind_ortvalue_input(name, ort.OrtValue.from_dlpack(value.value))
                continue
            array, n = value.host() if isinstance(value, DeviceTensor) else (value, 0)
            copied += n
            binding.bind_cpu_input(name, _to_ort(array) if name in instance.string_inputs else array)
        for name in instance.outputs:
            binding.bind_output(name, "cpu")
        instance.session.run_with_iobinding(binding)
        if copied:
            self.stats.add_copied(copied)
        results = binding.get_outputs()
        return {name: _from_ort(value.numpy()) for name, value in zip(instance.outputs, results, strict=True)}

    def _execute_gpu(self, instance: OrtInstance, inputs: EdgeMap) -> EdgeMap:
        """CUDA EP with I/O binding: device inputs bound in place once the instance's stream
        waited on their producers; outputs left on the device (or, without a stream of our
        own to order them, copied back as before)."""
        ort = self._ort()
        session = instance.session
        binding = session.io_binding()
        device = instance.place.device
        where = Device("cuda", device)
        stream = instance.stream
        copied = 0
        for name, value in inputs.items():
            if isinstance(value, DeviceTensor) and value.device == where and stream is not None:
                binding.bind_ortvalue_input(name, self._on_device(ort, instance, take(value, stream)))
                continue
            array, n = value.host() if isinstance(value, DeviceTensor) else (value, 0)
            if name in instance.string_inputs:
                array = _to_ort(array)
            else:
                copied += n + array.nbytes  # to the host (if it was elsewhere), then to the GPU
                if instance.staging is not None and not array.dtype.hasobject:
                    # through a pinned block, asynchronously on the instance's stream (ORT's)
                    uploaded = instance.staging.upload(array)
                    binding.bind_ortvalue_input(name, self._on_device(ort, instance, uploaded))
                    continue
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in instance.outputs:
            binding.bind_output(name, "cuda", device)
        if instance.run_options is not None:
            session.run_with_iobinding(binding, instance.run_options)
        else:
            session.run_with_iobinding(binding)
        if stream is None:
            results = binding.copy_outputs_to_cpu()
            self.stats.add_copied(copied + sum(int(r.nbytes) for r in results))
            return {name: _from_ort(value) for name, value in zip(instance.outputs, results, strict=True)}
        from flowserve.nodes.backends.cuda import cuda_tensor

        if copied:
            self.stats.add_copied(copied)
        torch = instance.ops.torch
        with torch.cuda.device(device), torch.cuda.stream(stream):
            # copied (device to device) into torch's caching allocator on ORT's stream: ONNX
            # Runtime's arena may give an output's memory to its next run as soon as the OrtValue
            # goes, while a consumer on another stream still reads it, and record_stream does not
            # reach memory torch did not allocate; the copy is ordered before that next run
            outputs = [value.clone() for value in as_torch(torch, binding.get_outputs())]
        to_numpy = instance.staging.to_numpy if instance.staging is not None else None
        return {
            name: cuda_tensor(value, stream, instance.ops, where, to_numpy)
            for name, value in zip(instance.outputs, outputs, strict=True)
        }

    @staticmethod
    def _on_device(ort: Any, instance: OrtInstance, value: Any) -> Any:
        """An OrtValue over a tensor on the instance's GPU (no copy). ``OrtValue.from_dlpack``
        calls ``value.__dlpack__()``, which torch refuses for a tensor of another GPU than the
        current one ("Can't export tensors on a different CUDA device index"): the instance's
        GPU is made current around it."""
        with instance.ops.torch.cuda.device(instance.place.device):
            return ort.OrtValue.from_dlpack(value)

    def _ort(self) -> Any:
        return require("onnxruntime", self.model.name, "onnxruntime", "onnx")
