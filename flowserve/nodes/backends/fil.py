"""Tree models with Triton's FIL backend conventions (backend ``fil``).

Config ``parameters`` as Triton's FIL backend reads them:

- ``model_type``: ``xgboost`` (legacy binary, ``xgboost.model``), ``xgboost_json``
  (``xgboost.json``), ``xgboost_ubj`` (``xgboost.ubj``), ``lightgbm`` (``model.txt``),
  ``treelite_checkpoint`` (``checkpoint.tl``), or ``sklearn`` (a pickled scikit-learn forest,
  ``model.pkl``, converted with treelite; a flowserve extension). The file is
  ``default_model_filename`` when the config sets it.
- ``output_class`` (default false): false returns the model's prediction (a regressor's value,
  a binary classifier's probability); true returns the class (``threshold`` on a binary
  model's probability, default 0.5, argmax otherwise) as FP32, or with ``predict_proba`` true
  the probability of every class (``[1-p, p]`` for a binary model).
- ``threads``: CPU threads for treelite's GTIL (default: all).

Inference: cuML's forest inference as ``nvforest`` when it is installed (on a GPU when the
instance has one, else on the CPU); otherwise treelite's GTIL on the CPU, which matches
xgboost, lightgbm and scikit-learn exactly. Input ``input__0`` (FP32 ``[features]``), output
``output__0`` (FP32), the names any config gives.
"""

from __future__ import annotations

import importlib
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flowserve.core.errors import InvalidArgument, Unsupported
from flowserve.core.node import TensorMap
from flowserve.nodes.backends._support import Parameters, Placement, placement, require
from flowserve.nodes.backends.base import BackendNode

MODEL_TYPES: dict[str, str] = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
    "sklearn": "model.pkl",
}


@dataclass
class FilSettings:
    output_class: bool
    predict_proba: bool
    threshold: float
    threads: int


@dataclass
class FilInstance:
    treelite_model: Any
    forest: Any  # an nvforest model, or None for GTIL
    classifier: bool  # nvforest's view of the model
    num_class: int  # columns of GTIL's output: 1 for regression and binary models
    place: Placement


def load_treelite(treelite: Any, model_type: str, path: Path, model: str) -> Any:
    frontend = treelite.frontend
    try:
        if model_type == "xgboost":
            return frontend.load_xgboost_model_legacy_binary(str(path))
        if model_type == "xgboost_json":
            return frontend.load_xgboost_model(str(path), format_choice="json")
        if model_type == "xgboost_ubj":
            return frontend.load_xgboost_model(str(path), format_choice="ubjson")
        if model_type == "lightgbm":
            return frontend.load_lightgbm_model(str(path))
        if model_type == "treelite_checkpoint":
            return treelite.Model.deserialize(str(path))
        with path.open("rb") as f:
            estimator = pickle.load(f)
        return treelite.sklearn.import_model(estimator)
    except Exception as exc:
        raise InvalidArgument(f"model '{model}': cannot load {model_type} model {path}: {exc}") from None


def postprocess(scores: np.ndarray, settings: FilSettings) -> np.ndarray:
    """FIL's outputs from raw predictions ``scores`` of shape (rows, columns)."""
    scores = np.asarray(scores, dtype=np.float32)
    if not settings.output_class:
        return scores
    if scores.shape[1] == 1:
        p = scores[:, 0]
        if settings.predict_proba:
            return np.stack([1.0 - p, p], axis=1).astype(np.float32)
        return (p > settings.threshold).astype(np.float32)[:, np.newaxis]
    if settings.predict_proba:
        return scores
    if scores.shape[1] == 2:
        return (scores[:, 1] > settings.threshold).astype(np.float32)[:, np.newaxis]
    classes: np.ndarray = np.argmax(scores, axis=1).astype(np.float32)
    return classes[:, np.newaxis]


class FilBackend(BackendNode):
    _gtil: Any = None

    def _settings(self, params: Parameters) -> FilSettings:
        return FilSettings(
            output_class=params.flag("output_class", False),
            predict_proba=params.flag("predict_proba", False),
            threshold=params.number("threshold", 0.5),
            threads=params.integer("threads", -1),
        )

    def load_instance(self, index: int) -> FilInstance:
        model = self.model
        params = Parameters(model)
        self.settings = self._settings(params)
        model_type = params.text("model_type", "xgboost")
        if model_type not in MODEL_TYPES:
            raise InvalidArgument(
                f"model '{model.name}': parameter model_type '{model_type}' is not one of "
                f"{sorted(MODEL_TYPES)}"
            )
        filename = model.config.default_model_filename or MODEL_TYPES[model_type]
        path = Path(self.version_path) / filename
        if not path.exists():
            raise InvalidArgument(f"model '{model.name}': model file {path} does not exist")
        treelite = require("treelite", model.name, "fil", "trees")
        self._gtil = require("treelite.gtil", model.name, "fil", "trees")
        tl_model = load_treelite(treelite, model_type, path, model.name)
        place = placement(model, index, "fil")
        probe = self._gtil.predict(tl_model, np.zeros((1, int(tl_model.num_feature)), np.float32))
        num_class = int(np.asarray(probe).reshape(1, -1).shape[1])
        forest, classifier = self._nvforest(tl_model, place)
        if forest is None and place.required:
            raise Unsupported(
                f"model '{model.name}': KIND_GPU needs cuML's forest inference (the nvforest package), "
                "which is not installed; treelite runs on the CPU only"
            )
        return FilInstance(
            tl_model, forest, classifier, num_class, place if forest is not None else Placement("CPU")
        )

    def _nvforest(self, tl_model: Any, place: Placement) -> tuple[Any, bool]:
        try:
            nvforest = importlib.import_module("nvforest")
        except Exception:
            return None, False
        device = "gpu" if place.gpu else "cpu"
        kwargs: dict[str, Any] = {"device": device}
        if place.gpu:
            kwargs["device_id"] = place.device
        try:
            forest = nvforest.load_from_treelite_model(tl_model, **kwargs)
        except Exception as exc:
            raise Unsupported(
                f"model '{self.model.name}': nvforest cannot load the model on {device}: {exc}"
            ) from None
        return forest, hasattr(forest, "predict_proba")

    def scores(self, instance: FilInstance, x: np.ndarray) -> np.ndarray:
        rows = x.shape[0]
        if instance.forest is None:
            out = self._gtil.predict(instance.treelite_model, x, nthread=self.settings.threads)
            return np.asarray(out).reshape(rows, -1)
        if instance.classifier:
            proba = np.asarray(instance.forest.predict_proba(x)).reshape(rows, -1)
            # a binary model's GTIL output is p alone; nvforest's classifier gives [1-p, p]
            return proba[:, 1:] if instance.num_class == 1 and proba.shape[1] == 2 else proba
        return np.asarray(instance.forest.predict(x)).reshape(rows, -1)

    def execute(self, instance: FilInstance, inputs: TensorMap) -> TensorMap:
        names_in = [t.name for t in self.model.inputs]
        names_out = [t.name for t in self.model.outputs]
        if len(names_in) != 1 or not names_out:
            raise InvalidArgument(
                f"model '{self.model.name}': the fil backend takes one input and gives one output "
                f"(config has inputs {names_in}, outputs {names_out})"
            )
        x = np.asarray(inputs[names_in[0]], dtype=np.float32)
        batched = self.model.max_batch_size > 0
        if not batched:
            x = x.reshape(1, -1) if x.ndim == 1 else x
        result = postprocess(self.scores(instance, np.ascontiguousarray(x)), self.settings)
        spec = self.model.outputs[0]
        lead = (result.shape[0],) if batched else ()
        if all(d > 0 for d in spec.dims) and int(np.prod(spec.dims)) == result[0].size:
            result = result.reshape(lead + tuple(spec.dims))
        elif not batched:
            result = result.reshape(-1) if len(spec.dims) == 1 else result
        return {names_out[0]: result}
