"""OpenVINO backend (``backend: "openvino"``): an IR (``model.xml`` + ``model.bin``) or any
file OpenVINO reads (an ONNX ``model.onnx`` named by ``default_model_filename``, or found when
``model.xml`` is absent).

Each instance compiles its own model and owns one infer request. Config ``parameters``:

- device: ``TARGET_DEVICE`` (or ``DEVICE``); default ``CPU``, or ``GPU`` for a ``KIND_GPU``
  instance group. Any OpenVINO device name is passed through (``GPU.1``, ``NPU``, ``AUTO``,
  ``HETERO:GPU,CPU``...), after a check that the physical device exists here.
- compile properties, as OpenVINO names them: ``PERFORMANCE_HINT`` (LATENCY, THROUGHPUT,
  CUMULATIVE_THROUGHPUT), ``NUM_STREAMS``, ``INFERENCE_NUM_THREADS``, ``INFERENCE_PRECISION_HINT``
  (``bf16`` on CPUs that have it, ``f16``, ``f32``), ``EXECUTION_MODE_HINT``, ``CACHE_DIR`` and
  any other property the device lists as settable. Triton's older names work too:
  ``CPU_THROUGHPUT_STREAMS``, ``CPU_THREADS_NUM``, ``ENFORCE_BF16``/``HINT_BF16`` = YES.
- ``CPU_EXTENSION_PATH``: a custom-operation library to add before reading the model.
- batching: with ``max_batch_size > 0`` a static first dimension is made dynamic, unless
  ``SKIP_OV_DYNAMIC_BATCHSIZE`` is YES; ``RESHAPE_IO_LAYERS`` YES reshapes every input to the
  config's dims (-1 stays dynamic).

Auto-complete reads inputs, outputs, dtypes and dims from the model (names: each tensor's first
name) with Triton's batching rule.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from flowserve.core.errors import InternalError, InvalidArgument, Unsupported
from flowserve.core.node import TensorMap
from flowserve.nodes.backends._support import Parameters, require
from flowserve.nodes.backends.autocomplete import completion
from flowserve.nodes.backends.base import BackendNode
from flowserve.spec.model_config import ModelConfig
from flowserve.spec.schema import ModelSpec, TensorSpec
from flowserve.spec.triton import DEFAULT_FILENAMES, Completion

IR_FILE = DEFAULT_FILENAMES["openvino"]
ONNX_FILE = "model.onnx"
VIRTUAL_DEVICES = ("AUTO", "MULTI", "HETERO", "BATCH")

# OpenVINO element type names -> Triton datatypes
OV_DATATYPES: dict[str, str] = {
    "f32": "FP32",
    "f16": "FP16",
    "f64": "FP64",
    "bf16": "BF16",
    "i8": "INT8",
    "i16": "INT16",
    "i32": "INT32",
    "i64": "INT64",
    "u8": "UINT8",
    "u16": "UINT16",
    "u32": "UINT32",
    "u64": "UINT64",
    "boolean": "BOOL",
    "string": "BYTES",
}
# properties read from parameters whatever the device reports
PROPERTIES = (
    "PERFORMANCE_HINT",
    "NUM_STREAMS",
    "INFERENCE_NUM_THREADS",
    "INFERENCE_PRECISION_HINT",
    "EXECUTION_MODE_HINT",
    "PERFORMANCE_HINT_NUM_REQUESTS",
    "ENABLE_CPU_PINNING",
    "ENABLE_HYPER_THREADING",
    "SCHEDULING_CORE_TYPE",
    "COMPILATION_NUM_THREADS",
    "CACHE_DIR",
)
# Triton's older OpenVINO backend names -> OpenVINO properties
ALIASES = {"CPU_THROUGHPUT_STREAMS": "NUM_STREAMS", "CPU_THREADS_NUM": "INFERENCE_NUM_THREADS"}
BF16_FLAGS = ("ENFORCE_BF16", "HINT_BF16")


def model_file(model: ModelSpec, version_path: str | Path) -> Path:
    vdir = Path(version_path)
    path = vdir / (model.default_model_filename or IR_FILE)
    if path.exists():
        return path
    explicit = bool(model.config.default_model_filename)
    if not explicit and (vdir / ONNX_FILE).exists():
        return vdir / ONNX_FILE
    raise InvalidArgument(f"model '{model.name}': model file {path} does not exist")


def group_kind(model: ModelSpec, index: int) -> str:
    """The ``instance_group`` kind of instance ``index`` (KIND_AUTO without groups)."""
    start = 0
    for group in model.instances:
        if index < start + group.count:
            return group.kind
        start += group.count
    return "KIND_AUTO"


def _yes(value: str) -> bool:
    return value.strip().upper() in ("YES", "TRUE", "1", "ON")


def compile_properties(model: ModelSpec, supported: set[str]) -> dict[str, str]:
    """OpenVINO compile properties from the model's parameters (see the module docstring)."""
    props: dict[str, str] = {}
    for key, value in model.parameters.items():
        upper = key.strip().upper()
        name = ALIASES.get(upper, upper)
        if upper in BF16_FLAGS:
            if _yes(value):
                props["INFERENCE_PRECISION_HINT"] = "bf16"
        elif name in PROPERTIES or name in supported:
            props[name] = value.strip()
    if "PERFORMANCE_HINT" in props:
        props["PERFORMANCE_HINT"] = props["PERFORMANCE_HINT"].upper()
    if "INFERENCE_PRECISION_HINT" in props:
        props["INFERENCE_PRECISION_HINT"] = props["INFERENCE_PRECISION_HINT"].lower()
    return props


@dataclass
class OvInstance:
    compiled: Any
    request: Any
    outputs: dict[str, Any]  # config output name -> output port
    device: str


class OpenVinoBackend(BackendNode):
    parallel_instance_loading = True

    def load_instance(self, index: int) -> OvInstance:
        model = self.model
        ov = require("openvino", model.name, "openvino", "openvino")
        params = Parameters(model)
        core = ov.Core()
        extension = params.text("CPU_EXTENSION_PATH")
        if extension:
            try:
                core.add_extension(extension)
            except Exception as exc:
                raise InvalidArgument(
                    f"model '{model.name}': OpenVINO cannot add CPU_EXTENSION_PATH {extension}: {exc}"
                ) from None
        device = self._device(core, params, index)
        path = model_file(model, self.version_path)
        try:
            ov_model = core.read_model(str(path))
        except Exception as exc:
            raise InvalidArgument(f"model '{model.name}': OpenVINO cannot read {path}: {exc}") from None
        self._check_names(ov_model)
        self._reshape_model(ov, ov_model, params)
        props = compile_properties(model, _settable(core, device))
        if props.get("INFERENCE_PRECISION_HINT") == "bf16" and device.startswith("CPU"):
            caps = _property(core, "CPU", "OPTIMIZATION_CAPABILITIES") or []
            if "BF16" not in caps:
                raise Unsupported(
                    f"model '{model.name}': bf16 inference precision asked for, but this CPU has no "
                    f"bf16 support (OpenVINO capabilities: {list(caps)})"
                )
        try:
            compiled = core.compile_model(ov_model, device, props)
        except Exception as exc:
            raise InvalidArgument(
                f"model '{model.name}': OpenVINO cannot compile {path.name} for {device} with {props}: {exc}"
            ) from None
        names = [t.name for t in model.outputs] or [o.get_any_name() for o in compiled.outputs]
        outputs = {name: compiled.output(name) for name in names}
        return OvInstance(compiled, compiled.create_infer_request(), outputs, device)

    def _device(self, core: Any, params: Parameters, index: int) -> str:
        model = self.model
        device = (params.text("TARGET_DEVICE") or params.text("DEVICE")).upper()
        if not device:
            device = "GPU" if group_kind(model, index) == "KIND_GPU" else "CPU"
        base = device.split(":")[0].split(".")[0]
        if base in VIRTUAL_DEVICES:
            return device
        available = list(core.available_devices)
        if not any(d == device or d.split(".")[0] == base for d in available):
            raise Unsupported(
                f"model '{model.name}': OpenVINO device '{device}' is not available here "
                f"(available: {available})"
            )
        return device

    def _check_names(self, ov_model: Any) -> None:
        for what, configured, ports in (
            ("input", self.model.inputs, ov_model.inputs),
            ("output", self.model.outputs, ov_model.outputs),
        ):
            known = {n for p in ports for n in p.get_names()}
            unknown = [t.name for t in configured if t.name not in known]
            if unknown:
                raise InvalidArgument(
                    f"model '{self.model.name}': config {what}(s) {unknown} not found in the OpenVINO "
                    f"model, whose {what}s are {sorted(p.get_any_name() for p in ports)}"
                )

    def _reshape_model(self, ov: Any, ov_model: Any, params: Parameters) -> None:
        model = self.model
        shapes: dict[str, Any] = {}
        if params.flag("RESHAPE_IO_LAYERS", False):
            for t in model.inputs:
                shapes[t.name] = ov.PartialShape(list(t.full_shape(model.max_batch_size)))
        elif model.max_batch_size > 0 and not params.flag("SKIP_OV_DYNAMIC_BATCHSIZE", False):
            for port in ov_model.inputs:
                shape = port.get_partial_shape()
                if shape.rank.is_static and len(shape) > 0 and shape[0].is_static:
                    dims = [-1] + [d.get_length() if d.is_static else -1 for d in list(shape)[1:]]
                    shapes[port.get_any_name()] = ov.PartialShape(dims)
        if shapes:
            try:
                ov_model.reshape(shapes)
            except Exception as exc:
                raise InvalidArgument(
                    f"model '{model.name}': OpenVINO cannot reshape the inputs to {shapes} "
                    f"(set SKIP_OV_DYNAMIC_BATCHSIZE to YES to keep the model's batch size): {exc}"
                ) from None

    def execute(self, instance: OvInstance, inputs: TensorMap) -> TensorMap:
        feed = {name: _to_ov(array) for name, array in inputs.items()}
        try:
            result = instance.request.infer(feed)
        except Exception as exc:
            raise InternalError(f"OpenVINO raised {type(exc).__name__}: {exc}") from None
        return {name: _from_ov(result[port]) for name, port in instance.outputs.items()}


def _to_ov(array: np.ndarray) -> np.ndarray:
    if array.dtype == np.object_:  # BYTES -> OpenVINO string tensors take numpy bytes arrays
        return np.array([bytes(v) for v in array.reshape(-1)], dtype=np.bytes_).reshape(array.shape)
    return np.ascontiguousarray(array)


def _from_ov(value: Any) -> np.ndarray:
    out = np.array(value, copy=True)
    if out.dtype.kind in "SU":
        flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in out.reshape(-1)]
        out = np.array(flat, dtype=object).reshape(out.shape)
    return out


def _property(core: Any, device: str, name: str) -> Any:
    try:
        return core.get_property(device, name)
    except Exception:
        return None


def _settable(core: Any, device: str) -> set[str]:
    supported = _property(core, device.split(":")[0].split(".")[0], "SUPPORTED_PROPERTIES") or {}
    return {str(k) for k, mode in dict(supported).items() if str(mode) == "RW"}


# ---------------------------------------------------------------- auto-complete


def import_openvino(model: str, path: Path) -> ModuleType:
    try:
        return importlib.import_module("openvino")
    except Exception as exc:
        raise InvalidArgument(
            f"model '{model}': the config gives no inputs/outputs and auto-complete reads them from "
            f"{path.name} with the 'openvino' package, which cannot be imported ({exc}); install it "
            "with pip install 'flowserve[openvino]' or list inputs and outputs in config.pbtxt"
        ) from None


def openvino_tensors(path: Path, model: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs (full shapes, -1 dynamic) of a model file OpenVINO reads."""
    ov = import_openvino(model, path)
    try:
        ov_model = ov.Core().read_model(str(path))
    except Exception as exc:
        raise InvalidArgument(f"model '{model}': OpenVINO cannot read {path}: {exc}") from None

    def spec(port: Any) -> TensorSpec:
        name = port.get_any_name()
        kind = port.get_element_type().get_type_name()
        datatype = OV_DATATYPES.get(kind)
        if datatype is None:
            raise InvalidArgument(
                f"model '{model}': OpenVINO tensor '{name}' has element type {kind}, "
                "which has no Triton datatype"
            )
        shape = port.get_partial_shape()
        if shape.rank.is_dynamic:
            raise InvalidArgument(
                f"model '{model}': OpenVINO tensor '{name}' has a dynamic rank; list its dims in the config"
            )
        return TensorSpec(name, datatype, tuple(d.get_length() if d.is_static else -1 for d in shape))

    return [spec(p) for p in ov_model.inputs], [spec(p) for p in ov_model.outputs]


def openvino_autocomplete(
    config: ModelConfig, model_dir: Path, version_dirs: list[Path]
) -> Completion | None:
    if len(config.input) > 0 and len(config.output) > 0:
        return None
    model = model_dir.name
    names = [config.default_model_filename] if config.default_model_filename else [IR_FILE, ONNX_FILE]
    path = next((v / n for n in names for v in version_dirs if (v / n).is_file()), None)
    if path is None:
        raise InvalidArgument(
            f"model '{model}': the config gives no inputs/outputs and no version directory holds "
            f"{' or '.join(names)} to read them from"
        )
    inputs, outputs = openvino_tensors(path, model)
    configured = int(config.max_batch_size)
    # with batching asked for, a static first dimension is made dynamic at load (see above)
    tensors = [(t.name, (-1, *t.dims[1:]) if configured > 0 and t.dims else t.dims) for t in inputs + outputs]
    return completion(model, config, inputs, outputs, tensors)
