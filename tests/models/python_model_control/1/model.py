"""Loads (INPUT0 1) or unloads (0) the model `simple`, then answers whether it is ready."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    inline = False  # it waits for the server: never on the event loop

    def execute(self, requests):
        responses = []
        for request in requests:
            load = int(pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0])
            if load:
                pb_utils.load_model("simple")
            else:
                pb_utils.unload_model("simple")
            ready = np.array([int(pb_utils.is_model_ready("simple"))], np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", ready)]))
        return responses
