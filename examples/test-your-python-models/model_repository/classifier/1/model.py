"""A stand-in classifier: a fixed linear layer, 8 features -> 3 logits."""

import numpy as np
import triton_python_backend_utils as pb_utils

WEIGHTS = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(8, 3)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            embedding = pb_utils.get_input_tensor_by_name(request, "EMBEDDING").as_numpy()
            logits = (embedding @ WEIGHTS).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LOGITS", logits)]))
        return responses
