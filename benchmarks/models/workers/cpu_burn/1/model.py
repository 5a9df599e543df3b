"""Busy for the config's burn_ms milliseconds of this thread's CPU per request, then echoes
INPUT0 (the same model as tests/models/cpu_burn, 2 ms here)."""

import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.burn_s = float(parameters.get("burn_ms", {}).get("string_value", "2")) / 1000.0

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            end = time.thread_time() + self.burn_s
            total = 0
            while time.thread_time() < end:
                total += sum(range(200))
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x)]))
        return responses
