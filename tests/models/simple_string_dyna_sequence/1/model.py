"""Triton's "simple_string_dyna_sequence": a running sum, plus the (string) correlation id at END."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _corrid(value):
    text = value.decode() if isinstance(value, bytes) else str(value)
    return int(text) if text.lstrip("-").isdigit() else 0


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x, acc, start, end, ready = (
                pb_utils.get_input_tensor_by_name(request, n).as_numpy().astype(np.int64)
                for n in ("INPUT", "ACC_IN", "START", "END", "READY")
            )
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            ids = np.vectorize(_corrid, otypes=[np.int64])(corrid).reshape(end.shape)
            total = np.where(ready == 1, np.where(start == 1, x, acc + x), acc)
            out = (total + end * ids).astype(np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT", out), pb_utils.Tensor("ACC_OUT", total.astype(np.int32))]
                )
            )
        return responses
