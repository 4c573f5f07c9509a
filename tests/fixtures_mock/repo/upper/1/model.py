"""Upper-cases TEXT. Returns str objects (Triton turns them into bytes for the client)."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            for item in text.flat:
                assert isinstance(item, bytes), type(item)  # Triton hands over bytes
            upper = np.array([[t.decode("utf-8").upper()] for t in text[:, 0]], dtype=np.object_)
            length = np.array([[len(t)] for t in text[:, 0]], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("UPPER", upper), pb_utils.Tensor("LENGTH", length)]
                )
            )
        return responses
