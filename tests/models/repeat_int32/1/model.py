"""Triton's repeat backend as a decoupled Python model."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
            sender = request.get_response_sender()
            # WAIT is how long the repeat backend holds the request before releasing it:
            # nothing a client sees, so it is read and not slept on here
            del wait
            threading.Thread(target=self._respond, args=(values, delays, sender)).start()
        return None

    def _respond(self, values, delays, sender):
        for i, value in enumerate(values):
            if i < len(delays):
                time.sleep(float(delays[i]) / 1000.0)
            out = [
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([i], np.uint32)),
            ]
            sender.send(pb_utils.InferenceResponse(output_tensors=out))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
