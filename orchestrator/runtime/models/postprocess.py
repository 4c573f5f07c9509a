"""The ``postprocess`` model: logits and thresholds to probabilities and verdicts.

Inputs and outputs (full shapes; K = labels of the classifier's head, C = 1 for a binary
head, K otherwise):
    logits         FP32 [N, K]       the classifier's raw scores
    THRESHOLD      FP32 [N, 1]       decision threshold per text, a probability in [0, 1];
                   or [N, C]         one per label (multiclass and multilabel heads)
    PROBABILITIES  FP32 [N, C]       ``heads.Head.probabilities``: sigmoid (1 logit), softmax's
                                     positive column (2 logits), softmax (multiclass) or
                                     sigmoid per label (multilabel); float64, rounded to float32
    VERDICTS       BOOL [N, C]       ``heads.Head.verdicts``

Config parameter ``head``: the classifier's ``head.json`` document (written by
``orchestrator export``); without it the legacy head: one logit, sigmoid (the demo
classifiers were trained with binary cross-entropy on one logit). The config's
``label_filename`` on ``PROBABILITIES`` gives clients Triton's classification extension.

Errors (per request, INVALID_ARG): logits with another number of columns than the head,
THRESHOLD NaN, infinite, outside [0, 1], or of another shape. A head that cannot be served
fails the load (``ValueError``).
"""

from __future__ import annotations

from typing import Any, Dict, List

import triton_python_backend_utils as pb_utils

from orchestrator.runtime.models._triton import error_response, model_config
from orchestrator.runtime.request import InputError, check_thresholds, config_parameters
from orchestrator.runtime.routing.heads import HeadError, head_of_parameters


class TritonPythonModel:
    """The postprocess model (see the module docstring)."""

    def initialize(self, args: Dict[str, str]) -> None:
        """Read the head from the config parameter ``head`` (ValueError: not a valid head)."""
        try:
            self.head = head_of_parameters(config_parameters(model_config(args)))
        except HeadError as exc:
            raise ValueError(f"postprocess: {exc}") from None

    def execute(self, requests: List[Any]) -> List[Any]:
        """One response per request: probabilities and verdicts, or an INVALID_ARG error."""
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "logits").as_numpy()
            try:
                if logits.ndim != 2 or logits.shape[1] != self.head.num_logits:
                    raise InputError(
                        f"logits: expected shape [N, {self.head.num_logits}] for a {self.head.describe()} head, "
                        f"got {list(logits.shape)}"
                    )
                thresholds = check_thresholds(
                    pb_utils.get_input_tensor_by_name(request, "THRESHOLD").as_numpy(), logits.shape[0],
                    columns=self.head.columns,
                )
            except InputError as exc:
                responses.append(error_response(f"postprocess: {exc}"))
                continue
            probs = self.head.probabilities(logits)
            verdicts = self.head.verdicts(probs, thresholds)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("PROBABILITIES", probs.astype("float32")),
                        pb_utils.Tensor("VERDICTS", verdicts),
                    ]
                )
            )
        return responses
