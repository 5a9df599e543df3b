"""Echo plus an execution counter (to prove cache hits skip execution)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.count = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            self.count += 1
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("COUNT", np.array([self.count], np.int64))]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
