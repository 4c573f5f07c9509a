"""Answers with the interpreter that runs it: VERSION = sys.version, DETAILS = JSON
{executable, prefix, numpy, probe}, Y = X * 3. Under the test's packed env it imports
`envprobe` (a package only that env has: probe = envprobe.describe(), Y from
envprobe.scale); under the server's own Python, where `envprobe` is absent, probe is null."""

import json
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

try:
    import envprobe
except ImportError:  # the same model directory served without the env (default config)
    envprobe = None


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            n = x.shape[0]
            details = json.dumps(
                {
                    "executable": sys.executable,
                    "prefix": sys.prefix,
                    "numpy": np.__version__,
                    "probe": envprobe.describe() if envprobe else None,
                }
            )
            y = envprobe.scale(x) if envprobe else (x * 3).astype(np.float32)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("Y", y),
                        pb_utils.Tensor("VERSION", np.array([[sys.version.encode()]] * n, dtype=np.object_)),
                        pb_utils.Tensor("DETAILS", np.array([[details.encode()]] * n, dtype=np.object_)),
                    ]
                )
            )
        return responses
