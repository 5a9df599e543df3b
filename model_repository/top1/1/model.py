"""Top-1 of a batch of class probabilities (a Triton python model: runs in Triton unchanged)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            probs = pb_utils.get_input_tensor_by_name(request, "probs").as_numpy()
            label = np.argmax(probs, axis=-1).astype(np.int32)[..., np.newaxis]
            score = np.take_along_axis(probs, label.astype(np.int64), axis=-1).astype(np.float32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("label", label), pb_utils.Tensor("score", score)]
                )
            )
        return responses
