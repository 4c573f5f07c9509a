"""N = number of inputs present; A is variable-length (not ragged)."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            n = np.full((a.shape[0], 1), len(r.inputs()), dtype=np.int32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("N", n)]))
        return out
