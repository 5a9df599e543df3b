"""Returns FP64 where FP32 is declared."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            out.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", x.astype("float64"))])
            )
        return out
