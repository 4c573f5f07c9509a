"""The ``postprocess`` model: logits and thresholds to probabilities and verdicts.

Inputs and outputs (full shapes):
    logits         FP32 [N, K]  raw scores (K = 1 for the binary demo classifiers)
    THRESHOLD      FP32 [N, 1]  decision threshold per text, a probability in [0, 1]
    PROBABILITIES  FP32 [N, K]  sigmoid(logits), computed in float64 and rounded to float32
    VERDICTS       BOOL [N, K]  PROBABILITIES >= THRESHOLD

Sigmoid per logit (independent labels) is the output layer the classifiers were trained
with (binary cross-entropy on one logit, see ``orchestrator.tooling.modeling.train``).
Errors (per request, INVALID_ARG): THRESHOLD NaN, infinite, outside [0, 1], or not one per text.
"""

from __future__ import annotations

import triton_python_backend_utils as pb_utils

from orchestrator.runtime.models._triton import error_response
from orchestrator.runtime.scores import probabilities_and_verdicts
from orchestrator.runtime.validation import InputError, check_thresholds


class TritonPythonModel:
    """The postprocess model (see the module docstring)."""

    def execute(self, requests):
        """One response per request: probabilities and verdicts, or an INVALID_ARG error."""
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "logits").as_numpy()
            try:
                thresholds = check_thresholds(
                    pb_utils.get_input_tensor_by_name(request, "THRESHOLD").as_numpy(), logits.shape[0]
                )
            except InputError as exc:
                responses.append(error_response(f"postprocess: {exc}"))
                continue
            probs, verdicts = probabilities_and_verdicts(logits, thresholds)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("PROBABILITIES", probs), pb_utils.Tensor("VERDICTS", verdicts)]
                )
            )
        return responses
