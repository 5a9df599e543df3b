"""TensorFlow backend: ``tensorflow_savedmodel`` (``model.savedmodel/``, a SavedModel folder)
and ``tensorflow_graphdef`` (``model.graphdef``, a frozen GraphDef), as Triton serves them.

- SavedModel: the serving signature named by the config parameter ``TF_SIGNATURE_DEF``
  (default ``serving_default``) of the meta graph tagged ``TF_GRAPH_TAG`` (default ``serve``).
  Input and output names are the signature's input and output *keys* (Triton's mapping), so
  a config may list any subset of the outputs. Auto-complete fills inputs, outputs, dtypes and
  dims from that signature, and ``max_batch_size`` by Triton's rule (every first dimension
  dynamic -> 4 with ``dynamic_batching {}``).
- GraphDef: inputs and outputs must be listed in the config (Triton cannot auto-complete them
  either); their names are the graph's tensor names (``x`` or ``x:0``).

One loaded model per instance; on the CPU with ``tensorflow-cpu`` (CI), on GPU ``N`` when the
instance is placed there and this TensorFlow sees GPUs. TensorFlow is imported when the first
model loads (``TF_CPP_MIN_LOG_LEVEL`` defaults to 2 to keep its C++ start-up logs quiet).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from flowserve.core.errors import InternalError, InvalidArgument, Unsupported
from flowserve.core.node import TensorMap
from flowserve.nodes.backends._support import Parameters, Placement, placement, require
from flowserve.nodes.backends.autocomplete import completion
from flowserve.nodes.backends.base import BackendNode
from flowserve.spec.model_config import ModelConfig
from flowserve.spec.schema import ModelSpec, TensorSpec
from flowserve.spec.triton import DEFAULT_FILENAMES, PLATFORM_FILENAMES, Completion

SIGNATURE_PARAM = "TF_SIGNATURE_DEF"
TAG_PARAM = "TF_GRAPH_TAG"
DEFAULT_SIGNATURE = "serving_default"
DEFAULT_TAG = "serve"
SAVEDMODEL = DEFAULT_FILENAMES["tensorflow"]
GRAPHDEF = PLATFORM_FILENAMES["tensorflow_graphdef"]

# tensorflow.DataType enum values -> Triton datatypes
TF_DATATYPES: dict[int, str] = {
    1: "FP32",
    2: "FP64",
    3: "INT32",
    4: "UINT8",
    5: "INT16",
    6: "INT8",
    7: "BYTES",
    9: "INT64",
    10: "BOOL",
    14: "BF16",
    17: "UINT16",
    19: "FP16",
    22: "UINT32",
    23: "UINT64",
}


def import_tensorflow(model: str) -> ModuleType:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return require("tensorflow", model, "tensorflow", "tensorflow")


def model_path(model: ModelSpec, version_path: str | Path) -> Path:
    """The SavedModel folder or GraphDef file of a version directory: ``default_model_filename``
    when it exists, else whichever of ``model.savedmodel`` / ``model.graphdef`` does."""
    vdir = Path(version_path)
    named = vdir / (model.default_model_filename or SAVEDMODEL)
    if named.exists():
        return named
    if not model.config.default_model_filename:
        for candidate in (vdir / SAVEDMODEL, vdir / GRAPHDEF):
            if candidate.exists():
                return candidate
    raise InvalidArgument(f"model '{model.name}': model file {named} does not exist")


@dataclass
class TfInstance:
    run: Callable[[TensorMap], dict[str, Any]]
    device: str
    keep: Any = field(default=None, repr=False)  # the loaded object the functions belong to


class TensorFlowBackend(BackendNode):
    _tf: Any = None

    def load_instance(self, index: int) -> TfInstance:
        model = self.model
        tf = import_tensorflow(model.name)
        self._tf = tf
        place = placement(model, index, "tensorflow")
        if place.gpu and not tf.config.list_physical_devices("GPU"):
            if place.required:
                raise Unsupported(
                    f"model '{model.name}': KIND_GPU asked for, but this TensorFlow sees no GPU "
                    f"(tensorflow {tf.__version__}; tensorflow-cpu has none)"
                )
            place = Placement("CPU")
        device = f"/GPU:{place.device}" if place.gpu else "/CPU:0"
        path = model_path(model, self.version_path)
        with tf.device(device):
            if path.is_dir():
                return self._load_savedmodel(tf, path, device)
            return self._load_graphdef(tf, path, device)

    def _load_savedmodel(self, tf: Any, path: Path, device: str) -> TfInstance:
        model = self.model
        params = Parameters(model)
        signature = params.text(SIGNATURE_PARAM, DEFAULT_SIGNATURE)
        tag = params.text(TAG_PARAM, DEFAULT_TAG)
        try:
            loaded = tf.saved_model.load(str(path), tags=[tag] if tag else None)
        except Exception as exc:
            raise InvalidArgument(
                f"model '{model.name}': tensorflow cannot load SavedModel {path} (tag '{tag}'): {exc}"
            ) from None
        signatures = dict(loaded.signatures)
        if signature not in signatures:
            raise InvalidArgument(
                f"model '{model.name}': SavedModel {path} has no signature '{signature}' "
                f"({SIGNATURE_PARAM}); it has {sorted(signatures)}"
            )
        fn = signatures[signature]
        specs: dict[str, Any] = dict(fn.structured_input_signature[1])
        outputs = fn.structured_outputs
        out_names = list(outputs) if isinstance(outputs, dict) else []
        self._check_names("input", [t.name for t in model.inputs], list(specs), signature)
        self._check_names("output", [t.name for t in model.outputs], out_names, signature)

        def run(inputs: TensorMap) -> dict[str, Any]:
            missing = [n for n in specs if n not in inputs]
            if missing:
                raise InvalidArgument(f"signature '{signature}' needs inputs {missing}")
            feeds = {n: tf.convert_to_tensor(inputs[n], dtype=specs[n].dtype) for n in specs}
            result: dict[str, Any] = fn(**feeds)
            return result

        return TfInstance(run, device, loaded)

    def _load_graphdef(self, tf: Any, path: Path, device: str) -> TfInstance:
        model = self.model
        if not model.inputs or not model.outputs:
            raise InvalidArgument(
                f"model '{model.name}': a GraphDef model needs its inputs and outputs listed in the "
                "config (names of the graph's tensors; GraphDef cannot be auto-completed)"
            )
        graph_def = tf.compat.v1.GraphDef()
        try:
            graph_def.ParseFromString(path.read_bytes())
            wrapped = tf.compat.v1.wrap_function(
                lambda: tf.compat.v1.import_graph_def(graph_def, name=""), []
            )
        except Exception as exc:
            raise InvalidArgument(
                f"model '{model.name}': tensorflow cannot load GraphDef {path}: {exc}"
            ) from None
        graph = wrapped.graph
        out_names = [t.name for t in model.outputs]
        fetches = [self._tensor(graph, name, "output") for name in out_names]
        feeds = {t.name: self._tensor(graph, t.name, "input") for t in model.inputs}
        pruned: dict[tuple[str, ...], Any] = {}

        def run(inputs: TensorMap) -> dict[str, Any]:
            names = tuple(n for n in feeds if n in inputs)
            fn = pruned.get(names)
            if fn is None:
                fn = pruned[names] = wrapped.prune(feeds=[feeds[n] for n in names], fetches=fetches)
            args = [tf.convert_to_tensor(inputs[n], dtype=feeds[n].dtype) for n in names]
            return dict(zip(out_names, fn(*args), strict=True))

        return TfInstance(run, device, wrapped)

    def _tensor(self, graph: Any, name: str, what: str) -> Any:
        target = name if ":" in name else f"{name}:0"
        try:
            return graph.as_graph_element(target)
        except (KeyError, ValueError) as exc:
            raise InvalidArgument(
                f"model '{self.model.name}': config {what} '{name}' is not a tensor of the GraphDef ({exc})"
            ) from None

    def _check_names(self, what: str, configured: list[str], actual: list[str], signature: str) -> None:
        unknown = [n for n in configured if n not in actual]
        if unknown:
            raise InvalidArgument(
                f"model '{self.model.name}': config {what}(s) {unknown} are not {what} keys of "
                f"signature '{signature}', whose {what}s are {sorted(actual)}"
            )

    def execute(self, instance: TfInstance, inputs: TensorMap) -> TensorMap:
        tf = self._tf
        try:
            with tf.device(instance.device):
                results = instance.run(inputs)
        except InvalidArgument:
            raise
        except Exception as exc:
            raise InternalError(f"tensorflow raised {type(exc).__name__}: {exc}") from None
        names = [t.name for t in self.model.outputs] or list(results)
        return {name: _to_numpy(results[name]) for name in names}


def _to_numpy(value: Any) -> np.ndarray:
    out = value.numpy() if hasattr(value, "numpy") else value
    return np.asarray(out)


# ---------------------------------------------------------------- auto-complete


def signature_tensors(
    path: Path, model: str, signature: str, tag: str
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs (full shapes, -1 dynamic) of a SavedModel's signature, read from
    ``saved_model.pb`` (the signature keys are the names)."""
    import_tensorflow(model)
    saved_model_pb2: Any = importlib.import_module("tensorflow.core.protobuf.saved_model_pb2")

    try:
        saved = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    except Exception as exc:
        raise InvalidArgument(f"model '{model}': cannot read {path / 'saved_model.pb'}: {exc}") from None
    graphs = [g for g in saved.meta_graphs if not tag or tag in g.meta_info_def.tags]
    if not graphs:
        tags = [list(g.meta_info_def.tags) for g in saved.meta_graphs]
        raise InvalidArgument(
            f"model '{model}': SavedModel {path} has no meta graph tagged '{tag}' (tags: {tags})"
        )
    defs = graphs[0].signature_def
    if signature not in defs:
        raise InvalidArgument(
            f"model '{model}': SavedModel {path} has no signature '{signature}' ({SIGNATURE_PARAM}); "
            f"it has {sorted(k for k in defs if not k.startswith('__'))}"
        )
    sig = defs[signature]

    def spec(key: str, info: Any) -> TensorSpec:
        datatype = TF_DATATYPES.get(int(info.dtype))
        if datatype is None:
            raise InvalidArgument(
                f"model '{model}': signature tensor '{key}' has TensorFlow dtype {info.dtype}, "
                "which has no Triton datatype"
            )
        if info.tensor_shape.unknown_rank:
            raise InvalidArgument(
                f"model '{model}': signature tensor '{key}' has no static rank; list its dims in the config"
            )
        return TensorSpec(
            key, datatype, tuple(int(d.size) if d.size >= 0 else -1 for d in info.tensor_shape.dim)
        )

    inputs = [spec(k, sig.inputs[k]) for k in sorted(sig.inputs)]
    outputs = [spec(k, sig.outputs[k]) for k in sorted(sig.outputs)]
    return inputs, outputs


def savedmodel_autocomplete(
    config: ModelConfig, model_dir: Path, version_dirs: list[Path]
) -> Completion | None:
    """Fill inputs/outputs/max_batch_size from the SavedModel signature (GraphDef: nothing)."""
    if len(config.input) > 0 and len(config.output) > 0:
        return None
    if config.platform == "tensorflow_graphdef":
        return None
    model = model_dir.name
    filename = config.default_model_filename or SAVEDMODEL
    path = next((v / filename for v in version_dirs if (v / filename).is_dir()), None)
    if path is None:
        return None  # a GraphDef or a missing file: the load says what is wrong
    params = {k: v.string_value for k, v in config.parameters.items()}
    lowered = {k.upper(): v.strip() for k, v in params.items()}
    signature = lowered.get(SIGNATURE_PARAM) or DEFAULT_SIGNATURE
    tag = lowered.get(TAG_PARAM, DEFAULT_TAG)
    inputs, outputs = signature_tensors(path, model, signature, tag)
    return completion(model, config, inputs, outputs)
