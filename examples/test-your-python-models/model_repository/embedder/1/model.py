"""A stand-in embedder: 8 byte-histogram features per text (a real one would run a network)."""

from typing import List

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests: List[pb_utils.InferenceRequest]) -> List[pb_utils.InferenceResponse]:
        responses: List[pb_utils.InferenceResponse] = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            embedding = np.zeros((len(text), 8), dtype=np.float32)
            for row, item in enumerate(text):
                data = np.frombuffer(bytes(item), dtype=np.uint8)
                embedding[row] = np.bincount(data % 8, minlength=8) / max(1, len(data))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("EMBEDDING", embedding)]))
        return responses
