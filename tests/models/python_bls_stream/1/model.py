import numpy as np
import triton_python_backend_utils as pb_utils


def summarize(responses):
    total, count = 0, 0
    for response in responses:
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        count += 1
        out = pb_utils.get_output_tensor_by_name(response, "OUT")
        if out is not None:
            total += int(out.as_numpy().sum())
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("SUM", np.array([total], np.int32)),
            pb_utils.Tensor("COUNT", np.array([count], np.int32)),
        ]
    )


class TritonPythonModel:
    async def execute(self, requests):
        out = []
        for request in requests:
            bls = pb_utils.InferenceRequest(
                model_name=b"decoupled_repeat",  # a model name as bytes works
                inputs=[pb_utils.Tensor("IN", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())],
                requested_output_names=["OUT"],
            )
            if request.parameters() != "{}":
                out.append(summarize(await bls.async_exec(decoupled=True)))
            else:
                out.append(summarize(bls.exec(decoupled=True)))
        return out
