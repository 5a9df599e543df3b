"""The MLP's model.onnx run by onnxruntime inside Triton's Python backend: a dynamic batch's
requests are concatenated, run once, and split back (what a user of this Triton would write)."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def execute(self, requests):
        arrays = [pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy() for r in requests]
        merged = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        (out,) = self.session.run(["OUTPUT"], {"INPUT": merged})
        bounds = np.cumsum([a.shape[0] for a in arrays])[:-1]
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", part)])
            for part in np.split(out, bounds)
        ]
