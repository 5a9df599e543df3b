"""Echoes INPUT0 as OUTPUT0 (BF16). As in Triton, a BF16 tensor has no numpy form (as_numpy()
raises): the output is made from the input through DLPack, without a copy."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                output_tensors=[
                    pb_utils.Tensor.from_dlpack("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0"))
                ]
            )
            for r in requests
        ]
