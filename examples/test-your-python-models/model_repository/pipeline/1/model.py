"""A BLS model: TEXT -> embedder -> classifier -> (LABEL, SCORE), an error response for empty text."""

from typing import Any, List

import numpy as np
import numpy.typing as npt
import triton_python_backend_utils as pb_utils

LABELS = np.array([b"negative", b"positive", b"neutral"], dtype=object)


def _call(model: str, name: str, array: npt.NDArray[Any], output: str) -> npt.NDArray[Any]:
    request = pb_utils.InferenceRequest(
        model_name=model, inputs=[pb_utils.Tensor(name, array)], requested_output_names=[output]
    )
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
    result: npt.NDArray[Any] = pb_utils.get_output_tensor_by_name(response, output).as_numpy()
    return result


class TritonPythonModel:
    def execute(self, requests: List[pb_utils.InferenceRequest]) -> List[pb_utils.InferenceResponse]:
        responses: List[pb_utils.InferenceResponse] = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            empty = [i for i, t in enumerate(text) if not t]
            if empty:
                error = pb_utils.TritonError(f"input 'TEXT': element {empty[0]} is empty")
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            embedding = _call("embedder", "TEXT", text, "EMBEDDING")
            logits = _call("classifier", "EMBEDDING", embedding, "LOGITS")
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            probs /= probs.sum(axis=1, keepdims=True)
            best = probs.argmax(axis=1)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("LABEL", LABELS[best]),
                pb_utils.Tensor("SCORE", probs.max(axis=1).astype(np.float32)),
            ]))
        return responses
