"""Sync execute: forwards INPUT0 to the model named by the request parameter "target"
(default add_one) with exec(). Parameter "load": true loads the target first with
pb_utils.load_model. BLS errors are returned as error responses with the BLS text."""
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.init_bls_error = None
        request = pb_utils.InferenceRequest(
            model_name="add_one", inputs=[], requested_output_names=[]
        )
        try:
            request.exec()
        except pb_utils.TritonModelException as exc:
            self.init_bls_error = str(exc)

    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            target = params.get("target", "add_one")
            if params.get("load") and not pb_utils.is_model_ready(target):
                pb_utils.load_model(target)
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            bls = pb_utils.InferenceRequest(
                model_name=target,
                inputs=[pb_utils.Tensor("INPUT0", x.as_numpy())],
                requested_output_names=["OUTPUT0"],
                parameters={"add": 10} if params.get("add10") else None,
            )
            response = bls.exec()
            if response.has_error():
                responses.append(pb_utils.InferenceResponse(error=response.error()))
                continue
            out = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", out.as_numpy())]))
        return responses
