"""Triton's "simple_dyna_sequence": OUTPUT = READY * (INPUT + START + END * CORRID)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x, start, end, ready, corrid = (
                pb_utils.get_input_tensor_by_name(request, n).as_numpy().astype(np.int64)
                for n in ("INPUT", "START", "END", "READY", "CORRID")
            )
            out = (ready * (x + start + end * corrid)).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
