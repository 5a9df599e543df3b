"""BLS, asynchronous: OUTPUT0 = sum of "simple"(a, b), OUTPUT1 = sum of "simple"(b, a)."""

import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            first, second = await asyncio.gather(
                pb_utils.InferenceRequest(
                    model_name="simple",
                    requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", b)],
                ).async_exec(),
                pb_utils.InferenceRequest(
                    model_name="simple",
                    requested_output_names=["OUTPUT1"],
                    inputs=[pb_utils.Tensor("INPUT0", b), pb_utils.Tensor("INPUT1", a)],
                ).async_exec(),
            )
            for response in (first, second):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
            out0 = pb_utils.get_output_tensor_by_name(first, "OUTPUT0").as_numpy()
            out1 = pb_utils.get_output_tensor_by_name(second, "OUTPUT1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUTPUT0", out0), pb_utils.Tensor("OUTPUT1", out1)]
                )
            )
        return responses
