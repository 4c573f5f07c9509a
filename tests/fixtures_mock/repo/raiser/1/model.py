"""Misbehaves according to the request parameter "mode" of the first request."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _fail(message):
    raise ValueError(message)


class TritonPythonModel:
    def execute(self, requests):
        mode = json.loads(requests[0].parameters()).get("mode", "raise")
        x = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        ok = [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a)]) for a in x]
        if mode == "raise":
            _fail("boom: the model blew up")
        if mode == "short":
            return ok[:-1]
        if mode == "tuple":
            return tuple(ok)
        if mode == "error_response":
            return [
                pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("bad value", pb_utils.TritonError.INVALID_ARG)
                )
                for _ in requests
            ]
        if mode == "fp64":
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a.astype(np.float64))]) for a in x]
        if mode == "flat":
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a.reshape(-1))]) for a in x]
        if mode == "extra":
            return [
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", a), pb_utils.Tensor("OUTPUT1", a)])
                for a in x
            ]
        if mode == "unicode":
            pb_utils.Tensor("OUTPUT0", np.array(["text"]))
        if mode == "sender":
            for request, response in zip(requests, ok):
                request.get_response_sender().send(
                    response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
            return None
        if mode == "none":
            return None
        return ok
