"""Triton's "simple_string": integers written as strings, added and subtracted."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _ints(tensor):
    return np.vectorize(lambda s: int(s.decode() if isinstance(s, bytes) else s), otypes=[np.int32])(
        tensor.as_numpy()
    )


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = _ints(pb_utils.get_input_tensor_by_name(request, "INPUT0"))
            in1 = _ints(pb_utils.get_input_tensor_by_name(request, "INPUT1"))
            as_bytes = np.vectorize(lambda v: str(v).encode(), otypes=[np.object_])
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", as_bytes(in0 + in1)),
                        pb_utils.Tensor("OUTPUT1", as_bytes(in0 - in1)),
                    ]
                )
            )
        return responses
