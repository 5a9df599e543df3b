"""Triton's python backend, in-process: loads ``<version>/model.py`` and calls its
``TritonPythonModel`` (``initialize(args)``, ``execute(requests)``, ``finalize()``) on the
instance's own thread. Each instance gets its own object, as each Triton instance does."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from flowserve.core.errors import FlowserveError, InvalidArgument
from flowserve.core.node import TensorMap
from flowserve.nodes.backends import pb_utils
from flowserve.nodes.backends.base import BackendNode
from flowserve.spec.triton import config_to_json

sys.modules.setdefault("triton_python_backend_utils", pb_utils)


class PythonModelBackend(BackendNode):
    def load_instance(self, index: int) -> Any:
        path = Path(self.version_path) / (self.model.default_model_filename or "model.py")
        if not path.is_file():
            raise InvalidArgument(f"model '{self.model.name}': {path} does not exist")
        module_name = f"flowserve_model_{self.model.name}_{self.version}_{index}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise InvalidArgument(f"model '{self.model.name}': cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        cls = getattr(module, "TritonPythonModel", None)
        if cls is None:
            raise InvalidArgument(f"model '{self.model.name}': {path} defines no TritonPythonModel")
        obj = cls()
        init = getattr(obj, "initialize", None)
        if init is not None:
            init(
                {
                    "model_config": json.dumps(config_to_json(self.model.config)),
                    "model_instance_kind": "CPU",
                    "model_instance_name": f"{self.model.name}_{index}",
                    "model_instance_device_id": "0",
                    "model_repository": str(Path(self.version_path).parent),
                    "model_version": str(self.version),
                    "model_name": self.model.name,
                }
            )
        return obj

    def execute(self, instance: Any, inputs: TensorMap) -> TensorMap:
        request = pb_utils.InferenceRequest(
            [pb_utils.Tensor(k, v) for k, v in inputs.items()], model_name=self.model.name
        )
        responses = instance.execute([request])
        if not responses or len(responses) != 1:
            raise FlowserveError(
                f"model.py execute() returned {len(responses or [])} responses for 1 request"
            )
        response = responses[0]
        error = response.error()
        if error is not None:
            raise FlowserveError(error.message())
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def unload_instance(self, instance: Any) -> None:
        fin = getattr(instance, "finalize", None)
        if fin is not None:
            fin()
