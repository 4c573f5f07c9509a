"""async execute: calls add_one and upper concurrently with async_exec + asyncio.gather."""
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request):
        x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
        text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
        add = pb_utils.InferenceRequest(
            model_name="add_one",
            inputs=[pb_utils.Tensor("INPUT0", x)],
            requested_output_names=["OUTPUT0"],
        )
        up = pb_utils.InferenceRequest(
            model_name="upper",
            inputs=[pb_utils.Tensor("TEXT", text)],
            requested_output_names=["UPPER"],
        )
        add_response, up_response = await asyncio.gather(add.async_exec(), up.async_exec())
        for response in (add_response, up_response):
            if response.has_error():
                return pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(response.error().message())
                )
        total = pb_utils.get_output_tensor_by_name(add_response, "OUTPUT0").as_numpy()
        upper = pb_utils.get_output_tensor_by_name(up_response, "UPPER").as_numpy()
        return pb_utils.InferenceResponse(
            [pb_utils.Tensor("SUM", total), pb_utils.Tensor("UPPER", upper)]
        )
