"""OUTPUT = 2 * INPUT for Triton's Python backend, one response per request."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            out = pb_utils.Tensor("OUTPUT", x * 2)
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
