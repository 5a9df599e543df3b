"""Running sums kept per batch slot (the request's position in ``requests``), not per
sequence: right only if every request of a sequence runs in the same slot."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = [0, 0, 0, 0]

    def execute(self, requests):
        readies = [int(pb_utils.get_input_tensor_by_name(r, "READY").as_numpy()[0, 0]) for r in requests]
        seen = np.array([[*readies, *[-1] * (4 - len(readies))]], np.int32)
        responses = []
        for slot, request in enumerate(requests):
            if readies[slot]:
                x = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().sum())
                start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy()[0, 0])
                self.sums[slot] = x if start else self.sums[slot] + x
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT", np.array([[self.sums[slot]]], np.int32)),
                        pb_utils.Tensor("SLOT", np.array([[slot]], np.int32)),
                        pb_utils.Tensor("READIES", seen),
                    ]
                )
            )
        return responses
