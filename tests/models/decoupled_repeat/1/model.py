"""A decoupled Triton python model: responses are sent from a thread after execute returns."""

import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            threading.Thread(target=self._respond, args=(values, sender)).start()
        return None

    def _respond(self, values, sender):
        for i, value in enumerate(values):
            if value < 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"negative value at {i}")))
                break
            out = [
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([i], np.uint32)),
            ]
            sender.send(pb_utils.InferenceResponse(output_tensors=out))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
