"""OUTPUT0 = 2 * INPUT0 and the pid of the process that ran it, one response per request."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.pid = os.getpid()

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            pid = np.full((x.shape[0], 1), self.pid, np.int64)
            outputs = [pb_utils.Tensor("OUTPUT0", x * 2), pb_utils.Tensor("PID", pid)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
