"""Make the small real models that flowserve bundles, reproducibly and without downloads.

    python tests/models/make_models.py            # rewrites them all

Writes into ``model_repository/`` (served by default):

- ``onnx_classifier/1/model.onnx``: FP32 [3, 8, 8] -> softmax over 4 classes (a fixed random
  linear layer), batchable;
- ``onnx_add_sub/1/model.onnx``: Triton's "simple" add/sub in ONNX, with no config.pbtxt at all
  (the config is auto-completed from the model);
- ``torch_add_sub/1/model.pt``: the same add/sub as TorchScript, Triton's INPUT__0 naming;
- ``fil_xgboost/1/xgboost.json``: an XGBoost binary classifier over 6 features;
- ``dali_preprocess/1/model.dali``: a DALI CPU pipeline, UINT8 HWC image -> resized, normalised
  FP32 CHW [3, 8, 8] (the ``image_classifier`` ensemble chains it with ``onnx_classifier`` and
  the python ``top1`` model).

Made by the tests only (not bundled): ``make_tf_savedmodel`` / ``make_tf_graphdef``
(TensorFlow SavedModel and frozen GraphDef) and ``make_openvino_ir`` (OpenVINO IR).

Each ``make_*`` function takes the output path, so tests build variants in temporary folders.
Frameworks are imported inside the functions: only the ones a model needs must be installed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = ROOT / "model_repository"

CLASSES = 4
IMAGE_SIZE = 8
FEATURES = 6


def classifier_weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    w = rng.randn(3 * IMAGE_SIZE * IMAGE_SIZE, CLASSES).astype(np.float32) * 0.1
    b = rng.randn(CLASSES).astype(np.float32) * 0.1
    return w, b


def _save_onnx(model: Any, path: Path) -> None:
    import onnx

    model.ir_version = 9
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def make_onnx_classifier(path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    w, b = classifier_weights()
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, IMAGE_SIZE, IMAGE_SIZE])
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", CLASSES])
    nodes = [
        helper.make_node("Flatten", ["input"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W"], ["logits0"]),
        helper.make_node("Add", ["logits0", "B"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    graph = helper.make_graph(nodes, "classifier", [x], [y], initializer=inits)
    _save_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def make_onnx_add_sub(
    path: Path, dims: tuple[int | str, ...] = ("batch", 16), elem: int | None = None, names: str = "INPUT"
) -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (``names`` picks the prefix)."""
    from onnx import TensorProto, helper

    elem = TensorProto.FLOAT if elem is None else elem
    out = "OUTPUT" if names == "INPUT" else names + "_OUT"
    shape = list(dims)
    ins = [helper.make_tensor_value_info(f"{names}{i}", elem, shape) for i in range(2)]
    outs = [helper.make_tensor_value_info(f"{out}{i}", elem, shape) for i in range(2)]
    nodes = [
        helper.make_node("Add", [f"{names}0", f"{names}1"], [f"{out}0"]),
        helper.make_node("Sub", [f"{names}0", f"{names}1"], [f"{out}1"]),
    ]
    graph = helper.make_graph(nodes, "add_sub", ins, outs)
    _save_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def make_torch_add_sub(path: Path) -> None:
    """TorchScript: forward(x, y) -> (x + y, x - y)."""
    import warnings

    import torch

    class AddSub(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x + y, x - y

    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        torch.jit.script(AddSub()).save(str(path))


def make_torch_export_linear(path: Path) -> None:
    """torch.export program: forward(features) -> {"scores": features @ W + b}, dynamic batch."""
    import torch

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(FEATURES, 3)

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(features))

    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(
        Linear().eval(), (torch.zeros(2, FEATURES),), dynamic_shapes={"features": {0: batch}}
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))


def tree_data(rows: int = 300) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.RandomState(0)
    x = rng.rand(rows, FEATURES).astype(np.float32)
    binary = (x[:, 0] + x[:, 1] > 1.0).astype(np.int32)
    multi = np.minimum((x[:, 2] * 3).astype(np.int32), 2)
    return x, binary, multi


def make_xgboost(path: Path, objective: str = "binary:logistic") -> Any:
    import xgboost

    x, binary, multi = tree_data()
    params: dict[str, Any] = {"objective": objective, "max_depth": 3, "eta": 0.3, "seed": 0, "nthread": 1}
    label = binary
    if objective.startswith("multi:"):
        params["num_class"] = 3
        label = multi
    elif objective.startswith("reg:"):
        label = x[:, 0] * 2.0 + x[:, 3]
    booster = xgboost.train(params, xgboost.DMatrix(x, label=label), num_boost_round=5)
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))
    return booster


def make_lightgbm(path: Path, objective: str = "binary") -> Any:
    import lightgbm

    x, binary, _ = tree_data()
    label = binary if objective == "binary" else np.ascontiguousarray(x[:, 0] * 2.0 + x[:, 3])
    params = {"objective": objective, "num_leaves": 4, "verbose": -1, "seed": 0, "num_threads": 1}
    booster = lightgbm.train(params, lightgbm.Dataset(x, label=label), num_boost_round=5)
    path.parent.mkdir(parents=True, exist_ok=True)
    booster.save_model(str(path))
    return booster


def dali_pipeline(max_batch_size: int = 8) -> Any:
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=max_batch_size, num_threads=1, device_id=None)  # type: ignore[misc]
    def preprocess() -> Any:
        image = fn.external_source(name="IMAGE", dtype=types.UINT8, ndim=3, layout="HWC")
        image = fn.resize(image, size=[IMAGE_SIZE, IMAGE_SIZE])
        return fn.crop_mirror_normalize(
            image, dtype=types.FLOAT, output_layout="CHW", mean=[128.0] * 3, std=[64.0] * 3
        )

    return preprocess()


def make_dali_gpu_resize(path: Path) -> None:
    """A pipeline with a GPU operator (serialising needs no GPU; building one does)."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=2, num_threads=1, device_id=None)  # type: ignore[misc]
    def resize() -> Any:
        image = fn.external_source(name="IMAGE", dtype=types.UINT8, ndim=3)
        return fn.resize(image.gpu(), size=[4, 4])

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(resize().serialize())


def make_dali_preprocess(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(dali_pipeline().serialize())


TF_FEATURES = 4


def tf_weights() -> np.ndarray:
    return np.random.RandomState(3).randn(TF_FEATURES).astype(np.float32)


def _tf_module() -> Any:
    """sum = x + y * w, diff = x - y (FP32 [-1, 4]); strings: length and upper of BYTES [-1]."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    class AddScaled(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(tf_weights())

        @tf.function(input_signature=[tf.TensorSpec([None, TF_FEATURES], tf.float32)] * 2, autograph=False)
        def serve(self, x: Any, y: Any) -> dict[str, Any]:
            return {"sum": tf.identity(x + y * self.w, name="sum"), "diff": tf.identity(x - y, name="diff")}

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
        def strings(self, text: Any) -> dict[str, Any]:
            return {"length": tf.strings.length(text), "upper": tf.strings.upper(text)}

        @tf.function(input_signature=[tf.TensorSpec([None, TF_FEATURES], tf.float32)], autograph=False)
        def double(self, x: Any) -> dict[str, Any]:
            return {"doubled": x * 2.0}

    return tf, AddScaled()


def make_tf_savedmodel(path: Path) -> None:
    """SavedModel folder (``model.savedmodel``) with signatures serving_default (x, y -> sum,
    diff), strings (text -> length, upper) and double (x -> doubled); dynamic batch."""
    tf, module = _tf_module()
    path.parent.mkdir(parents=True, exist_ok=True)
    signatures = {"serving_default": module.serve, "strings": module.strings, "double": module.double}
    tf.saved_model.save(module, str(path), signatures=signatures)


def make_tf_graphdef(path: Path) -> None:
    """Frozen GraphDef (``model.graphdef``) of serving_default: placeholders x, y; tensors sum, diff."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    _, module = _tf_module()
    frozen = convert_variables_to_constants_v2(module.serve.get_concrete_function())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(frozen.graph.as_graph_def().SerializeToString())


OV_FEATURES = 4
OV_CLASSES = 3


def openvino_weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(4)
    return rng.randn(OV_FEATURES, OV_CLASSES).astype(np.float32), rng.randn(OV_CLASSES).astype(np.float32)


def make_openvino_ir(path: Path, batch: int = -1) -> None:
    """OpenVINO IR (``model.xml`` + ``model.bin``): scores = relu(features @ W + b), FP32
    [batch, 4] -> [batch, 3] (``batch`` -1: dynamic)."""
    import openvino as ov
    from openvino import opset13 as ops

    w, b = openvino_weights()
    x = ops.parameter([batch, OV_FEATURES], np.float32, name="features")
    y = ops.relu(ops.add(ops.matmul(x, ops.constant(w), False, False), ops.constant(b)))
    y.output(0).get_tensor().set_names({"scores"})
    path.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov.Model([y], [x], "linear_relu"), str(path), compress_to_fp16=False)


def main() -> int:
    make_onnx_classifier(REPOSITORY / "onnx_classifier" / "1" / "model.onnx")
    make_onnx_add_sub(REPOSITORY / "onnx_add_sub" / "1" / "model.onnx")
    make_torch_add_sub(REPOSITORY / "torch_add_sub" / "1" / "model.pt")
    make_xgboost(REPOSITORY / "fil_xgboost" / "1" / "xgboost.json")
    make_dali_preprocess(REPOSITORY / "dali_preprocess" / "1" / "model.dali")
    print(f"models written under {REPOSITORY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
