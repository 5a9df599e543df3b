import json
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def _response(value, size, tag):
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("OUT", np.array([[value]], np.int32)),
            pb_utils.Tensor("SIZE", np.array([[size]], np.int32)),
            pb_utils.Tensor("TAG", np.array([[tag]], np.int32)),
        ]
    )


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        size = len(requests)
        later = []
        for request in requests:
            sender = request.get_response_sender()
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            tag = int(json.loads(request.parameters() or "{}").get("tag", -1))
            if value < 0:
                error = pb_utils.TritonError(f"negative input {value}")
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                continue
            sender.send(_response(value, size, tag))
            later.append((sender, value, size, tag))

        def finish():
            for sender, value, size, tag in later:
                final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                sender.send(_response(10 * value, size, tag), flags=final)

        thread = threading.Thread(target=finish)
        thread.start()
        self.threads.append(thread)
        return None

    def finalize(self):
        for thread in self.threads:
            thread.join()
