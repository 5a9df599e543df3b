"""Running sum per sequence, kept in the implicit state the sequence batcher carries."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            acc = pb_utils.get_input_tensor_by_name(request, "ACC_IN").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            ready = pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            # a null request (READY 0) holds an empty batch slot: its answer is dropped
            total = np.where(ready == 1, np.where(start == 1, x, acc + x), acc).astype(np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT", total),
                        pb_utils.Tensor("ACC_OUT", total),
                        pb_utils.Tensor("CORRID_OUT", corrid.astype(np.uint64)),
                    ]
                )
            )
        return responses
