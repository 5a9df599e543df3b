"""Triton's "simple" add/sub model for the Python backend (runs in Triton and in flowserve)."""

import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        """The tensors, when a config (a load API override such as {"max_batch_size": 16}, as
        the official model-control examples send) names none: what config.pbtxt declares."""
        config = auto_complete_model_config.as_dict()
        names = {t["name"] for t in config.get("input", []) + config.get("output", [])}
        for name in ("INPUT0", "INPUT1"):
            if name not in names:
                auto_complete_model_config.add_input({"name": name, "data_type": "TYPE_INT32", "dims": [16]})
        for name in ("OUTPUT0", "OUTPUT1"):
            if name not in names:
                auto_complete_model_config.add_output({"name": name, "data_type": "TYPE_INT32", "dims": [16]})
        return auto_complete_model_config

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.out0_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"]
        )
        self.out1_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT1")["data_type"]
        )

    def execute(self, requests):
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out0 = pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.out0_dtype))
            out1 = pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.out1_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out0, out1]))
        return responses
