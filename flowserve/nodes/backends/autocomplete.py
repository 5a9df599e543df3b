"""Config auto-complete: fill what config.pbtxt leaves out from the model file itself.

Registered into :data:`flowserve.spec.triton.AUTOCOMPLETE` by :mod:`flowserve.nodes.backends`,
so it runs at scan time and graph validation sees the model's real signature. Frameworks are
imported only when a hook has something to complete.

- ONNX Runtime: inputs, outputs, dtypes and dims from the ONNX graph (``onnx`` package), and
  ``max_batch_size`` by Triton's rule: when neither inputs nor outputs are configured and every
  tensor's first dimension is dynamic, the model batches (``max_batch_size`` 4, the default of
  Triton's ``default-max-batch-size``, with ``dynamic_batching {}``).
- Python: ``TritonPythonModel.auto_complete_config(pb_utils.ModelConfig)`` when model.py
  defines it, as Triton calls it before ``initialize``.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from flowserve.core.datatypes import from_config
from flowserve.core.errors import InvalidArgument
from flowserve.spec.model_config import ModelConfig
from flowserve.spec.schema import TensorSpec
from flowserve.spec.triton import DEFAULT_FILENAMES, Completion, config_to_json

DEFAULT_MAX_BATCH_SIZE = 4

# onnx.TensorProto.DataType -> Triton datatype
ONNX_DATATYPES: dict[int, str] = {
    1: "FP32",
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "BYTES",
    9: "BOOL",
    10: "FP16",
    11: "FP64",
    12: "UINT32",
    13: "UINT64",
    16: "BF16",
}


def _first_file(version_dirs: list[Path], filename: str) -> Path | None:
    for vdir in version_dirs:
        path = vdir / filename
        if path.exists():
            return path
    return None


def completion(
    model: str,
    config: ModelConfig,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    batch_dims: list[tuple[str, tuple[int, ...]]] | None = None,
) -> Completion:
    """What a model file's signature adds to ``config``: the inputs and outputs it leaves out
    (without the batch dimension when Triton's batching rule applies) and max_batch_size.
    ``batch_dims`` overrides the shapes the rule looks at (default: the signature's)."""
    complete_all = len(config.input) == 0 and len(config.output) == 0
    tensors = batch_dims if batch_dims is not None else [(t.name, t.dims) for t in inputs + outputs]
    max_batch, strip = batching_rule(model, int(config.max_batch_size), tensors, complete_all)

    def drop(t: TensorSpec) -> TensorSpec:
        return TensorSpec(t.name, t.datatype, t.dims[1:] if strip else t.dims)

    return Completion(
        inputs=[drop(t) for t in inputs] if len(config.input) == 0 else [],
        outputs=[drop(t) for t in outputs] if len(config.output) == 0 else [],
        max_batch_size=max_batch,
        dynamic_batching=max_batch is not None,
    )


def batching_rule(
    model: str, configured_max_batch: int, tensors: list[tuple[str, tuple[int, ...]]], complete_batch: bool
) -> tuple[int | None, bool]:
    """Triton's rule for a model whose full shapes are ``tensors``: returns (max_batch_size to
    set or None, whether the leading dimension is the batch and must be dropped from dims)."""
    batchable = bool(tensors) and all(len(dims) >= 1 and dims[0] == -1 for _, dims in tensors)
    if configured_max_batch > 0:
        for name, dims in tensors:
            if not dims or dims[0] != -1:
                raise InvalidArgument(
                    f"model '{model}': max_batch_size is {configured_max_batch} but the first "
                    f"dimension of tensor '{name}' ({list(dims)}) is not dynamic, so the model "
                    "cannot batch; set max_batch_size: 0"
                )
        return None, True
    if complete_batch and batchable:
        return DEFAULT_MAX_BATCH_SIZE, True
    return None, False


def onnx_signature(path: Path, model: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs of an ONNX file with full shapes (-1 for dynamic dimensions)."""
    try:
        import onnx
    except ImportError as exc:
        raise InvalidArgument(
            f"model '{model}': the config gives no inputs/outputs and auto-complete reads them "
            f"from {path.name} with the 'onnx' package, which cannot be imported ({exc}); install "
            "it with pip install 'flowserve[onnx]' or list inputs and outputs in config.pbtxt"
        ) from None
    target = path / "model.onnx" if path.is_dir() else path
    try:
        proto = onnx.load(str(target), load_external_data=False)
    except Exception as exc:
        raise InvalidArgument(f"model '{model}': cannot read ONNX file {target}: {exc}") from None
    graph = proto.graph
    initializers = {init.name for init in graph.initializer}

    def spec(value_info: Any) -> TensorSpec:
        ttype = value_info.type
        if ttype.WhichOneof("value") != "tensor_type":
            raise InvalidArgument(
                f"model '{model}': ONNX tensor '{value_info.name}' is not a tensor "
                f"({ttype.WhichOneof('value')}); auto-complete cannot describe it"
            )
        elem = int(ttype.tensor_type.elem_type)
        datatype = ONNX_DATATYPES.get(elem)
        if datatype is None:
            raise InvalidArgument(
                f"model '{model}': ONNX tensor '{value_info.name}' has element type {elem}, "
                "which has no Triton datatype"
            )
        if not ttype.tensor_type.HasField("shape"):
            raise InvalidArgument(
                f"model '{model}': ONNX tensor '{value_info.name}' has no static rank; list its "
                "dims in config.pbtxt"
            )
        dims = tuple(
            int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else -1
            for d in ttype.tensor_type.shape.dim
        )
        return TensorSpec(value_info.name, datatype, dims)

    inputs = [spec(v) for v in graph.input if v.name not in initializers]
    outputs = [spec(v) for v in graph.output]
    return inputs, outputs


def onnx_autocomplete(config: ModelConfig, model_dir: Path, version_dirs: list[Path]) -> Completion | None:
    if len(config.input) > 0 and len(config.output) > 0:
        return None
    model = model_dir.name
    filename = config.default_model_filename or DEFAULT_FILENAMES["onnxruntime"]
    path = _first_file(version_dirs, filename)
    if path is None:
        raise InvalidArgument(
            f"model '{model}': the config gives no inputs/outputs and no version directory holds "
            f"{filename} to read them from"
        )
    inputs, outputs = onnx_signature(path, model)
    return completion(model, config, inputs, outputs)


def python_autocomplete(config: ModelConfig, model_dir: Path, version_dirs: list[Path]) -> Completion | None:
    """Call model.py's ``TritonPythonModel.auto_complete_config`` when it defines one.

    The file is imported only when its text mentions ``auto_complete_config``; a model.py that
    fails to import is left for the load to report (with the model's name)."""
    from flowserve.nodes.backends import pb_utils

    model = model_dir.name
    filename = config.default_model_filename or DEFAULT_FILENAMES["python"]
    path = _first_file(version_dirs, filename)
    if path is None or "auto_complete_config" not in path.read_text(errors="replace"):
        return None
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    spec = importlib.util.spec_from_file_location(f"flowserve_autocomplete_{model}", path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:
        return None
    cls = getattr(module, "TritonPythonModel", None)
    hook = getattr(cls, "auto_complete_config", None)
    if hook is None:
        return None
    before = config_to_json(config)
    wrapper = pb_utils.ModelConfig(before)
    try:
        result = hook(wrapper)
    except Exception as exc:
        raise InvalidArgument(
            f"model '{model}': model.py auto_complete_config() raised {type(exc).__name__}: {exc}"
        ) from None
    after = (result if isinstance(result, pb_utils.ModelConfig) else wrapper).as_dict()

    def tensors(key: str) -> list[TensorSpec]:
        out = []
        for item in after.get(key, []):
            out.append(
                TensorSpec(
                    name=str(item["name"]),
                    datatype=from_config(str(item["data_type"])),
                    dims=tuple(int(d) for d in item.get("dims", [])),
                    optional=bool(item.get("optional", False)),
                )
            )
        return out

    max_batch = int(after.get("max_batch_size", 0))
    policy = after.get("model_transaction_policy") or {}
    return Completion(
        inputs=tensors("input"),
        outputs=tensors("output"),
        max_batch_size=max_batch if max_batch != int(config.max_batch_size) else None,
        dynamic_batching="dynamic_batching" in after and "dynamic_batching" not in before,
        decoupled=bool(policy["decoupled"]) if "decoupled" in policy else None,
    )
