"""A stand-in classifier: a fixed linear layer, 8 features -> 3 logits."""

from typing import List

import numpy as np
import triton_python_backend_utils as pb_utils

WEIGHTS = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(8, 3)


class TritonPythonModel:
    def execute(self, requests: List[pb_utils.InferenceRequest]) -> List[pb_utils.InferenceResponse]:
        responses: List[pb_utils.InferenceResponse] = []
        for request in requests:
            embedding = pb_utils.get_input_tensor_by_name(request, "EMBEDDING").as_numpy()
            logits = (embedding @ WEIGHTS).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LOGITS", logits)]))
        return responses
